"""YAML loading that remembers where each value came from, so errors can name the file line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from llmserve.errors import ManifestError
from llmserve.formats.safe_yaml import compose_yaml


class _Located:
    """Line numbers (1-based) of mapping keys and sequence items, keyed by their path."""

    def __init__(self) -> None:
        self.lines: dict[tuple, int] = {}

    def line_of(self, loc: tuple) -> int | None:
        # Walk up until a known prefix: pydantic may point inside a value we did not record.
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), None)


def _walk(node: yaml.Node, path: tuple, located: _Located, source: str) -> Any:
    located.lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ManifestError(f"{source}:{key_node.start_mark.line + 1}: mapping keys must be plain strings")
            key = key_node.value
            if key == "<<":
                raise ManifestError(f"{source}:{key_node.start_mark.line + 1}: YAML merge keys are not supported")
            if key in out:
                raise ManifestError(
                    f"{source}:{key_node.start_mark.line + 1}: duplicate key '{key}' "
                    f"(first defined on line {located.lines[(*path, key)]})"
                )
            out[key] = _walk(value_node, (*path, key), located, source)
            # Errors about a key point at the key's line, not at its value's.
            located.lines[(*path, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), located, source) for i, item in enumerate(node.value)]
    # Scalars: let PyYAML's safe resolver decide the type (int, float, bool, null, str).
    assert isinstance(node, yaml.ScalarNode)
    return _construct_scalar(node)


def _construct_scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def load_yaml_located(text: str, source: str) -> tuple[Any, _Located]:
    """Parse one YAML document with the bounded safe loader, keeping line numbers; refuse duplicate keys."""
    located = _Located()
    node = compose_yaml(text, source, error=ManifestError)
    if node is None:
        return None, located
    return _walk(node, (), located, source), located


def read_yaml_located(path: Path) -> tuple[Any, _Located]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(f"{path}: file not found", hint="Create it; `llmserve schema` shows the fields.") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text") from exc
    return load_yaml_located(text, str(path))
