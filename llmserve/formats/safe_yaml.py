"""YAML that cannot be used to take the process down: no anchors or aliases, bounded size and depth.

Why no aliases at all: PyYAML composes an alias as a shared node, and every consumer that walks the
tree (ours, pydantic, json.dumps) expands it again, so a few hundred bytes of nested aliases
("billion laughs") become gigabytes and minutes of work. No file llmserve reads needs them.
Why a depth limit: the composer recurses once per nesting level, so deep nesting ends in a
RecursionError instead of a clear message.

Every YAML file llmserve reads goes through `load_yaml` (plain values) or `compose_yaml` (nodes,
for callers that track line numbers).
"""

from __future__ import annotations

from typing import Any

import yaml

from llmserve.errors import InvalidInputError

MAX_YAML_BYTES = 4 << 20
MAX_YAML_DEPTH = 64


class _Refused(Exception):
    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing anchors, aliases and deep nesting while it composes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"YAML alias '*{event.anchor}' refused (aliases can expand without bound)", line)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refused(f"YAML anchor '&{anchor}' refused (anchors and aliases are not supported)", line)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_YAML_DEPTH} levels refused", line)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_size(text: str | bytes, source: str, error: type[InvalidInputError], max_bytes: int) -> None:
    if len(text) > max_bytes:
        raise error(
            f"{source}: {len(text)} bytes of YAML, over the {max_bytes}-byte limit",
            hint="Check that this is the right file; llmserve's YAML files are small.",
        )


def compose_yaml(
    text: str | bytes,
    source: str,
    *,
    error: type[InvalidInputError] = InvalidInputError,
    max_bytes: int = MAX_YAML_BYTES,
) -> yaml.Node | None:
    """Parse one YAML document into nodes; raise `error` (one line, with the file line) when refused."""
    _check_size(text, source, error, max_bytes)
    loader = _BoundedLoader(text)  # type: ignore[arg-type]
    try:
        return loader.get_single_node()
    except _Refused as exc:
        where = f"{source}:{exc.line}" if exc.line else source
        raise error(f"{where}: {exc}", hint="Write the values out in full, then run the command again.") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}" if mark else source
        raise error(f"{where}: not valid YAML ({exc.problem})") from exc
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    finally:
        loader.dispose()


def load_yaml(
    text: str | bytes,
    source: str,
    *,
    error: type[InvalidInputError] = InvalidInputError,
    max_bytes: int = MAX_YAML_BYTES,
) -> Any:
    """Drop-in for `yaml.safe_load(text)` that refuses anchors, aliases, oversized and deeply nested input."""
    node = compose_yaml(text, source, error=error, max_bytes=max_bytes)
    if node is None:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    finally:
        loader.dispose()


class _NoAliasDumper(yaml.SafeDumper):
    # Without this PyYAML writes an anchor for any object that appears twice, which load_yaml refuses.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any, **options: Any) -> str:
    """`yaml.safe_dump` that never writes anchors or aliases, so its output always reads back."""
    return yaml.dump(data, Dumper=_NoAliasDumper, **options)
