"""What a server is asked to do: the parsed `llmserve serve` options, with their defaults."""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmserve.errors import InvalidInputError

log = logging.getLogger("llmserve.serve")

API_KEY_ENV = "LLMSERVE_API_KEY"
# Seconds an engine core may leave a ping unanswered before the server counts it hung and ends (exit 7).
STALL_TIMEOUT_ENV = "LLMSERVE_ENGINE_STALL_TIMEOUT_S"
DEFAULT_STALL_TIMEOUT_S = 60.0


def _env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment, else the default (a bad value is an error)."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise InvalidInputError(f"{name}={text!r}: not a positive number of seconds", hint=f"Unset {name} or fix it.")
    return value


# Most choices (`n`) one request may ask for. vLLM's own cap is 16384: one request could fill the
# batch and the KV cache with copies of itself. The frontends refuse more with a 400 (EngineHandle.max_n).
DEFAULT_MAX_N = 8

# Engine arguments the command line may override: operational settings only. The model, its
# weights, tokenizer, dtype and context length come from the package, never from the command line.
OVERRIDABLE_ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes")
# Engine arguments the server may add to (never replace): the package's own logits processors stay.
ADDITIVE_ENGINE_ARGS = ("logits_processors",)
# = llmserve.constraints.vllm_processor.PROCESSOR_PATH (a string here: importing it imports vLLM).
CONSTRAINT_PROCESSOR = "llmserve.constraints.vllm_processor:ConstraintLogitsProcessor"


class ApiKeyError(InvalidInputError):
    """The API key was given in more than one way, or its file cannot be used."""

    code = "serve-api-key"
    default_hint = (
        "Give the key once: --api-key-file PATH (a file only you can read: chmod 600 PATH) "
        f"or the {API_KEY_ENV} environment variable."
    )


