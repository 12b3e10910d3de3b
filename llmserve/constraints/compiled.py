"""Constraint specs, compilation against a vocabulary, and the on-disk cache of compiled forms.

A constraint compiles in two stages: the spec becomes a byte-level DFA (``regex.py``,
``jsonschema.py``; built by the C++ core), then the DFA is compiled against the tokenizer's
vocabulary into one packed bitmask row per DFA state (``masks[s]``: the tokens allowed in state s).
At decode time a row's state advances by walking the sampled token's bytes through the DFA, and the
mask fill is one copy of ``masks[state]``: cost per row is flat, whatever the constraint.

Mask rows are computed lazily: ``compile_constraint`` returns once the DFA and the start state's
row exist (a new constraint is usable within about a millisecond), a row is computed the first time
a batch row needs it, and a background thread computes the rest and then writes the disk cache.
``CompiledConstraint.complete()`` waits for all of it.

Compiled forms are cached on disk under ``<cache>/constraints/<digest>.bin`` where the digest is
sha256 over (format version, canonical constraint, vocabulary digest). Only complete forms are
written. A cache hit memory-maps the file (no parsing, no copy).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import mmap
import os
import re as _re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmserve.constraints import reference
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.jsonschema import schema_to_ast
from llmserve.constraints.regex import ByteDFA, compile_ast, literal, parse
from llmserve.constraints.vocab import Vocab

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Larger constraints (e.g. 20k states over a 128k vocabulary: 320 MiB) are neither completed in the
# background nor cached: only the rows requests actually reach are computed.
MAX_COMPLETE_BYTES = int(os.environ.get("LLMSERVE_CONSTRAINT_COMPLETE_MAX_MB", "256")) << 20
KINDS = ("regex", "choice", "json_schema", "automaton")

try:  # the native core, built by the package build (CMakeLists.txt)
    from llmserve.constraints import _core as native
except ImportError as exc:  # pragma: no cover - only when the extension was not built
    native = None
    NATIVE_IMPORT_ERROR = exc
else:
    NATIVE_IMPORT_ERROR = None


def require_native():
    if native is None:
        raise ConstraintError(
            f"the native constraint core is not built ({NATIVE_IMPORT_ERROR})",
            hint="Reinstall llmserve from source: pip install --no-deps --no-build-isolation -e .",
        )
    return native


@dataclass(frozen=True)
class ConstraintSpec:
    """One constraint: ``kind`` in regex | choice | json_schema, ``value`` its pattern, list of
    strings or schema."""

    kind: str
    value: Any

    def __post_init__(self):
        if self.kind not in KINDS[:3]:
            raise ConstraintError(f"unknown constraint kind {self.kind!r} (one of: regex, choice, json_schema)")
        if self.kind == "regex" and not isinstance(self.value, str):
            raise ConstraintError("regex must be a string")
        if self.kind == "choice" and (
            not isinstance(self.value, (list, tuple))
            or not self.value
            or not all(isinstance(c, str) for c in self.value)
        ):
            raise ConstraintError("choice must be a non-empty list of strings")
        if self.kind == "json_schema" and isinstance(self.value, str):
            try:
                object.__setattr__(self, "value", json.loads(self.value))
            except json.JSONDecodeError as exc:
                raise ConstraintError(f"json_schema is not valid JSON: {exc}") from None
        if self.kind == "json_schema" and not isinstance(self.value, dict):
            raise ConstraintError("json_schema must be a JSON object")

    @property
    def canonical(self) -> str:
        value = list(self.value) if self.kind == "choice" else self.value
        return json.dumps(
            {"kind": self.kind, "value": value}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical.encode()).hexdigest()

    def to_ast(self):
        if self.kind == "regex":
            return parse(self.value)
        if self.kind == "choice":
            return ("alt", [literal(c) for c in self.value])
        return schema_to_ast(self.value)

    def to_dfa(self, backend: str = "native") -> ByteDFA:
        return compile_ast(self.to_ast(), backend)


def spec_from_request(obj) -> ConstraintSpec:
    """From the request form: ``{"regex": "..."}``, ``{"choice": [...]}``, ``{"json_schema": {...}}``
    (exactly one key), or ``{"kind": ..., "value": ...}``."""
    if isinstance(obj, ConstraintSpec):
        return obj
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"constraint is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ConstraintError('constraint must be an object such as {"regex": "[0-9]+"}')
    if set(obj) == {"kind", "value"}:
        return ConstraintSpec(obj["kind"], obj["value"])
    keys = [k for k in obj if k in KINDS[:3]]
    if len(keys) != 1 or len(obj) != 1:
        raise ConstraintError(f"constraint must have exactly one of: regex, choice, json_schema; got {sorted(obj)}")
    return ConstraintSpec(keys[0], obj[keys[0]])


class CompiledConstraint:
    """A DFA compiled against one vocabulary: ``table`` int32[S,256], ``accept`` uint8[S],
    ``masks`` uint32[S+1, W] (row S: the dead row, end of sequence only), start state 0.

    ``ready=False``: the mask rows are filled in lazily by the native core (see the module doc);
    ``masks`` then waits for all of them, ``allowed(s)`` computes just row s.
    """

    def __init__(
        self,
        vocab: Vocab,
        table: np.ndarray,
        accept: np.ndarray,
        masks: np.ndarray,
        start: int = 0,
        key: str = "",
        ready: bool = True,
    ):
        self.vocab = vocab
        self.table = table
        self.accept = accept
        self._masks = masks
        self.start = int(start)
        self.key = key
        self._ready = ready
        self._native = None
        self._finished: threading.Event | None = None  # set by the background finisher

    @classmethod
    def lazy(cls, vocab: Vocab, dfa: ByteDFA, key: str = "") -> CompiledConstraint:
        """Only the start state's and the dead row are computed now."""
        table = np.ascontiguousarray(dfa.table, dtype=np.int32)
        accept = np.ascontiguousarray(dfa.accept, dtype=np.uint8)
        # uninitialised: the core writes a whole row before marking it ready, and nothing reads a
        # row before that (``allowed`` and fills ensure it, ``masks`` and the cache wait for all)
        masks = np.empty((table.shape[0] + 1, vocab.words), dtype=np.uint32)
        c = cls(vocab, table, accept, masks, dfa.start, key, ready=False)
        c.native.ensure(c.start)
        return c

    @property
    def num_states(self) -> int:
        return int(self.table.shape[0])

    @property
    def native(self):
        """The ``_core.Grammar`` over the same buffers (built once)."""
        if self._native is None:
            core = require_native()
            self._native = core.Grammar(
                native_vocab(self.vocab), self.table, self.accept, self._masks, self.start, self._ready
            )
        return self._native

    @property
    def masks(self) -> np.ndarray:
        """Every state's mask row (waits for lazily computed rows)."""
        self.complete()
        return self._masks

    def complete(self) -> CompiledConstraint:
        """Compute every mask row not computed yet; wait for the background cache writer if any."""
        if self._finished is not None and threading.current_thread() is not _FINISHER.thread:
            self._finished.wait()
        if not self._ready:
            self.native.complete()
            self._ready = True
        return self

    def step(self, state: int, token: int) -> int:
        """Next state after ``token`` (-1: the token was not allowed)."""
        return reference.step(self.vocab, self.table, self.accept, state, token)

    def walk(self, tokens, state: int | None = None) -> int:
        s = self.start if state is None else state
        for t in tokens:
            s = self.step(s, t)
        return s

    def allowed(self, state: int) -> np.ndarray:
        """Boolean [vocab.size] of the tokens allowed in ``state``."""
        if not self._ready:
            self.native.ensure(state)
        row = self._masks[state if state >= 0 else self.num_states]
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")
        return bits[: self.vocab.size].astype(bool)

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and bool(self.accept[state])


