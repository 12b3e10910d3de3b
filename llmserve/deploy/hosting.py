"""What serves a package, decided from its manifest as `llmserve serve` decides it, for every target.

`llmserve serve` (llmserve.serve.triton.host.choose_engine, for one package and no --engine) hosts a
package by its `engine.host`, else on the embedded vLLM engine for a vLLM-backend package and in Triton
for a Python-backend one; a Triton-hosted package runs `executionMode` embedded (llmserve's frontends in
front of Triton) or standalone (Triton's own endpoints). Only packages that generate text (vLLM-backend,
or Python-backend with `python.frontend: llm-text`) take `--openai`: serve refuses it for the others.
Each target adds its own mechanism on top (ports and probes on Kubernetes: kubernetes/manifests.Hosting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostChoice:
    engine: str = "vllm"  # vllm | triton
    mode: str = "embedded"  # embedded | standalone (the manifest's executionMode; Triton only)
    openai: bool = True  # the package generates text: its servers take --openai

    @classmethod
    def of(cls, manifest: Any):
        host = manifest.engine_host or ("vllm" if manifest.backend == "vllm" else "triton")
        python = manifest.python
        generates = manifest.backend == "vllm" or (python is not None and python.frontend == "llm-text")
        return cls(host, manifest.executionMode if host == "triton" else "embedded", generates)

    @property
    def triton(self) -> bool:
        return self.engine == "triton"

    @property
    def standalone(self) -> bool:
        return self.triton and self.mode == "standalone"

    def __str__(self) -> str:
        return f"{self.engine}-{self.mode}" if self.standalone else self.engine
