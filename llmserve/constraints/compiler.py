"""``compile_constraint``: a spec (or its request form) to its compiled form, through an in-memory
cache and the disk cache; ``dfa_for``: a spec to its byte automaton, the part that frontend
validation and the engine share.

A new constraint is compiled once per request, wherever the request is checked first: frontend
validation builds the automaton (``dfa_for``, bounded by the limits in ``limits.py``), keeps it in
memory and writes it to the disk cache; the engine's processor (another process) finds it there and
only compiles it against the vocabulary. A constraint that failed is remembered too (the same bad
constraint sent again costs nothing). A time budget failure is remembered (under that budget) only
when the compile used at least half the budget in CPU time: one starved of CPU by a busy machine
may pass later, one that really needs more is not compiled again for every request that sends it.

A budget check (``shortest_answer``) needs only how many tokens the shortest answer takes: it reads
the exact distances when this process or the disk cache holds them, and otherwise searches forward
from the start state over the automaton and the vocabulary (``budget.fewest_tokens``), without mask
tables (a frontend process would otherwise hold a second copy of a table the engine builds anyway:
megabytes per constraint at a 128k vocabulary) and within the compile time budget. The distances of
every state, which steering needs, are the engine's to compute, in the background, steering by the
single-byte figure until then; once it has them they are kept in the disk cache too
(``dist-<key>.bin``, a few KB), where a later compile in another process picks them up instead of
walking the vocabulary again (seconds for a large schema). Only a request whose answer fits
``max_tokens`` while that single-byte figure does not needs them at once: its check computes and
keeps them (``_steerable``), and the engine's form takes them from there.

A form miss compiles lazily (``CompiledConstraint.lazy``): it returns once the DFA and the start
state's row exist, so a new constraint is usable within about a millisecond; the background finisher
completes the rest and writes the cache file. ``CompiledConstraint.complete()`` waits for all of it.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from llmserve.constraints.budget import Shortest, fewest_tokens, token_distances
from llmserve.constraints.budget import distances as byte_distances
from llmserve.constraints.compiled import CompiledConstraint, compile_dfa
from llmserve.constraints.disk_cache import (
    cache_key,
    default_cache_dir,
    dfa_key,
    read_arrays,
    read_cache,
    read_dfa,
    try_write_cache,
    try_write_dfa,
    write_arrays,
)
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.finisher import FINISHER
from llmserve.constraints.jsonschema import schema_to_dfa
from llmserve.constraints.limits import limits
from llmserve.constraints.memory_cache import MemoryCache
from llmserve.constraints.regex import ByteDFA, compile_ast
from llmserve.constraints.spec import ConstraintSpec, spec_from_request
from llmserve.constraints.vocab import Vocab

log = logging.getLogger(__name__)

# Compiled forms ((cache key, id(vocab), cache file) -> CompiledConstraint: a hit must also hold this
# very vocab object, checked, since an id is reused once its object is gone), automata (dfa key ->
# ByteDFA) and failures (dfa key -> ConstraintError), in one budget.
_MEMORY = MemoryCache(lambda: limits().cache_bytes)


def _form_bytes(c: CompiledConstraint) -> int:
    return c.nbytes


def _hold(memo: tuple, c: CompiledConstraint) -> None:
    """Keep ``c`` in memory, counted at its size now and again once its rows are compressed."""
    _MEMORY.put(memo, c, _form_bytes(c), weak=True)
    if not c.compressed:
        c.on_compressed = lambda done: _MEMORY.put(memo, done, _form_bytes(done), weak=True)


def dfa_for(
    spec: ConstraintSpec,
    *,
    cache_dir: Path | str | bool | None = None,
    backend: str = "native",
    keep_on_disk: bool = True,
    keep_in_memory: bool = True,
) -> ByteDFA:
    """The byte automaton of ``spec``: from memory, from the disk cache, or built (within the
    compile limits; ConstraintError when over one, or when the constraint is invalid).
    ``keep_on_disk``: write a built automaton to the disk cache (validation does, for the engine
    process; the engine does not, its complete form is cached instead). ``keep_in_memory``: the same
    for the in-memory cache (the engine's compiled form holds its own automaton: a second one kept
    beside it would cost its size again for nothing)."""
    key = dfa_key(spec)
    memo = ("dfa", key, backend)
    hit = _MEMORY.get(memo)
    if isinstance(hit, ConstraintError):
        raise hit
    if hit is not None:
        return hit
    budget_ms = limits().compile_ms
    over_time = ("dfa-over-time", key, backend, budget_ms)
    refused = _MEMORY.get(over_time)
    if isinstance(refused, ConstraintError):
        raise refused
    path = None if cache_dir is False or backend != "native" else _cache_root(cache_dir) / f"{key}.bin"
    dfa = read_dfa(path) if path is not None else None
    if dfa is None:
        started, cpu_started = time.monotonic(), time.thread_time()
        try:
            # the whole automaton over byte classes (``ByteDFA``): compiled as it is, never expanded
            build = functools.partial(compile_ast, classes=True)
            if spec.kind == "json_schema":
                dfa = schema_to_dfa(spec.value, backend, started=started, build=build)
            else:
                dfa = build(spec.to_ast(), backend, started=started)
        except ConstraintError as exc:
            if "time budget" not in exc.message:
                _MEMORY.put(memo, exc, len(exc.message) + 256)
            elif (time.thread_time() - cpu_started) * 1000 >= budget_ms / 2:  # not merely starved of CPU
                _MEMORY.put(over_time, exc, len(exc.message) + 256)
            raise
        if path is not None and keep_on_disk:
            try_write_dfa(path, key, dfa)
    if keep_in_memory:
        _MEMORY.put(memo, dfa, dfa.nbytes)
    return dfa


def compile_constraint(
    spec: Any, vocab: Vocab, *, cache_dir: Path | str | bool | None = None, backend: str = "native"
) -> CompiledConstraint:
    """Compile ``spec`` (a ConstraintSpec or its request form) against ``vocab``.

    ``cache_dir``: None for the default (``$LLMSERVE_CACHE/constraints``), a path, or False to skip
    the disk cache. Results are also kept in memory per (digest, vocab object), within
    ``LLMSERVE_CONSTRAINT_CACHE_MB``.
    """
    if backend not in ("native", "python"):
        raise ValueError(f"backend must be native or python, not {backend!r}")
    spec = spec_from_request(spec)
    key = cache_key(spec, vocab)
    path = None if cache_dir is False else _cache_root(cache_dir) / f"{key}.bin"
    memo = (key, id(vocab), str(path))
    mem = _held_form(memo, vocab)
    if mem is not None:
        if mem.known_distances is None:  # a budget check may have kept them since (a tight max_tokens)
            _reuse_distances(mem, key, cache_dir)
        return mem
    if path is not None:
        hit = read_cache(path, vocab)
        if hit is not None:
            _reuse_distances(hit, key, cache_dir)
            _hold(memo, hit)
            return hit
    dfa = dfa_for(spec, cache_dir=cache_dir, backend=backend, keep_on_disk=False, keep_in_memory=False)
    if backend == "python":
        compiled = compile_dfa(dfa, vocab, backend="python", key=key)
        if path is not None:
            try_write_cache(path, compiled)
    else:
        compiled = CompiledConstraint.lazy(vocab, dfa, key)
        if path is not None:
            _complete_later(compiled, path)
    _reuse_distances(compiled, key, cache_dir)
    _hold(memo, compiled)
    return compiled


def shortest_answer(
    spec: Any, vocab: Vocab, *, cache_dir: Path | str | bool | None = None, within: int | None = None
) -> Shortest:
    """The fewest tokens of an answer to ``spec`` over ``vocab``, end of sequence not counted
    (``budget.UNREACHABLE`` when there is none): what a budget check needs (see the module doc and
    ``budget.fewest_tokens``; ``within``: an answer of at most that many tokens is enough). Never
    compiles mask tables. Computes every state's distance only when an answer fits ``within`` but
    steering by the single-byte figure could not keep it there (``_steerable``). A search that runs
    out of the compile time budget gives a lower bound, logged."""
    spec = spec_from_request(spec)
    key = cache_key(spec, vocab)
    path = None if cache_dir is False else _cache_root(cache_dir) / f"{key}.bin"
    held = _held_form((key, id(vocab), str(path)), vocab)
    if held is not None and held.known_distances is not None:
        return Shortest(int(held.known_distances[held.start]))
    memo = ("shortest", key)
    found: Shortest | None = _MEMORY.get(memo)
    dfa: ByteDFA | None = None
    if found is None or not _decides(found, within):
        dfa = dfa_for(spec, cache_dir=cache_dir)
        dist = _known_distances(key, cache_dir, dfa.num_states)
        if dist is not None:
            return Shortest(int(dist[dfa.start]))
        table, classes = _columns(dfa)
        budget_ms = limits().compile_ms
        found = fewest_tokens(table, dfa.accept, dfa.start, vocab, classes, within=within, budget_ms=budget_ms)
        if found.bound == "at least":
            log.warning(
                "constraint %s: the search for its shortest answer ran out of its %d ms; every answer "
                "takes at least %d tokens",
                key[:12],
                budget_ms,
                found.tokens,
            )
        _MEMORY.put(memo, found, 256)
    if within is not None and found.bound != "at least" and found.tokens <= within:
        dist = _steerable(spec, key, vocab, cache_dir, within, dfa)
        if dist is not None and held is not None:
            held.distances = dist
    return found


def _decides(found: Shortest, within: int | None) -> bool:
    """Whether a remembered figure answers a check ``within``: an exact one always; an answer of at
    most n tokens when n fits; a lower bound when even it does not fit (a refusal: searching again
    would spend the same time to refuse again)."""
    if found.bound == "exact":
        return True
    if within is None:
        return False
    return found.tokens <= within if found.bound == "at most" else found.tokens > within


def _steerable(
    spec: ConstraintSpec,
    key: str,
    vocab: Vocab,
    cache_dir: Path | str | bool | None,
    within: int,
    dfa: ByteDFA | None,
) -> NDArray[np.int32] | None:
    """Every state's distance, kept for the engine (memory and disk cache) and returned, when an
    admitted answer of ``within`` tokens needs them: the engine steers by the single-byte figure
    until its own background search has them, and where that figure of the start state exceeds
    ``within`` it could not keep the answer within max_tokens. None when the bound is enough or
    they are kept already."""
    bound_memo = ("start-bound", key)
    bound: int | None = _MEMORY.get(bound_memo)
    if bound is None:
        dfa = dfa or dfa_for(spec, cache_dir=cache_dir)
        table, classes = _columns(dfa)
        bound = int(byte_distances(table, dfa.accept, vocab.single_bytes, classes)[dfa.start])
        _MEMORY.put(bound_memo, bound, 64)
    if bound <= within:
        return None
    dfa = dfa or dfa_for(spec, cache_dir=cache_dir)
    if _known_distances(key, cache_dir, dfa.num_states) is not None:
        return None
    table, classes = _columns(dfa)
    dist = token_distances(table, dfa.accept, vocab, classes)
    _keep_distances(key, cache_dir, dist)
    return dist


def _columns(dfa: ByteDFA) -> tuple[NDArray[np.int32], NDArray[np.uint8] | None]:
    """(table, classes) for the distance searches: the automaton's class form when it has one (the
    byte table would be expanded for it), else its byte table and None."""
    if dfa.transitions is not None:
        classes, columns = dfa.transitions
        return columns, classes
    return dfa.table, None


def _distances_path(key: str, cache_dir: Path | str | bool | None) -> Path | None:
    return None if cache_dir is False else _cache_root(cache_dir) / f"dist-{key}.bin"


def _known_distances(key: str, cache_dir: Path | str | bool | None, num_states: int) -> NDArray[np.int32] | None:
    """The distances of the constraint ``key`` names (which includes the vocabulary's digest) if
    this process or the disk cache has them."""
    dist: NDArray[np.int32] | None = _MEMORY.get(("distances", key))
    if dist is None:
        path = _distances_path(key, cache_dir)
        found = read_arrays(path, path.stem) if path is not None else None
        stored = found[1].get("dist") if found is not None else None
        if stored is not None and stored.dtype == np.int32 and stored.ndim == 1:
            dist = stored
            _MEMORY.put(("distances", key), dist, int(dist.nbytes) + 256)
    return dist if dist is not None and dist.shape[0] == num_states else None


def _held_form(memo: tuple, vocab: Vocab) -> CompiledConstraint | None:
    mem = _MEMORY.get(memo)
    if not isinstance(mem, CompiledConstraint) or mem.vocab is not vocab:
        return None
    # a lazy form grows by the rows requests reach, and a form compressed since it was counted
    # shrinks: counted again at each use
    _MEMORY.put(memo, mem, _form_bytes(mem), weak=True)
    return mem


def _reuse_distances(compiled: CompiledConstraint, key: str, cache_dir: Path | str | bool | None) -> None:
    """Give ``compiled`` the distances another process (or an earlier form here) already computed
    (the key names the constraint and the vocabulary's digest, so they are the same automaton's);
    else keep the ones its background search will compute."""
    dist = _known_distances(key, cache_dir, compiled.num_states)
    if dist is not None:
        compiled.distances = dist
    else:
        compiled.on_distances = functools.partial(_keep_distances, key, cache_dir)


def _keep_distances(key: str, cache_dir: Path | str | bool | None, dist: NDArray[np.int32]) -> None:
    _MEMORY.put(("distances", key), dist, int(dist.nbytes) + 256)
    path = _distances_path(key, cache_dir)
    if path is not None:
        try:
            write_arrays(path, path.stem, {"dist": dist}, {})
        except OSError as exc:
            log.warning("constraint distances not cached (%s): %s", path, exc)


def _cache_root(cache_dir: Path | str | bool | None) -> Path:
    if not cache_dir or cache_dir is True:
        return default_cache_dir()
    return Path(cache_dir)


def _complete_later(compiled: CompiledConstraint, path: Path) -> None:
    # Larger constraints (e.g. 20k states over a 128k vocabulary: 320 MiB) are neither completed in
    # the background nor cached: only the rows requests actually reach are computed.
    nbytes = compiled.dense_bytes  # what completing it holds until it is compressed
    if nbytes <= limits().complete_max_mb << 20:
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