_NATIVE_VOCABS: dict[int, Any] = {}


def native_vocab(vocab: Vocab):
    """The ``_core.Vocab`` for ``vocab`` (built once per Vocab object)."""
    nv = getattr(vocab, "_native", None)
    if nv is None:
        core = require_native()
        offsets, data = vocab.packed()
        nv = core.Vocab(offsets, data, list(vocab.eos_ids), vocab.size)
        object.__setattr__(vocab, "_native", nv)
    return nv


def compile_dfa(dfa: ByteDFA, vocab: Vocab, *, backend: str = "native", key: str = "") -> CompiledConstraint:
    table = np.ascontiguousarray(dfa.table, dtype=np.int32)
    accept = np.ascontiguousarray(dfa.accept, dtype=np.uint8)
    if backend == "native":
        masks = require_native().compile_masks(native_vocab(vocab), table, accept)
    elif backend == "python":
        masks = reference.compile_masks(vocab, table, accept)
    else:
        raise ValueError(f"backend must be native or python, not {backend!r}")
    return CompiledConstraint(vocab, table, accept, masks, dfa.start, key)


# ---------------------------------------------------------------------------------------- cache

_MAGIC = b"LLMSCST1"
_ALIGN = 64


def default_cache_dir() -> Path:
    root = os.environ.get("LLMSERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmserve")
    return Path(root) / "constraints"


