"""llmserve's vLLM backend for Triton: the `vllm` backend of a Triton that has none (the nvidia-pytriton wheel).

NVIDIA's Triton images carry a stock vLLM backend that serves a package's `model.json` unchanged. Where it is
absent, llmserve installs this module as Triton's `vllm` backend (a Python-based backend:
``<backends>/vllm/model.py`` re-exports `TritonPythonModel`, see `write_backend_shim`), so the same package runs
unchanged in both places. It speaks the stock backend's protocol (text_input, stream, sampling_parameters,
exclude_input_in_output -> text_output; decoupled) and runs the engine code llmserve's embedded server runs: one
AsyncLLM built by llmserve.serve.engine from the model's engine arguments, the constraint processor, vLLM's
incremental detokenizer, the KServe sampling table (every key honoured or refused by name), and the CPU seeded
sampling fix (llmserve.serve.vllm_patches, a vLLM general plugin).

It runs inside Triton's Python-backend stub, whose environment must have numpy < 2 (Triton 2.51's stub builds
BYTES input arrays wrongly under numpy 2; see llmserve.serve.triton.locate) and vLLM: ``make triton-env``.

Server settings travel in the Triton process's environment (llmserve.serve.triton.backend_settings), set by `llmserve serve --engine triton`.

Structured outputs (the `structured_outputs` sampling parameter, which OpenAI-over-Triton's `response_format`
becomes) are served here by llmserve's constraint processor, as on the embedded engine: answers end within
max_tokens, an impossible budget or a `grammar` is refused by name. `--structured-outputs-backend guidance|...`
reaches this backend in the engine overrides and hands them to vLLM's own backend instead.
"""

from __future__ import annotations

import asyncio
import json
import locale
import logging
import os
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # inside Triton only

from llmserve.formats.tensors import LLM_TEXT_CONTRACT
from llmserve.serve.triton.backend_settings import (
    DEFAULT_MAX_PROMPT_CHARS,
    ENV_CONSTRAINTS,
    ENV_ENGINE_OVERRIDES,
    ENV_MAX_N,
    ENV_MAX_PROMPT_CHARS,
    ENV_TRUST_REMOTE_CODE,
)
from llmserve.serve.triton.text_protocols import ADDITIONAL_OUTPUTS

log = logging.getLogger("llmserve.serve.triton.vllm")

# Triton's stub embeds Python without setting the process locale, so files open as ASCII (torch's own templates
# then fail to load); the engine-core child, a real `python3`, gets UTF-8 from LC_CTYPE (TritonInstall.environment).
if locale.getpreferredencoding(False).lower().replace("-", "") != "utf8":
    locale.setlocale(locale.LC_CTYPE, "C.UTF-8")

# model.json names weights under the image's mount point (llmserve.packaging.builders.REPOSITORY_MOUNT);
# outside an image the same files are under the model repository Triton was given.
REPOSITORY_MOUNT = "/models"
_TRITON_TYPE = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL"}
# How often a running generation asks Triton whether its client cancelled. Each question is a round trip to the
# Triton process made with the GIL held (the engine's event loop waits meanwhile), so it is asked on a timer by
# one watcher per request, never once per delta: at 0.05 s per request and per delta it took a tenth of the stub.
_CANCEL_POLL_S = 0.25


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def resolve_model_path(value: str, repository: Path) -> Path:
    """A model.json path as this Triton sees it: an image path (/models/<id>/...) that does not exist here is
    read under the model repository Triton was given (`repository` is the repository's root folder)."""
    path = Path(value)
    if path.exists() or not path.is_absolute():
        return path if path.is_absolute() else (repository / path)
    parts = path.parts
    if len(parts) > 2 and parts[1] == REPOSITORY_MOUNT.strip("/"):
        return repository.joinpath(*parts[2:])
    return path


