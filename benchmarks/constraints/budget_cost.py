"""What steering answers to end within max_tokens costs the processor at B=256 (issue #17 item 4:
nothing measurable for unconstrained requests, under 10% for constrained ones).

The real `ConstraintLogitsProcessor.apply` on a [256, V] float32 batch over cl100k_base, for each of
`bench.py`'s constraints: every row holds a prefix of the sample answer and a max_tokens 2-200 tokens
past it, so that rows near their limit (the last `max_distance` tokens) are steered as in serving.
Compared, interleaved: the same batch with `constraint_budget: false` (no steering), and steering
with every budget row recomputed (its per-constraint cache emptied before each step: the cost when
rows reach states no earlier row did).

```
.venv/bin/python benchmarks/constraints/budget_cost.py [--rounds 9]
```
"""

from __future__ import annotations

import argparse
import statistics
import sys
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import CASES, byte_token_ids, cl100k_vocab, timeit

B = 256


def processors(vp, config, spec, answer: list[int]) -> dict[bool, object]:
    """Two processors over the same batch: steering on (True) and off (False)."""
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    out = {}
    for budget in (True, False):
        proc = vp.ConstraintLogitsProcessor(config, torch.device("cpu"), False)
        rng = np.random.default_rng(1)
        added = []
        for r in range(B):
            tokens = answer[: (7 * r) % len(answer)]
            extra = {"constraint": spec} if budget else {"constraint": spec, "constraint_budget": False}
            params = SamplingParams(max_tokens=len(tokens) + int(rng.integers(2, 200)), extra_args=extra)
            added.append((r, params, [1], list(tokens)))
        proc.update_state(BatchUpdate(batch_size=B, removed=[], added=added, moved=[]))
        out[budget] = proc
    return out


def measure(procs: dict, V: int, rounds: int) -> tuple[float, float, float, float]:
    """(ms without steering, with, with every budget row recomputed, rows steered per step)."""
    forms = list({id(c): c for c in procs[True].constrained.values()}.values())
    logits = torch.randn(B, V)

    def recomputed() -> None:
        for form in forms:
            form._budget_rows.clear()
        procs[True].apply(logits)

    times: dict[str, list[float]] = {"on": [], "off": [], "cold": []}
    for _ in range(rounds):
        times["off"].append(timeit(lambda: procs[False].apply(logits), 9, warm=0))
        times["on"].append(timeit(lambda: procs[True].apply(logits), 9, warm=0))
        times["cold"].append(timeit(recomputed, 3, warm=0))
    on, off, cold = (statistics.median(times[k]) * 1e3 for k in ("on", "off", "cold"))
    return off, on, cold, procs[True].stats["steered"] / max(1, procs[True].stats["applied"])


def main() -> None:
    from llmserve.constraints import vllm_processor as vp

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    vocab = cl100k_vocab()
    vp.vocab_for_model = lambda _config: vocab  # the benchmark's vocabulary instead of a model's
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=0))
    ids = byte_token_ids(vocab)
    print(f"B={B}, cl100k_base ({vocab.size} tokens); apply() ms, medians of {args.rounds} interleaved rounds")
    print("| constraint | rows steered per step | no steering | steering | + | steering, rows recomputed | + |")
    print("|---|---|---|---|---|---|---|")
    for name, (spec, sample) in CASES.items():
        procs = processors(vp, config, spec, [ids[b] for b in sample.encode()])
        off, on, cold, steered = measure(procs, vocab.size, args.rounds)
        print(
            f"| {name} | {steered:.0f} | {off:.2f} | {on:.2f} | {(on / off - 1) * 100:+.0f}% "
            f"| {cold:.2f} | {(cold / off - 1) * 100:+.0f}% |"
        )


if __name__ == "__main__":
    main()
