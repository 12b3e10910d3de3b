"""Drive the real vLLM engine (CPU, in-process) with the constraint processor under batch churn.

Run as a script (spawn-safe ``__main__`` guard): ``python engine_run.py MODEL_DIR OUT_JSON``.
One engine start, sized to force every batch change the processor must survive:
- a KV cache of a few hundred tokens for 16 concurrent requests: preemption (requests come back as
  plain ``added`` with output tokens);
- ``max_num_batched_tokens=32`` with prompts longer than that: chunked (partial) prefill;
- staggered prompt lengths and ``max_tokens``: requests finish at different steps, so the batch is
  condensed with moves.
Writes each request's constraint, text, token ids and finish reason, and the processor's counters.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the explicit kv_cache_memory_bytes below rules

KV_BYTES_PER_TOKEN = 2048  # the tiny model on the CPU backend (vLLM estimates max length from this)

DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
WORD = r"[a-z]{3,12}( [a-z]{2,10}){2,4}"
EMAIL = r"[a-z0-9._]{1,12}@[a-z0-9]{1,10}\.(com|org|net)"
CHOICES = ["alpha", "beta", "gamma delta", "ünïcödé", "😀 emoji"]
SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "failed", "pending"]},
        "count": {"type": "integer"},
        "valid": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1, "maxItems": 2},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 5}, "age": {"type": "integer"}},
            "required": ["name"],
        },
    },
    "required": ["status", "count", "valid", "tags", "owner"],
}


def constraints():
    return [
        {"regex": DATE},
        {"regex": WORD},
        {"regex": EMAIL},
        {"choice": CHOICES},
        {"json_schema": SCHEMA},
        {"machine": "even_ab", "args": {}},
        {"machine": "five_tokens", "args": {"allowed": list(range(60, 120))}},
        None,
    ]


def register_custom():
    from llmserve.constraints import ByteAutomaton, TokenStateMachine, register_machine

    class EvenAB(ByteAutomaton):
        """'a'/'b' strings of even length, 2..20 bytes."""

        def start(self):
            return 0

        def step(self, state, byte):
            return state + 1 if byte in (0x61, 0x62) and state < 20 else None

        def accepting(self, state):
            return state >= 2 and state % 2 == 0

    class FiveTokens(TokenStateMachine):
        def __init__(self, allowed):
            self.ids = allowed

        def start(self):
            return 0

        def advance(self, state, token):
            return state + 1 if token in self.ids and state < 5 else None

        def allowed(self, state):
            return self.ids if state < 5 else []

        def is_final(self, state):
            return state == 5

    register_machine("even_ab", lambda vocab: EvenAB())
    register_machine("five_tokens", lambda vocab, allowed: FiveTokens(allowed))


def main(model_dir: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    from llmserve.constraints.vllm_processor import PROCESSOR_PATH, ConstraintLogitsProcessor

    register_custom()
    llm = LLM(
        model=model_dir,
        enforce_eager=True,
        dtype="float32",
        max_model_len=192,
        block_size=32,
        max_num_seqs=16,
        max_num_batched_tokens=32,
        enable_prefix_caching=False,
        kv_cache_memory_bytes=KV_BYTES_PER_TOKEN * 160,  # ~240 tokens (32-token blocks) for 16 requests
        logits_processors=[PROCESSOR_PATH],
    )
    kinds = constraints()
    results = []
    for round_ in range(3):
        prompts, params, used = [], [], []
        for i in range(16):
            c = kinds[(i + round_) % len(kinds)]
            words = " ".join(["tokens model system user"] * (8 + (i * 5) % 6))  # 45..75 tokens: chunked
            prompts.append(f"{words} {i}:")
            extra = {"constraint": c} if c is not None else None
            if c is not None and i % 3 == 0 and "machine" not in c:
                extra = {"constraint": json.dumps(c)}  # the HTTP (vllm_xargs) form: a JSON string
            params.append(
                SamplingParams(
                    temperature=1.0,
                    max_tokens=(110 if "json_schema" in c else 56) if c else 5 + 3 * i,
                    extra_args=extra,
                )
            )
            used.append(c)
        outs = llm.generate(prompts, params, use_tqdm=False)
        for c, o in zip(used, outs, strict=True):  # one output per prompt
            comp = o.outputs[0]
            results.append(
                {
                    "constraint": c,
                    "text": comp.text,
                    "token_ids": list(comp.token_ids),
                    "finish_reason": comp.finish_reason,
                    "prompt_tokens": len(o.prompt_token_ids),
                }
            )
    # a bad constraint is rejected before it reaches the engine (HTTP 400 over the API)
    rejected = None
    try:
        llm.generate(
            ["x"], [SamplingParams(max_tokens=3, extra_args={"constraint": {"regex": "([a-z"}})], use_tqdm=False
        )
    except Exception as exc:
        rejected = f"{type(exc).__name__}: {exc}"
    procs = [r() for r in ConstraintLogitsProcessor.instances if r() is not None]
    stats = procs[0].stats if procs else None
    tok = llm.get_tokenizer()
    Path = __import__("pathlib").Path
    Path(out_path).write_text(
        json.dumps({"results": results, "stats": stats, "rejected": rejected, "eos": tok.eos_token_id}, indent=1)
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