def cache_key(spec: ConstraintSpec, vocab: Vocab) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION}\0{spec.canonical}\0{vocab.digest}".encode())
    return h.hexdigest()


def _write_cache(path: Path, c: CompiledConstraint) -> None:
    arrays = [("table", c.table), ("accept", c.accept), ("masks", c._masks)]  # complete: see the callers
    header = {"start": c.start, "key": c.key, "arrays": {}}
    offset = 0
    for name, a in arrays:
        header["arrays"][name] = {"dtype": a.dtype.str, "shape": list(a.shape), "offset": offset}
        offset += (a.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    hjson = json.dumps(header).encode()
    head_len = (len(_MAGIC) + 8 + len(hjson) + _ALIGN - 1) // _ALIGN * _ALIGN
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + head_len.to_bytes(8, "little") + hjson)
            f.write(b"\0" * (head_len - len(_MAGIC) - 8 - len(hjson)))
            for _, a in arrays:
                data = np.ascontiguousarray(a)
                f.write(data.data)  # no copy; the GIL is released during the write itself
                f.write(b"\0" * ((-data.nbytes) % _ALIGN))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_cache(path: Path, vocab: Vocab) -> CompiledConstraint | None:
    try:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        if mm[:8] != _MAGIC:
            return None
        head_len = int.from_bytes(mm[8:16], "little")
        hjson = bytes(mm[16:head_len]).rstrip(b"\0")
        header = json.loads(hjson)
        out = {}
        for name, meta in header["arrays"].items():
            dt = np.dtype(meta["dtype"])
            shape = tuple(meta["shape"])
            count = int(np.prod(shape))
            out[name] = np.frombuffer(mm, dtype=dt, count=count, offset=head_len + meta["offset"]).reshape(shape)
        if out["masks"].shape[1] != vocab.words or out["masks"].shape[0] != out["table"].shape[0] + 1:
            return None
        return CompiledConstraint(vocab, out["table"], out["accept"], out["masks"], header["start"], header["key"])
    except (ValueError, KeyError, json.JSONDecodeError):
        return None


_MEMORY: dict[tuple[str, int], CompiledConstraint] = {}


