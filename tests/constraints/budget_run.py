"""Drive the real vLLM engine (CPU, in-process) with constrained requests at small ``max_tokens``.

Run as a script (spawn-safe ``__main__`` guard): ``python budget_run.py MODEL_DIR OUT_JSON``. The tiny
random-weight model never closes a string, array or object by itself: every answer that comes back
complete was steered to end within its budget by the processor. Writes each request's constraint,
max_tokens, text and finish reason, the refusal of an impossible budget, and the processor's counters.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)

JSON_OBJECT = {"type": "object"}  # any JSON object: what response_format json_object asks for
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]+$", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city"],
        },
        "note": {"type": "string"},
    },
    "required": ["name", "age", "address"],
}
CASES = [(JSON_OBJECT, n) for n in (3, 8, 20, 50, 200)] + [(SCHEMA, n) for n in (30, 50, 200)]
REPEATS = 4


def main(model_dir: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    from llmserve.constraints.vllm_processor import PROCESSOR_PATH, ConstraintLogitsProcessor

    llm = LLM(
        model=model_dir,
        enforce_eager=True,
        dtype="float32",
        max_model_len=320,
        max_num_seqs=16,
        enable_prefix_caching=False,
        kv_cache_memory_bytes=2048 * 320 * 8,
        logits_processors=[PROCESSOR_PATH],
    )
    prompts, params, used = [], [], []
    for k in range(REPEATS):
        for schema, max_tokens in CASES:
            prompts.append(f"tokens model system user {k}:")
            params.append(
                SamplingParams(
                    temperature=1.0,
                    seed=k,
                    max_tokens=max_tokens,
                    extra_args={"constraint": {"json_schema": schema}},
                )
            )
            used.append((schema, max_tokens))
    outs = llm.generate(prompts, params, use_tqdm=False)
    results = [
        {
            "schema": s,
            "max_tokens": n,
            "text": o.outputs[0].text,
            "finish_reason": o.outputs[0].finish_reason,
            "tokens": len(o.outputs[0].token_ids),
        }
        for (s, n), o in zip(used, outs, strict=True)
    ]
    refused = None
    try:
        llm.generate(
            ["x"],
            [SamplingParams(max_tokens=5, extra_args={"constraint": {"json_schema": SCHEMA}})],
            use_tqdm=False,
        )
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    procs = [r() for r in ConstraintLogitsProcessor.instances if r() is not None]
    Path(out_path).write_text(
        json.dumps({"results": results, "refused": refused, "stats": procs[0].stats if procs else None}, indent=1)
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
