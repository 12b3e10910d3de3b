"""Engine arguments that make vLLM import or run code named by the package, not by the operator.

A package's `engine:` section is passed to vLLM verbatim. Most arguments tune the engine; the ones
listed here load Python code (the model folder's own modeling files, a class by dotted name, a
plugin file, a logging dictConfig with factories). Serving such a package is a decision for the
operator, so `serve` refuses it unless told `--trust-remote-code`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmserve.errors import UntrustedCodeError

# compilation_config.backend values vLLM resolves without importing a dotted name.
_BUILTIN_COMPILE_BACKENDS = {"", "inductor", "eager", "aot_eager", "cudagraphs"}


@dataclass(frozen=True)
class CodeArg:
    key: str  # dotted path inside the engine section, e.g. "kv_transfer_config.kv_connector_module_path"
    why: str


def _set(value: Any) -> bool:
    return value not in (None, "", [], {}, False)


def _top_level(engine: Mapping[str, Any]) -> list[CodeArg]:
    found = []
    if engine.get("trust_remote_code") not in (None, False):
        found.append(CodeArg("trust_remote_code", "runs the modeling code shipped in the model folder"))
    if engine.get("worker_cls") not in (None, "", "auto"):
        found.append(CodeArg("worker_cls", "imports the named worker class"))
    for key, why in (
        ("worker_extension_cls", "imports the named class into every worker"),
        ("scheduler_cls", "imports the named scheduler class"),
        ("logits_processors", "imports the named logits-processor classes"),
        ("reasoning_parser_plugin", "executes the named Python file"),
        ("logging_config", "applies a logging dictConfig, which can instantiate any class"),
        ("log_config_file", "applies a logging dictConfig file, which can instantiate any class"),
    ):
        if _set(engine.get(key)):
            found.append(CodeArg(key, why))
    return found


def _nested(engine: Mapping[str, Any]) -> list[CodeArg]:
    found = []
    for section, key in (
        ("kv_transfer_config", "kv_connector_module_path"),
        ("ec_transfer_config", "ec_connector_module_path"),
    ):
        block = engine.get(section)
        if isinstance(block, Mapping) and _set(block.get(key)):
            found.append(CodeArg(f"{section}.{key}", "imports the named connector module"))
    compilation = engine.get("compilation_config")
    if isinstance(compilation, Mapping) and compilation.get("backend") not in (None, *_BUILTIN_COMPILE_BACKENDS):
        found.append(CodeArg("compilation_config.backend", "imports the named compiler backend"))
    return found


def code_executing_engine_args(engine: Mapping[str, Any]) -> list[CodeArg]:
    """The engine arguments in a manifest's `engine:` section that load code, in a stable order."""
    return _top_level(engine) + _nested(engine)


def require_code_trust(engine: Mapping[str, Any], *, trusted: bool, source: str) -> list[CodeArg]:
    """Raise UntrustedCodeError unless `trusted` when the engine arguments load code; return what they load."""
    found = code_executing_engine_args(engine)
    if found and not trusted:
        listed = ", ".join(f"engine.{a.key} ({a.why})" for a in found)
        raise UntrustedCodeError(f"{source}: the package asks the engine to load code: {listed}")
    return found
