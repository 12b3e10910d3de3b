"""Errors raised while starting or running a server (subclasses of llmserve.errors)."""

from __future__ import annotations

from llmserve.errors import EngineError, IncompatibleError, InvalidInputError


class StartupError(EngineError):
    """A startup step failed; the message names the step."""

    code = "serve-startup"
    default_hint = "Rerun with LLMSERVE_DEBUG=1 to see the engine's own log and traceback."


class PluginInstallError(IncompatibleError):
    """A package plugin could not be registered or would not be honoured by the engine."""

    code = "serve-plugin"
    default_hint = (
        "Fix the plugin's `source`/`entryPoint` in llmserve.yaml, rebuild with `llmserve package`, and serve again."
    )


class EngineArgsError(InvalidInputError):
    """The manifest's engine arguments or a command-line override is not acceptable."""

    code = "serve-engine-args"
    default_hint = "Use vLLM AsyncEngineArgs names in llmserve.yaml `engine:`; see `llmserve serve --help` for overridable settings."


class FrontendUnavailableError(IncompatibleError):
    """A frontend was asked for that this build does not contain."""

    code = "serve-frontend-unavailable"
