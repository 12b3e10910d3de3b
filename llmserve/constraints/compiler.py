"""``compile_constraint``: a spec (or its request form) to its compiled form, through an in-memory
memo and the disk cache.

A miss compiles lazily (``CompiledConstraint.lazy``): it returns once the DFA and the start state's
row exist, so a new constraint is usable within about a millisecond; the background finisher
completes the rest and writes the cache file. ``CompiledConstraint.complete()`` waits for all of it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from llmserve.constraints.compiled import CompiledConstraint, compile_dfa
from llmserve.constraints.disk_cache import cache_key, default_cache_dir, read_cache, try_write_cache
from llmserve.constraints.finisher import FINISHER
from llmserve.constraints.spec import spec_from_request
from llmserve.constraints.vocab import Vocab

log = logging.getLogger(__name__)

# Larger constraints (e.g. 20k states over a 128k vocabulary: 320 MiB) are neither completed in the
# background nor cached: only the rows requests actually reach are computed.
MAX_COMPLETE_BYTES = int(os.environ.get("LLMSERVE_CONSTRAINT_COMPLETE_MAX_MB", "256")) << 20
MEMO_SIZE = 256

# (cache key, id(vocab), cache file): a hit must also hold this very vocab object (checked, since an
# id is reused once its object is gone)
_MEMORY: dict[tuple[str, int, str], CompiledConstraint] = {}


def compile_constraint(
    spec: Any, vocab: Vocab, *, cache_dir: Path | str | bool | None = None, backend: str = "native"
) -> CompiledConstraint:
    """Compile ``spec`` (a ConstraintSpec or its request form) against ``vocab``.

    ``cache_dir``: None for the default (``$LLMSERVE_CACHE/constraints``), a path, or False to skip
    the disk cache. Results are also memoised in memory per (digest, vocab object).
    """
    if backend not in ("native", "python"):
        raise ValueError(f"backend must be native or python, not {backend!r}")
    spec = spec_from_request(spec)
    key = cache_key(spec, vocab)
    path = None if cache_dir is False else _cache_root(cache_dir) / f"{key}.bin"
    memo = (key, id(vocab), str(path))
    mem = _MEMORY.get(memo)
    if mem is not None and mem.vocab is vocab:
        return mem
    if path is not None:
        hit = read_cache(path, vocab)
        if hit is not None:
            _MEMORY[memo] = hit
            return hit
    if backend == "python":
        compiled = compile_dfa(spec.to_dfa("python"), vocab, backend="python", key=key)
        if path is not None:
            try_write_cache(path, compiled)
    else:
        compiled = CompiledConstraint.lazy(vocab, spec.to_dfa(), key)
        if path is not None:
            _complete_later(compiled, path)
    _MEMORY[memo] = compiled
    while len(_MEMORY) > MEMO_SIZE:
        _MEMORY.pop(next(iter(_MEMORY)))
    return compiled


def _cache_root(cache_dir: Path | str | bool | None) -> Path:
    if not cache_dir or cache_dir is True:
        return default_cache_dir()
    return Path(cache_dir)


def _complete_later(compiled: CompiledConstraint, path: Path) -> None:
    nbytes = compiled.mask_buffer.nbytes
    if nbytes <= MAX_COMPLETE_BYTES:
        FINISHER.submit(compiled, path)
        return
    log.info(
        "constraint %s: %d states x %d tokens is %d MiB of masks; computing only the rows "
        "requests reach, not caching it",
        compiled.key[:12],
        compiled.num_states,
        compiled.vocab.size,
        nbytes >> 20,
    )


def load_cached(spec: Any, vocab: Vocab, cache_dir: Path | str | None = None) -> CompiledConstraint | None:
    """The compiled form from the disk cache only (None on a miss)."""
    spec = spec_from_request(spec)
    return read_cache(_cache_root(cache_dir) / f"{cache_key(spec, vocab)}.bin", vocab)
