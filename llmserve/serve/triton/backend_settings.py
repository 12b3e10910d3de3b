"""The settings `llmserve serve --engine triton` hands to llmserve's vLLM backend inside Triton.

They travel in the Triton process's environment (Triton's stub inherits it), so the backend module
(llmserve.serve.triton.vllm_model, importable only inside Triton's Python backend) and the server that
starts Triton agree on them here.
"""

from __future__ import annotations

ENV_MAX_PROMPT_CHARS = "LLMSERVE_TRITON_MAX_PROMPT_CHARS"
ENV_MAX_N = "LLMSERVE_TRITON_MAX_N"
ENV_CONSTRAINTS = "LLMSERVE_TRITON_CONSTRAINTS"  # "0": leave the constraint processor out
ENV_TRUST_REMOTE_CODE = "LLMSERVE_TRITON_TRUST_REMOTE_CODE"  # "1": allow engine arguments that load code
ENV_ENGINE_OVERRIDES = "LLMSERVE_TRITON_ENGINE_OVERRIDES"  # JSON object of overridable engine arguments
DEFAULT_MAX_PROMPT_CHARS = 200_000