def _triton_error(message: str, invalid: bool) -> Any:
    code = getattr(pb_utils.TritonError, "INVALID_ARG" if invalid else "INTERNAL", None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


class TritonPythonModel:
    """One vLLM engine per model instance (config.pbtxt asks for one instance: `count: 1`, KIND_MODEL)."""

    @staticmethod
    def auto_complete_config(auto_complete_model_config: Any) -> Any:
        config = auto_complete_model_config.as_dict()
        have_in = {t["name"] for t in config.get("input", [])}
        have_out = {t["name"] for t in config.get("output", [])}
        for t in LLM_TEXT_CONTRACT.inputs:
            if t.name not in have_in:
                auto_complete_model_config.add_input(
                    {"name": t.name, "data_type": _TRITON_TYPE[t.datatype], "dims": t.dims, "optional": t.optional}
                )
        for t in LLM_TEXT_CONTRACT.outputs:
            if t.name not in have_out:
                auto_complete_model_config.add_output(
                    {"name": t.name, "data_type": _TRITON_TYPE[t.datatype], "dims": t.dims}
                )
        for flag, (output, data_type, dims) in ADDITIONAL_OUTPUTS.items():
            if flag not in have_in:
                auto_complete_model_config.add_input(
                    {"name": flag, "data_type": "TYPE_BOOL", "dims": [1], "optional": True}
                )
            if output not in have_out:
                auto_complete_model_config.add_output({"name": output, "data_type": data_type, "dims": dims})
        auto_complete_model_config.set_model_transaction_policy({"decoupled": True})
        return auto_complete_model_config

    def initialize(self, args: dict[str, Any]) -> None:
        from llmserve.serve.environment import prepare_engine_environment

        # the embedded engine's measured CPU defaults, where `llmserve serve` (or the operator) set none
        prepare_engine_environment(None)
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"model '{args['model_name']}': the vLLM backend streams tokens and needs "
                "`model_transaction_policy { decoupled: true }` in config.pbtxt"
            )
        model_dir = Path(args["model_repository"])  # <repository>/<model name>
        self.model_name = args["model_name"]
        self.max_prompt_chars = _env_int(ENV_MAX_PROMPT_CHARS, DEFAULT_MAX_PROMPT_CHARS)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmserve-vllm-loop", daemon=True)
        self._thread.start()
        self.handle = self._run(self._start(model_dir, args["model_version"]))
        log.info("llmserve vLLM backend: model '%s' ready", self.model_name)

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self, model_dir: Path, version: str) -> Any:
        # deferred: these import vLLM, which only this process (the stub) has
        from llmserve.serve.engine import merged_engine_args, require_trust, start_engine
        from llmserve.serve.environment import settle_kv_cache_size
        from llmserve.serve.errors import StartupError
        from llmserve.serve.options import CONSTRAINT_PROCESSOR, DEFAULT_MAX_N

        model_json = model_dir / version / "model.json"
        try:
            engine_args = json.loads(model_json.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise pb_utils.TritonModelException(f"{model_json}: cannot read the engine arguments: {exc}") from exc
        repository = model_dir.parent
        weights = resolve_model_path(str(engine_args.pop("model", "")), repository)
        tokenizer = engine_args.pop("tokenizer", None)
        if tokenizer is not None and resolve_model_path(str(tokenizer), repository) != weights:
            engine_args["tokenizer"] = str(resolve_model_path(str(tokenizer), repository))
        overrides = json.loads(os.environ.get(ENV_ENGINE_OVERRIDES) or "{}")
        if os.environ.get(ENV_CONSTRAINTS, "1") != "0":
            overrides["logits_processors"] = [CONSTRAINT_PROCESSOR]
        merged = merged_engine_args(engine_args, overrides)
        try:
            kv_note = settle_kv_cache_size(merged)
        except StartupError as exc:
            raise pb_utils.TritonModelException(f"model '{self.model_name}': {exc.message} ({exc.hint})") from exc
        if kv_note:
            log.info("llmserve vLLM backend: model '%s': %s", self.model_name, kv_note)
        require_trust(merged, trusted=os.environ.get(ENV_TRUST_REMOTE_CODE) == "1", source=str(model_json))
        package = _package_view(repository.parent, weights)
        if package is not None:
            self._install_plugins(package)
        view = package if package is not None else _bare_view(repository, weights)
        return await start_engine(view, self.model_name, merged, _env_int(ENV_MAX_N, DEFAULT_MAX_N))

    def _install_plugins(self, package: Any) -> None:
        from llmserve.packaging.opened import cache_root
        from llmserve.serve.plugin_entry_points import install_plugins, load_check

        site = cache_root() / "run" / f"site-triton-{self.model_name}-{os.getpid()}"
        load_check(install_plugins(package, site))

    # -- requests --------------------------------------------------------------------------------------------

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                req = self._parse(request)
            except Exception as exc:
                sender.send(
                    pb_utils.InferenceResponse(error=_triton_error(_message(exc), _is_client_error(exc))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            extras = {flag for flag in ADDITIONAL_OUTPUTS if _flag(request, flag)}
            asyncio.run_coroutine_threadsafe(self._generate(req, extras, request.request_id(), sender), self._loop)
        return None

    def _parse(self, request: Any) -> Any:
        from llmserve.serve.kserve.protocol import DecodedTensor, build_generation

        tensors = []
        for spec in LLM_TEXT_CONTRACT.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is None:
                continue
            values = tensor.as_numpy()
            tensors.append(DecodedTensor(spec.name, spec.datatype, list(values.shape), list(values.reshape(-1))))
        params = json.loads(request.parameters() or "{}")
        if "id" in params and params["id"] == request.request_id():
            # Triton's generate endpoint passes the body's "id" on as the request's id and as a parameter too
            del params["id"]
        return build_generation(
            tensors,
            params,
            transport="grpc",
            streaming_transport=True,
            constraints=self.handle.constraints,
            max_prompt_chars=self.max_prompt_chars,
        )

    async def _generate(self, req: Any, extras: set[str], request_id: str, sender: Any) -> None:
        from llmserve.serve.kserve.generation import generate_deltas

        final_sent = False
        deltas = generate_deltas(self.handle, req, request_id or None)
        watcher = asyncio.ensure_future(_watch_cancellation(sender, asyncio.current_task()))
        try:
            async for delta in deltas:
                if delta.final:
                    # the sender is released with the final response: asking it anything after that crashes
                    # Triton, so the watcher stops first (it runs only at its own awaits, never in between)
                    watcher.cancel()
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if delta.final else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=_outputs(delta, extras)), flags=flags)
                if delta.final:
                    final_sent = True
                    break
        except asyncio.CancelledError:
            pass  # the client cancelled (the watcher saw it) or the model is unloading: the engine request ends below
        except Exception as exc:
            if not final_sent:
                sender.send(
                    pb_utils.InferenceResponse(error=_triton_error(_message(exc), _is_client_error(exc))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                final_sent = True
        finally:
            watcher.cancel()
            await deltas.aclose()  # aborts the request in the engine when it did not finish
            if not final_sent:  # cancelled: Triton still needs the final flag to release the request
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        handle = getattr(self, "handle", None)
        if handle is not None:
            handle.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _watch_cancellation(sender: Any, generation: asyncio.Task[Any] | None) -> None:
    """Cancel `generation` once Triton says its client cancelled (asked every _CANCEL_POLL_S)."""
    while True:
        await asyncio.sleep(_CANCEL_POLL_S)
        if sender.is_cancelled():
            if generation is not None:
                generation.cancel()
            return


def _flag(request: Any, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().reshape(-1)[0])


def _outputs(delta: Any, extras: set[str]) -> list[Any]:
    """text_output, and the additional outputs asked for (as the stock backend names and types them)."""
    out = [pb_utils.Tensor("text_output", np.array([delta.text.encode("utf-8")], dtype=np.object_))]
    if "return_finish_reason" in extras:
        out.append(pb_utils.Tensor("finish_reason", np.array([str(delta.finish_reason).encode()], dtype=np.object_)))
    if "return_num_input_tokens" in extras:
        out.append(pb_utils.Tensor("num_input_tokens", np.array([delta.prompt_tokens], dtype=np.uint32)))
    if "return_num_output_tokens" in extras:
        out.append(pb_utils.Tensor("num_output_tokens", np.array([delta.output_tokens], dtype=np.uint32)))
    return out


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__


def _is_client_error(exc: BaseException) -> bool:
    from llmserve.serve.kserve.errors import KServeError

    return isinstance(exc, KServeError) and exc.http_status == 400


def _package_view(root: Path, weights: Path) -> Any:
    """The llmserve package around the model repository (for its plugins), or None for a bare repository."""
    from llmserve.packaging.opened import open_package

    if not (root / "llmserve.yaml").is_file():
        return None
    package = open_package(root)
    return package if package.weights_dir.resolve() == weights.resolve() else None


def _bare_view(repository: Path, weights: Path) -> Any:
    """What start_engine reads of a package (its weights folder) for a model repository without llmserve.yaml."""
    from types import SimpleNamespace

    return SimpleNamespace(weights_dir=weights, root=repository)
