"""What a server is asked to do: the parsed `llmserve serve` options, with their defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_KEY_ENV = "LLMSERVE_API_KEY"

# Engine arguments the command line may override: operational settings only. The model, its
# weights, tokenizer, dtype and context length come from the package, never from the command line.
OVERRIDABLE_ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes")
# Engine arguments the server may add to (never replace): the package's own logits processors stay.
ADDITIVE_ENGINE_ARGS = ("logits_processors",)
# = llmserve.constraints.vllm_processor.PROCESSOR_PATH (a string here: importing it imports vLLM).
CONSTRAINT_PROCESSOR = "llmserve.constraints.vllm_processor:ConstraintLogitsProcessor"


@dataclass
class ServeOptions:
    package: Path
    openai: bool = False
    host: str = "127.0.0.1"
    port: int = 8000  # HTTP: OpenAI (+ KServe v2 routes) with --openai, KServe v2 HTTP alone without
    grpc_port: int = 8001  # KServe v2 gRPC (Triton's default port)
    api_key: str | None = field(default=None, repr=False)
    served_model_name: str | None = None  # default: the manifest's modelId
    kv_cache_gib: float | None = None  # CPU KV cache size (VLLM_CPU_KVCACHE_SPACE); default 1 GiB on CPU
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_chars: int = 200_000
    drain_timeout_s: float = 30.0
    metrics_dir: Path | None = None
    log_requests: bool = False
    # llmserve's constraint processor (per-request regex / choice / JSON Schema via `vllm_xargs`):
    # loaded by default on generating models; --no-constraints leaves it out (constrained requests: 400).
    constraints: bool = True

    def __post_init__(self) -> None:
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None

    def engine_overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_num_seqs is not None:
            out["max_num_seqs"] = self.max_num_seqs
        if self.max_num_batched_tokens is not None:
            out["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.constraints:
            out["logits_processors"] = [CONSTRAINT_PROCESSOR]
        return out
