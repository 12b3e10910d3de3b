"""From a spec (or its request form) to what a batch row is served from, through an in-memory cache
and the disk cache.

A new constraint is checked where the request arrives first, the frontend (``check_constraint``):
it is converted to its tree (``words_for``: the serialised AST, bounded by the limits in
``limits.py``), and what its NFA would be is read off the tree (``_tree_facts``: within the limits,
not empty, a shortest answer), neither the NFA nor the whole automaton built; the tree is kept in
memory and on disk (``words-<dfa key>.bin``). The engine's processor (another process) reads the
tree back and serves the rows from the automaton built as it is walked (``serving_form``, a
``lazy_form.LazyConstraint``: the NFA and the states answers reach), while its background builder
builds the complete form from the same tree (``compile_constraint``'s form: the whole minimal
automaton, mask rows completed and compressed, cached on disk) for the requests after. What the
lazy path cannot take (nesting past MAX_DEPTH, an NFA over the limit: it has no narrower subset)
is built whole on the request path as before (``dfa_for``). A constraint that failed is remembered
too (the same bad constraint sent again costs nothing). A time budget failure is remembered (under
that budget) only when the compile used at least half the budget in CPU time: one starved of CPU by
a busy machine may pass later, one that really needs more is not compiled again for every request
that sends it.

A budget check (``shortest_answer``) needs only how many tokens the shortest answer takes: it reads
the exact distances when this process or the disk cache holds them; it admits a request whose
budget the tree's shortest answer, cut into the longest tokens, fits (``_tree_greedy``: no
automaton); otherwise it searches forward from the start state over the automaton built as it is
walked (``budget.lazy_fewest_tokens``), or
the whole one where only that exists, without mask tables (a frontend process would otherwise hold
a second copy of a table the engine builds anyway: megabytes per constraint at a 128k vocabulary)
and within the compile time budget. The distances of every state, which steering by the complete
form needs, are the engine's to compute, in the background, steering by the single-byte figure
until then; once it has them they are kept in the disk cache too (``dist-<key>.bin``, a few KB),
where a later compile in another process picks them up instead of walking the vocabulary again
(seconds for a large schema). A request whose ``max_tokens`` is below that single-byte figure is
steered along the tree's shortest answer cut into the longest tokens (the answer its check admitted
it by), recorded in the form that serves it (``_steers``). Only one whose budget is below that
answer too, while the exact search admits it, needs every distance at once: its check builds the
whole automaton and computes and keeps them (``_steerable``), and the engine serves that request
from the complete form, which takes them from there (``serving_form``'s ``within``).

``compile_constraint`` on a miss compiles lazily too, in its own way (``CompiledConstraint.lazy``):
the whole automaton now, the mask rows as rows reach them; the background finisher compresses all
the rows, one at a time (never the dense table), swaps them in and writes the cache file.
``CompiledConstraint.complete()`` waits for all of it.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from llmserve.constraints.background import Background
from llmserve.constraints.budget import UNREACHABLE, Shortest, fewest_tokens, lazy_fewest_tokens, token_distances
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
from llmserve.constraints.errors import ConstraintError, fresh
from llmserve.constraints.finisher import FINISHER
from llmserve.constraints.jsonschema import schema_to_dfa, schema_words, too_large
from llmserve.constraints.lazy_form import LazyConstraint
from llmserve.constraints.limits import limits
from llmserve.constraints.memory_cache import MemoryCache
from llmserve.constraints.native import native as core
from llmserve.constraints.native import native_vocab
from llmserve.constraints.regex import (
    EMPTY_LANGUAGE,
    EVERY_BYTE,
    ByteDFA,
    TreeFacts,
    ast_words,
    compile_ast,
    compile_words,
    lazy_words,
    tree_facts,
)
from llmserve.constraints.spec import ConstraintSpec, spec_from_request
from llmserve.constraints.vocab import Vocab

log = logging.getLogger(__name__)

# Compiled forms ((cache key, id(vocab), cache file) -> CompiledConstraint: a hit must also hold this
# very vocab object, checked, since an id is reused once its object is gone), automata (dfa key ->
# ByteDFA) and failures (dfa key -> ConstraintError), in one budget.
_MEMORY = MemoryCache(lambda: limits().cache_bytes)


def _keep_form(memo: tuple, c: CompiledConstraint) -> None:
    """``c`` in the in-memory cache at its own bytes, its shared rows counted once for all forms."""
    _MEMORY.put(memo, c, c.private_nbytes, weak=True, shared=c.shared_words)


def _hold(memo: tuple, c: CompiledConstraint) -> None:
    """Keep ``c`` in memory, counted at its size now and again once its rows are compressed."""
    _keep_form(memo, c)
    if not c.compressed:
        c.on_compressed = lambda done: _keep_form(memo, done)


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
        raise fresh(hit)
    if hit is not None:
        return hit
    budget_ms = limits().compile_ms
    over_time = ("dfa-over-time", key, backend, budget_ms)
    refused = _MEMORY.get(over_time)
    if isinstance(refused, ConstraintError):
        raise fresh(refused)
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
            _remember(memo, over_time, exc, cpu_started)
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
        if path is not None:  # compressed and cached in the background (finisher.py)
            FINISHER.submit(compiled, path)
    _reuse_distances(compiled, key, cache_dir)
    _hold(memo, compiled)
    return compiled


# a constraint the lazy path refuses for its size (it has no narrower subset): the whole path serves it
_WHOLE = "whole"
# the complete forms of constraints first served lazily, built one at a time off the request path;
# past this many waiting, a constraint stays on its lazy form until a later request queues it again
_BUILDER = Background("llmserve-constraint-whole", max_pending=64)
# a build is bounded by the compile time budget: waited for at exit (background.py says why)
atexit.register(lambda: _BUILDER.close(limits().compile_ms / 1000 + 5))


def _remember(memo: tuple, over_time: tuple, exc: ConstraintError, cpu_started: float) -> None:
    """Remember a refusal so that the same constraint sent again costs nothing: at once, unless it is
    a time budget's; that one (under that budget: ``over_time``) only when the work used at least
    half the budget in CPU time (``time.thread_time`` since ``cpu_started``): one starved of CPU by a
    busy machine may pass later, one that really needs more is not tried again for every request."""
    if "time budget" not in exc.message:
        _MEMORY.put(memo, fresh(exc), len(exc.message) + 256)
    elif (time.thread_time() - cpu_started) * 1000 >= limits().compile_ms / 2:
        _MEMORY.put(over_time, fresh(exc), len(exc.message) + 256)


def words_for(
    spec: ConstraintSpec, *, cache_dir: Path | str | bool | None = None, check: bool = True
) -> NDArray[np.int32] | None:
    """The constraint's tree serialised for the core (``regex.ast_words``; ``jsonschema.schema_words``
    inlines references), what its automaton is built from, whole or as it is walked: from memory,
    from the disk cache (``words-<dfa key>.bin``, kept by the process that converted it first, a
    frontend's check, so that the engine does not convert it again) or converted now, within the
    compile limits. None when the lazy path does not take it: too large or too deep (it has no
    narrower subset), or routed to the whole path since (``_route_whole``); ``dfa_for`` serves it
    then. ConstraintError for an invalid constraint, remembered (``_remember``); ``check`` False
    (the engine serving a request the check admitted) neither remembers a time budget refusal nor
    takes the route to the whole path."""
    key = dfa_key(spec)
    memo = ("words", key)
    over_time = ("words-over-time", key, limits().compile_ms)
    if check and _routed_whole(key, cache_dir):
        return None
    for hit in (_MEMORY.get(memo), _MEMORY.get(over_time) if check else None):
        if isinstance(hit, ConstraintError):
            raise fresh(hit)
        if hit is not None:
            return None if isinstance(hit, str) else hit
    path = _words_path(key, cache_dir)
    found = read_arrays(path, path.stem) if path is not None else None
    words = found[1].get("words") if found is not None else None
    if words is None or words.dtype != np.int32 or words.ndim != 1:
        started, cpu_started = time.monotonic(), time.thread_time()
        try:
            if spec.kind == "json_schema":
                words = schema_words(spec.value, started=started)
            else:
                words = ast_words(spec.to_ast(), started=started)
        except ConstraintError as exc:
            if _declined_for_size(key, exc):
                return None
            if check or "time budget" not in exc.message:
                _remember(memo, over_time, exc, cpu_started)
            raise
        if path is not None:
            try:
                write_arrays(path, path.stem, {"words": words}, {})
            except OSError as exc:
                log.warning("constraint words not cached (%s): %s", path, exc)
    _MEMORY.put(memo, words, int(words.nbytes) + 256)
    return words


def _declined_for_size(key: str, exc: ConstraintError) -> bool:
    """Whether ``exc`` is one the lazy path leaves to the whole one (its size or nesting, which
    ``schema_to_dfa`` may narrow; not time), remembered for ``key`` when it is."""
    if too_large(exc) and "time budget" not in exc.message:
        _MEMORY.put(("words", key), _WHOLE, 256)
        return True
    return False


def _words_path(key: str, cache_dir: Path | str | bool | None) -> Path | None:
    return None if cache_dir is False else _cache_root(cache_dir) / f"words-{key}.bin"


def _new_lazy(
    spec: ConstraintSpec, cache_dir: Path | str | bool | None, *, check: bool = True
) -> tuple[core.LazyDfa, NDArray[np.int32]] | None:
    """A new automaton built as it is walked, and the tree it is built from (``words_for``, same
    ``check``): its NFA now (a malformed tree or an empty language is refused here). None as
    ``words_for``, and when its NFA is over the limit."""
    words = words_for(spec, cache_dir=cache_dir, check=check)
    if words is None:
        return None
    cpu_started = time.thread_time()
    try:
        return lazy_words(words), words
    except ConstraintError as exc:
        key = dfa_key(spec)
        if _declined_for_size(key, exc):
            return None
        if check:
            _remember(("words", key), ("words-over-time", key, limits().compile_ms), exc, cpu_started)
        raise


def lazy_automaton(spec: ConstraintSpec, *, cache_dir: Path | str | bool | None = None) -> core.LazyDfa | None:
    """The budget check's automaton built as it is walked (``_new_lazy``), one per process. Not the
    one rows are served from: a check's search holds its lock for up to the compile time budget on
    a low-priority thread, and the states it builds count against its limits, neither of which may
    reach a batch row. Kept after a search ran out of time (the states it built serve the next
    search); built again once at its state or memory limit. None as ``_new_lazy``."""
    memo = ("lazy-dfa", dfa_key(spec))
    held = _MEMORY.get(memo)
    if held is not None and held[0] == os.getpid() and not held[1].full:  # a forked child builds its own
        _MEMORY.put(memo, held, int(held[1].nbytes) + 256)  # counted again at each use: it grows
        return held[1]
    built = _new_lazy(spec, cache_dir)
    if built is None:
        return None
    _MEMORY.put(memo, (os.getpid(), built[0]), int(built[0].nbytes) + 256)
    return built[0]


# what deciding whether stop strings occur inside answers may read, in NFA moves, for one request (about
# 10-20 ms, and as many ints of memory at most): a thousand 10 KB stop strings that each live long inside a
# schema's free strings would cost seconds; past it the undecided ones count as occurring
OCCURS_MAX_STEPS = 5_000_000


def occurring(
    spec: ConstraintSpec, texts: list[bytes], *, cache_dir: Path | str | bool | None = None
) -> list[bool | None]:
    """Per text, whether its bytes occur inside some answer of ``spec`` (``LazyDfa.occurs``: exact, read
    off the NFA); None where not decided: within ``OCCURS_MAX_STEPS``, or for a constraint the automaton
    built as it is walked does not take (``lazy_automaton``: nesting past its depth, an NFA over the
    limit). Builds the NFA when this process has not (a fraction of the compile budget)."""
    lazy = lazy_automaton(spec, cache_dir=cache_dir) if texts else None
    if lazy is None:
        return [None] * len(texts)
    return [None if found < 0 else bool(found) for found in lazy.occurs(texts, OCCURS_MAX_STEPS)]


def check_constraint(spec: ConstraintSpec, *, cache_dir: Path | str | bool | None = None) -> None:
    """A frontend's check of a new constraint, without its automaton: conversion, then what its NFA
    would be (``_tree_facts``: within the limits, not empty), the tree kept for the engine
    (``words_for``), which builds the NFA itself; one whose NFA would not fit is checked by building
    it (``lazy_automaton``, which leaves it to the whole path), and one the lazy path does not take
    is built whole (``dfa_for``, with its narrower subsets, or refused there). ConstraintError when
    refused. The NFA's build time is not checked here: it is linear in the states the facts bound
    (about 0.1 s for 1.2M of the 2M allowed by default, against a 2 s budget), and the engine builds
    it within a whole budget; a row it could not build is ended, logged (``vllm_processor``)."""
    key = dfa_key(spec)
    if _MEMORY.get(("checked", key)) is not None and not _routed_whole(key, cache_dir):
        return
    if _tree_facts(spec, cache_dir, EVERY_BYTE) is None and lazy_automaton(spec, cache_dir=cache_dir) is None:
        dfa_for(spec, cache_dir=cache_dir)
    else:
        _MEMORY.put(("checked", key), True, 128)


def is_known(spec: ConstraintSpec) -> bool:
    """Whether this process has checked ``spec`` before, or refused it (not for time): its check is then answered
    from memory, in microseconds. Costs the key (the spec's canonical text hashed)."""
    key = dfa_key(spec)
    if _MEMORY.get(("checked", key)) is not None:
        return True
    return any(isinstance(_MEMORY.get(memo), ConstraintError) for memo in (("words", key), ("dfa", key, "native")))


def _tree_facts(
    spec: ConstraintSpec, cache_dir: Path | str | bool | None, usable: np.ndarray, *, check: bool = True
) -> TreeFacts | None:
    """The facts of the constraint's tree over the ``usable`` bytes (``regex.tree_facts``: its NFA's
    size and a shortest answer), from memory or found now: a frontend's check without building the
    NFA, which the engine builds in its own process. None when the lazy path does not take the
    constraint (``words_for``) or its NFA would not fit the limits (``lazy_automaton`` then decides,
    as it did before). ConstraintError, remembered, when the language is empty (asked over every
    byte) or the walk runs out of time; ``check`` False (the engine, serving what a check admitted):
    not remembered, as ``words_for``."""
    words = words_for(spec, cache_dir=cache_dir, check=check)
    if words is None:
        return None
    key = dfa_key(spec)
    memo = ("facts", key, np.asarray(usable, dtype=np.uint8).tobytes())
    facts: TreeFacts | None = _MEMORY.get(memo)
    if facts is None:
        cpu_started = time.thread_time()
        try:
            facts = tree_facts(words, usable)
            if facts.answer is None and facts.nfa_fits(limits()) and bool(np.all(usable)):
                raise ConstraintError(EMPTY_LANGUAGE)
        except ConstraintError as exc:
            if check:
                _remember(("words", key), ("words-over-time", key, limits().compile_ms), exc, cpu_started)
            raise
        _MEMORY.put(memo, facts, 256 + len(facts.answer or b""))
    return facts if facts.nfa_fits(limits()) else None


def serving_form(
    spec: Any,
    vocab: Vocab,
    *,
    cache_dir: Path | str | bool | None = None,
    within: int | None = None,
    tokens: list[int] | None = None,
) -> CompiledConstraint | LazyConstraint:
    """What a batch row is served from: the complete form when this process or the disk cache has
    it (``compile_constraint``); on a miss, a ``LazyConstraint`` (``lazy_form.py``), usable once the
    constraint's NFA and start row exist, while its complete form is built in the background and
    kept for later requests. ``within``: the answer must end within that many more tokens (end of
    sequence not counted) after ``tokens``, its output so far (a request coming back after
    preemption); a lazy form whose steering figure cannot keep it there gives way to the complete
    form, which steers by exact distances, when that can be built. A constraint the check admitted
    is served even when a later check would refuse it: refusals here are ``compile_constraint``'s
    for what the lazy path does not take."""
    spec = spec_from_request(spec)
    key, dkey = cache_key(spec, vocab), dfa_key(spec)
    path = None if cache_dir is False else _cache_root(cache_dir) / f"{key}.bin"
    memo = (key, id(vocab), str(path))
    if core is None:
        return compile_constraint(spec, vocab, cache_dir=cache_dir)
    if _held_form(memo, vocab) is not None or (path is not None and path.is_file()):
        return _steered_within(compile_constraint(spec, vocab, cache_dir=cache_dir), spec, cache_dir, within, tokens)
    if _routed_whole(dkey, cache_dir):
        try:  # the check built its whole automaton (dfa_for) for requests admitted since
            complete = compile_constraint(spec, vocab, cache_dir=cache_dir)
            return _steered_within(complete, spec, cache_dir, within, tokens)
        except ConstraintError:  # admitted before the route was taken: served as it was admitted
            pass
    lazy_memo = ("lazy-form", key, id(vocab))
    found = _MEMORY.get(lazy_memo)
    form = found if isinstance(found, LazyConstraint) and found.vocab is vocab and found.pid == os.getpid() else None
    words = None
    if form is None or form.lazy.exhausted:
        built = _new_lazy(spec, cache_dir, check=False)
        if built is None:
            return compile_constraint(spec, vocab, cache_dir=cache_dir)
        form, words = LazyConstraint(vocab, built[0], key), built[1]
    if within is not None and not _steers(form, spec, cache_dir, within, tokens):
        try:
            complete = compile_constraint(spec, vocab, cache_dir=cache_dir)
            return _steered_within(complete, spec, cache_dir, within, tokens)
        except ConstraintError as exc:  # a row cannot be refused here: steered as far as the figure allows
            log.warning(
                "constraint %s: served from its automaton built as it is walked, which may not end the answer "
                "within max_tokens; its complete form is refused: %s",
                key[:12],
                exc.message.splitlines()[0],
            )
    _MEMORY.put(lazy_memo, form, form.nbytes, weak=True)  # counted again at each use: it grows
    # queued at most once per process (a forked child has not got the parent's builder); again if
    # dropped from a full queue
    build = ("building", key, id(vocab), os.getpid())
    if _MEMORY.get(build) is None:
        words = words if words is not None else words_for(spec, cache_dir=cache_dir, check=False)
        if words is not None and _BUILDER.submit(
            functools.partial(_build_complete, vocab, key, dkey, words, path, memo, cache_dir)
        ):
            _MEMORY.put(build, "queued", 128)
    return form


def _steers(
    form: CompiledConstraint | LazyConstraint,
    spec: ConstraintSpec,
    cache_dir: Path | str | bool | None,
    within: int,
    tokens: list[int] | None,
) -> bool:
    """Whether steering ``form`` can end an answer within ``within`` more tokens after ``tokens``:
    by its own figures (``steerable_within``), else, for a new answer, along the tree's shortest
    answer, the one the check admitted the request by (``_tree_greedy``), recorded for steering."""
    if form.steerable_within(within, tokens or ()):
        return True
    if tokens:
        return False
    try:
        answer = _tree_answer(spec, cache_dir, form.vocab, check=False)
    except ConstraintError:  # its walk out of time on a loaded engine: not an answer to steer by
        return False
    return answer is not None and 0 <= form.add_answer(answer) <= within


def _steered_within(
    form: CompiledConstraint,
    spec: ConstraintSpec,
    cache_dir: Path | str | bool | None,
    within: int | None,
    tokens: list[int] | None,
) -> CompiledConstraint:
    """``form``, steering an answer after ``tokens`` to end within ``within`` more tokens: by its
    figures or one recorded answer (``_steers``), else by its exact distances from the disk cache (a
    check that needed them kept them there). Not computed here (seconds for a large schema, a stall
    of the engine's whole batch): without them the background search starts now and steering uses
    the figures until it ends, which may not end this answer within its budget (logged)."""
    if within is None or _steers(form, spec, cache_dir, within, tokens):
        return form
    key = cache_key(spec, form.vocab)
    dist = _known_distances(key, cache_dir, form.num_states)
    if dist is not None:
        form.distances = dist
        return form
    form.steering_distances()
    log.info(
        "constraint %s: steered by an upper bound until its exact distances are computed in the background; "
        "an answer may not end within its budget of %d more tokens",
        key[:12],
        within,
    )
    return form


def _build_complete(
    vocab: Vocab,
    key: str,
    dkey: str,
    words: NDArray[np.int32],
    path: Path | None,
    memo: tuple,
    cache_dir: Path | str | bool | None,
) -> None:
    """In the background: the complete form of a constraint served lazily, built from the same tree
    (native: no GIL held), held in memory for later requests and completed and cached as any new
    complete form is. A constraint whose whole automaton is over the state limit stays lazy, in
    full: the lazy path builds only the states answers reach. One whose whole automaton is over the
    time budget, CPU spent, takes the whole path at later checks (``_route_whole``): what the check
    did with it before the lazy path (a JSON schema's narrower subset, or a refusal)."""
    if _held_form(memo, vocab) is not None:
        return
    cpu_started = time.thread_time()
    try:
        dfa = compile_words(words, classes=True)
    except ConstraintError as exc:
        over_time = "time budget" in exc.message
        if over_time and (time.thread_time() - cpu_started) * 1000 >= limits().compile_ms / 2:
            _route_whole(dkey, cache_dir)
        log.info(
            "constraint %s: its whole automaton is not built (%s); it is served from the automaton built as "
            "it is walked%s",
            key[:12],
            exc.message.splitlines()[0],
            ", and checked whole from now on" if over_time else "",
        )
        return  # the "building" mark stays: the same build would fail the same way
    compiled = CompiledConstraint.lazy(vocab, dfa, key)
    _reuse_distances(compiled, key, cache_dir)
    _hold(memo, compiled)
    _MEMORY.discard(("lazy-form", key, id(vocab)))  # rows served from it hold their own reference
    _MEMORY.discard(("lazy-dfa", dkey))
    if path is not None:
        FINISHER.submit(compiled, path)


def _route_whole(key: str, cache_dir: Path | str | bool | None) -> None:
    """From now on, check the constraint ``key`` names whole (``dfa_for``, within this time budget),
    in this process and, through ``whole-<key>-<ms>.bin``, in the others sharing the disk cache:
    its whole automaton is over the time budget, and the automaton built as it is walked would cost
    it as much, row by row, on the batch's time. ``dfa_for`` serves a JSON schema's narrower subset
    or refuses, as the check did before the lazy path. Requests admitted already are served."""
    _MEMORY.put(("route-whole", key, limits().compile_ms), True, 128)
    _MEMORY.discard(("checked", key))
    _MEMORY.discard(("lazy-dfa", key))
    path = _route_path(key, cache_dir)
    if path is not None:
        try:
            write_arrays(path, path.stem, {}, {})
        except OSError as err:
            log.warning("constraint route not cached (%s): %s", path, err)


def _route_path(key: str, cache_dir: Path | str | bool | None) -> Path | None:
    return None if cache_dir is False else _cache_root(cache_dir) / f"whole-{key}-{limits().compile_ms}.bin"


def _routed_whole(key: str, cache_dir: Path | str | bool | None) -> bool:
    """Whether ``_route_whole`` was taken for ``key`` here or in another process: a stat per check."""
    memo = ("route-whole", key, limits().compile_ms)
    if _MEMORY.get(memo) is not None:
        return True
    path = _route_path(key, cache_dir)
    if path is None or not path.is_file():
        return False
    _MEMORY.put(memo, True, 128)
    return True


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
        budget_ms = limits().compile_ms
        whole = _MEMORY.get(("dfa", dfa_key(spec), "native"))
        on_lazy_path = not isinstance(whole, ByteDFA)
        greedy = _tree_greedy(spec, cache_dir, vocab) if on_lazy_path and within is not None else None
        fits = greedy is not None and within is not None and greedy <= within
        lazy = lazy_automaton(spec, cache_dir=cache_dir) if on_lazy_path and not fits else None
        if fits and greedy is not None:
            # one answer that fits, read off the tree: admitted without an automaton here (the engine
            # builds its own)
            found = Shortest(greedy, "at most")
        elif lazy is not None:
            # a search over the states it reaches: the whole automaton is not built for a check
            found = lazy_fewest_tokens(lazy, vocab, within=within, budget_ms=budget_ms)
        else:
            dfa = dfa_for(spec, cache_dir=cache_dir)
            dist = _known_distances(key, cache_dir, dfa.num_states)
            if dist is not None:
                return Shortest(int(dist[dfa.start]))
            table, classes = _columns(dfa)
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


def _tree_answer(
    spec: ConstraintSpec, cache_dir: Path | str | bool | None, vocab: Vocab, *, check: bool = True
) -> bytes | None:
    """A shortest answer read off the tree's facts (``_tree_facts``, same ``check``), without an
    NFA: over the bytes single tokens spell, else over any bytes. None when the facts do not serve."""
    facts = _tree_facts(spec, cache_dir, vocab.single_bytes, check=check)
    if facts is not None and facts.answer is None:
        facts = _tree_facts(spec, cache_dir, EVERY_BYTE, check=check)
    return None if facts is None else facts.answer


def _tree_greedy(spec: ConstraintSpec, cache_dir: Path | str | bool | None, vocab: Vocab) -> int | None:
    """``LazyDfa.greedy_tokens``' figure read off the tree (``_tree_answer`` cut into the longest
    tokens): an upper bound of the fewest. None when the facts do not serve or a byte of the answer
    starts no token. The engine steers by the same answer when its budget needs it (``_steers``)."""
    answer = _tree_answer(spec, cache_dir, vocab)
    if answer is None:
        return None
    cut = int(native_vocab(vocab).longest_cut(answer))
    return cut if cut >= 0 else None


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
    until its own background search has them, or along one shortest answer cut into the longest
    tokens where the budget is below that figure (``serving_form``, ``_steers``); where neither
    fits ``within`` it could not keep the answer within max_tokens. None when a bound is enough or
    they are kept already."""
    bound_memo = ("start-bound", key)
    bound: int | None = _MEMORY.get(bound_memo)
    if bound is None:
        greedy: int | None
        facts = _tree_facts(spec, cache_dir, vocab.single_bytes) if dfa is None else None
        lazy = lazy_automaton(spec, cache_dir=cache_dir) if dfa is None and facts is None else None
        if facts is not None:  # the same figures, read off the tree
            bound = len(facts.answer) if facts.answer is not None else UNREACHABLE
            greedy = _tree_greedy(spec, cache_dir, vocab)
        elif lazy is not None:  # the same figures, read off the NFA
            bound = int(lazy.byte_distance(0, vocab.single_bytes.view(np.uint8)))
            try:
                greedy = int(lazy.greedy_tokens(native_vocab(vocab), 0))
            except ValueError:  # the automaton's limits on the way: the single-byte figure decides
                greedy = None
        else:
            dfa = dfa or dfa_for(spec, cache_dir=cache_dir)
            table, classes = _columns(dfa)
            bound = int(byte_distances(table, dfa.accept, vocab.single_bytes, classes)[dfa.start])
            greedy = int(core.greedy_tokens(native_vocab(vocab), table, dfa.accept, dfa.start, classes)) if core else -1
        if greedy is not None and greedy >= 0:
            bound = min(bound, greedy)
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
    _keep_form(memo, mem)
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


def load_cached(spec: Any, vocab: Vocab, cache_dir: Path | str | None = None) -> CompiledConstraint | None:
    """The compiled form from the disk cache only (None on a miss)."""
    spec = spec_from_request(spec)
    return read_cache(_cache_root(cache_dir) / f"{cache_key(spec, vocab)}.bin", vocab)