def read_api_key_file(path: Path) -> str:
    """The key in `path` (surrounding whitespace and the trailing newline stripped).

    A file other users can read is refused, as ssh refuses a private key they can read: the key would
    be as exposed as on the command line. Group-readable is accepted with a warning (Kubernetes secret
    volumes with an fsGroup are group-readable by design).
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ApiKeyError(f"--api-key-file {path}: cannot read it: {exc}") from exc
    if mode & stat.S_IROTH:
        raise ApiKeyError(
            f"--api-key-file {path}: the file is readable by other users (mode {stat.S_IMODE(mode):o})",
            hint=f"chmod 600 {path}, then serve again.",
        )
    if mode & stat.S_IRGRP:
        log.warning("--api-key-file %s is readable by its group (mode %o)", path, stat.S_IMODE(mode))
    key = text.strip()
    if not key or "\n" in key:
        raise ApiKeyError(f"--api-key-file {path}: expected one line holding the key, found {len(key.splitlines())}")
    return key


@dataclass
class ServeOptions:
    # a path, or a model store reference (s3://BUCKET/PREFIX/MODEL:VERSION) pulled into the store cache first
    package: Path | str
    # More packages hosted beside `package` (Triton only: one Triton hosts every model given).
    extra_packages: list[Path | str] = field(default_factory=list)
    # Where store references are materialised (llmserve.store's cache; default $LLMSERVE_CACHE/store).
    store_cache: Path | None = None
    # "vllm" (the embedded engine) or "triton"; None: vLLM for one vLLM-backend package, else Triton.
    engine: str | None = None
    metrics_port: int = 8002  # Triton's own metrics endpoint (--engine triton, standalone)
    # Longest a /metrics scrape waits for a remote source (Triton's endpoint) before serving the rest without it.
    metrics_timeout_s: float = 2.0
    # Attach llmserve's frontends to a Triton that already runs: its gRPC (and, optional, HTTP) address.
    triton_url: str | None = None
    triton_http_url: str | None = None
    openai: bool = False
    host: str = "127.0.0.1"
    port: int = 8000  # HTTP: OpenAI (+ KServe v2 routes) with --openai, KServe v2 HTTP alone without
    grpc_port: int = 8001  # KServe v2 gRPC (Triton's default port)
    api_key: str | None = field(default=None, repr=False)
    # A file holding the key (kept out of the process arguments, which every local user can read).
    api_key_file: Path | None = None
    served_model_name: str | None = None  # default: the manifest's modelId
    kv_cache_gib: int | None = None  # CPU KV cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE); default 1 GiB on CPU
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_chars: int = 200_000
    drain_timeout_s: float = 30.0
    # an engine core that does not answer a ping this long is hung: the server ends (llmserve.serve.server).
    # None: not given on the command line (then LLMSERVE_ENGINE_STALL_TIMEOUT_S, else 60 s): see stall_timeout_s.
    engine_stall_timeout_s: float | None = None
    metrics_dir: Path | None = None
    log_requests: bool = False
    # llmserve's constraint processor (per-request regex / choice / JSON Schema via `vllm_xargs`):
    # loaded by default on generating models; --no-constraints leaves it out (constrained requests: 400).
    constraints: bool = True
    # Who serves response_format / structured_outputs: "llmserve" (the constraint processor) or one of
    # vLLM's backends (guidance, xgrammar, outlines, lm-format-enforcer, auto), kept for comparison.
    structured_outputs_backend: str = "llmserve"
    # Serve a package whose engine arguments make vLLM load code (llmserve/formats/engine_trust.py).
    trust_remote_code: bool = False
    max_n: int = DEFAULT_MAX_N

    def __post_init__(self) -> None:
        if self.engine_stall_timeout_s is not None and not self.engine_stall_timeout_s > 0:
            raise InvalidInputError(
                f"--engine-stall-timeout {self.engine_stall_timeout_s:g}: not a positive number of seconds",
                hint=f"Give the seconds a hung engine may go unanswered (default {DEFAULT_STALL_TIMEOUT_S:g}).",
            )
        _env_seconds(STALL_TIMEOUT_ENV, DEFAULT_STALL_TIMEOUT_S)  # a malformed value fails at start, not at ready
        env_key = os.environ.get(API_KEY_ENV) or None
        if self.api_key_file is not None:
            from_file = read_api_key_file(Path(self.api_key_file))
            # Options are copied with dataclasses.replace once packages are resolved, which runs this
            # again with the key already read: the file's own key is not a second source.
            other = self.api_key if self.api_key is not None else env_key
            if other is not None and (self.api_key is None or self.api_key != from_file):
                given = "--api-key" if self.api_key is not None and self.api_key != env_key else API_KEY_ENV
                raise ApiKeyError(f"the API key is given twice: by --api-key-file and by {given}")
            self.api_key = from_file
        elif self.api_key is None:
            self.api_key = env_key
        if self.max_n < 1:
            raise InvalidInputError(f"--max-n must be at least 1, not {self.max_n}")

    @property
    def packages(self) -> list[Path | str]:
        return [self.package, *self.extra_packages]

    def stall_timeout_s(self) -> float:
        """Seconds the server's engine watch lets a ping go unanswered: the flag, else the environment, else 60."""
        if self.engine_stall_timeout_s is not None:
            return self.engine_stall_timeout_s
        return _env_seconds(STALL_TIMEOUT_ENV, DEFAULT_STALL_TIMEOUT_S)

    def stall_timeout_asked_by(self) -> str | None:
        """Who asked for a stall timeout (the flag or the environment variable), None when nobody did: a host
        without the engine watch refuses it rather than drop it."""
        if self.engine_stall_timeout_s is not None:
            return "--engine-stall-timeout"
        return STALL_TIMEOUT_ENV if os.environ.get(STALL_TIMEOUT_ENV) else None

    def engine_overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_num_seqs is not None:
            out["max_num_seqs"] = self.max_num_seqs
        if self.max_num_batched_tokens is not None:
            out["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.constraints:
            out["logits_processors"] = [CONSTRAINT_PROCESSOR]
        if self.structured_outputs_backend != "llmserve":  # llmserve.serve.engine.STRUCTURED_BACKEND_ARG
            out["structured_outputs_backend"] = self.structured_outputs_backend
        return out