def compile_constraint(
    spec, vocab: Vocab, *, cache_dir: Path | str | bool | None = None, backend: str = "native"
) -> CompiledConstraint:
    """Compile ``spec`` (a ConstraintSpec or its request form) against ``vocab``.

    ``cache_dir``: None for the default (``$LLMSERVE_CACHE/constraints``), a path, or False to skip
    the disk cache. Results are also memoised in memory per (digest, vocab object).
    """
    if backend not in ("native", "python"):
        raise ValueError(f"backend must be native or python, not {backend!r}")
    spec = spec_from_request(spec)
    key = cache_key(spec, vocab)
    path = None if cache_dir is False else Path(cache_dir or default_cache_dir()) / f"{key}.bin"
    memo = (key, id(vocab), str(path))
    mem = _MEMORY.get(memo)
    if mem is not None and mem.vocab is vocab:
        return mem
    if path is not None:
        hit = _read_cache(path, vocab)
        if hit is not None:
            _MEMORY[memo] = hit
            return hit
    if backend == "python":
        compiled = compile_dfa(spec.to_dfa("python"), vocab, backend="python", key=key)
        if path is not None:
            _try_write_cache(path, compiled)
    else:
        compiled = CompiledConstraint.lazy(vocab, spec.to_dfa(), key)
        if path is not None and compiled._masks.nbytes <= MAX_COMPLETE_BYTES:
            _FINISHER.submit(compiled, path)
        elif path is not None:
            log.info(
                "constraint %s: %d states x %d tokens is %d MiB of masks; computing only the rows "
                "requests reach, not caching it",
                key[:12],
                compiled.num_states,
                vocab.size,
                compiled._masks.nbytes >> 20,
            )
    _MEMORY[memo] = compiled
    while len(_MEMORY) > 256:
        _MEMORY.pop(next(iter(_MEMORY)))
    return compiled


def _try_write_cache(path: Path, compiled: CompiledConstraint) -> None:
    try:
        _write_cache(path, compiled)
    except OSError as exc:  # a read-only or full cache never fails a request
        log.warning("constraint cache not written (%s): %s", path, exc)


class _Finisher:
    """Completes lazily compiled constraints in the background and writes their cache files.

    One thread per process waits inside the native core (``finished_next``, without the GIL) and
    computes the remaining rows there, alone (the pool stays free for batch fills); it only takes
    the GIL once a constraint is complete, to write its file. Queueing is a native call, so it adds
    nothing to the compile that queues: no thread to start, no GIL handoff."""

    EXIT_WAIT_S = 30.0

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[CompiledConstraint, Path]] = {}  # also keeps the buffers alive
        self._next_id = 0
        self.thread: threading.Thread | None = None

    def submit(self, compiled: CompiledConstraint, path: Path) -> None:
        compiled._finished = threading.Event()
        with self._lock:
            self._next_id += 1
            job = self._next_id
            self._pending[job] = (compiled, path)
            if self.thread is None or not self.thread.is_alive():  # first use, or a forked child
                self.thread = threading.Thread(target=self._run, name="llmserve-constraint-cache", daemon=True)
                self.thread.start()
        compiled.native.finish_later(job)

    def _run(self) -> None:
        core = require_native()
        while True:
            job = core.finished_next()
            with self._lock:
                entry = self._pending.get(job)
            if entry is None:  # an id this process does not know: nothing to write
                continue
            compiled, path = entry
            try:
                compiled._ready = True
                _try_write_cache(path, compiled)
            except Exception:
                log.exception("writing the cache of constraint %s failed", compiled.key)
            finally:
                compiled._finished.set()
                with self._lock:
                    del self._pending[job]

    def wait_all(self, timeout: float) -> None:
        """At exit: let pending cache files be written rather than leave temporary ones behind."""
        deadline = time.monotonic() + timeout
        with self._lock:
            pending = [c for c, _ in self._pending.values()]
        for c in pending:
            c._finished.wait(max(0.0, deadline - time.monotonic()))


_FINISHER = _Finisher()
atexit.register(_FINISHER.wait_all, _Finisher.EXIT_WAIT_S)


def load_cached(spec, vocab: Vocab, cache_dir: Path | str | None = None) -> CompiledConstraint | None:
    """The compiled form from the disk cache only (None on a miss)."""
    spec = spec_from_request(spec)
    return _read_cache(Path(cache_dir or default_cache_dir()) / f"{cache_key(spec, vocab)}.bin", vocab)


def is_valid_key(text: str) -> bool:
    return bool(_re.fullmatch(r"[0-9a-f]{64}", text))
