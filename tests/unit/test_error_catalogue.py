"""The error catalogue: every LLMServeError subclass has its own kebab-case code and a documented exit code."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from llmserve.cli.app import app
from llmserve.errors import ExitCode, LLMServeError

REPO = Path(__file__).resolve().parents[2]
KEBAB = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def _error_modules() -> list[str]:
    """Every llmserve module that defines a class whose base is named *Error (found without importing)."""
    found = []
    for path in sorted((REPO / "llmserve").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bases = [b for node in tree.body if isinstance(node, ast.ClassDef) for b in node.bases]
        if any((b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")).endswith("Error") for b in bases):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found.append(module.removesuffix(".__init__"))
    return found


def _all_errors() -> list[type[LLMServeError]]:
    for module in _error_modules():
        importlib.import_module(module)
    out, todo = [], [LLMServeError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


ERRORS = _all_errors()
EXIT_CODES = {name: value for name, value in vars(ExitCode).items() if not name.startswith("_")}


def _readme_exit_codes() -> dict[int, str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| (.+?) \|$", section, re.M)}


def test_the_walk_reaches_every_error_module():
    assert len(ERRORS) > 20
    modules = {cls.__module__ for cls in ERRORS}
    assert {"llmserve.errors", "llmserve.deploy.errors", "llmserve.serve.errors", "llmserve.compat.errors"} <= modules


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_each_error_declares_its_own_kebab_case_code(cls):
    assert "code" in vars(cls), f"{cls.__name__} inherits its code from {cls.__mro__[1].__name__}"
    assert KEBAB.fullmatch(cls.code), cls.code


def test_codes_are_unique():
    by_code: dict[str, list[str]] = {}
    for cls in ERRORS:
        by_code.setdefault(cls.code, []).append(f"{cls.__module__}.{cls.__name__}")
    assert {c: names for c, names in by_code.items() if len(names) > 1} == {}


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_each_exit_code_is_an_exit_code(cls):
    assert cls.exit_code in EXIT_CODES.values()


def test_exit_codes_are_distinct():
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)


def test_every_exit_code_is_documented_in_the_readme():
    documented = _readme_exit_codes()
    assert sorted(documented) == sorted(EXIT_CODES.values())
    assert all(meaning.strip() for meaning in documented.values())


def test_every_exit_code_is_in_the_cli_help():
    help_text = app.info.help or ""
    for value in EXIT_CODES.values():
        if value != ExitCode.OK:
            assert re.search(rf"\b{value} [a-z]", help_text), f"exit code {value} missing from `llmserve --help`"


def test_hints_are_one_line_when_set():
    for cls in ERRORS:
        if cls.default_hint is not None:
            assert cls.default_hint.strip() and "\n" not in cls.default_hint, cls.__name__
