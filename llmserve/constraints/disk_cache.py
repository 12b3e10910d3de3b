"""The on-disk cache of compiled constraints (complete mask tables) and of their automata.

A compiled form is stored under ``<cache>/constraints/<key>.bin``, its automaton (what frontend
validation builds, so that the engine process does not build it again) under ``dfa-<digest>.bin``.
The key is sha256 over (format version, canonical constraint, vocabulary digest).

File layout: magic (8 bytes), header length (8), checksum (8), a JSON header (the key, the arrays'
dtypes, shapes and offsets, the payload size), zero padding to 64 bytes, then the arrays, each
64-byte aligned. The checksum (csrc/checksum.h) covers the header and the payload; a load checks
the magic, the exact file size, the key and the checksum, and a file that fails is ignored with a
warning (the caller recompiles and rewrites it). Files are written to a temporary name and
renamed: a reader never sees half a file from us.

A hit is read into memory (one copy) rather than memory-mapped: a file truncated or rewritten in
place by someone else while mapped would kill the process with SIGBUS on the next mask fill, and
could change masks under a running request. The copy and the checksum cost about as much as
reading the file from the page cache (see benchmarks/constraints).

The folder is bounded in bytes (``LLMSERVE_CONSTRAINT_DISK_CACHE_MB``): after each write the least
recently used files (by modification time, which a hit refreshes) are deleted until the total fits.
Deleting a file never affects a running request, which holds its own copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from llmserve.constraints.comb import Comb
from llmserve.constraints.compiled import CompiledConstraint
from llmserve.constraints.limits import limits
from llmserve.constraints.native import native as core
from llmserve.constraints.native import native_vocab
from llmserve.constraints.regex import ByteDFA
from llmserve.constraints.spec import ConstraintSpec
from llmserve.constraints.vocab import Vocab

log = logging.getLogger(__name__)

# 3: mask rows stored compressed (row_of, off, kind, data; csrc/grammar.h) instead of dense
# 4: the automaton as byte classes (classes uint8[256], table int32[S, C]; csrc/vocab_trie.h)
# 5: a row may be held as a delta of an earlier one (kind 4), and the class columns as int16 where
#    the automaton has at most 32,767 states: an older reader refuses both
# 6: a compressed form's class columns packed as a comb (comb_base int32[S], comb_slots [N, 2];
#    csrc/comb.h) instead of the columns themselves
FORMAT_VERSION = 6
_MAGIC = b"LLMSCST6"
_FIXED = 24  # magic, header length, checksum
_ALIGN = 64
_M64 = (1 << 64) - 1
_K1, _K2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F


def default_cache_dir() -> Path:
    root = os.environ.get("LLMSERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmserve")
    return Path(root) / "constraints"


def cache_key(spec: ConstraintSpec, vocab: Vocab) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION}\0{spec.canonical}\0{vocab.digest}".encode(errors="surrogatepass"))
    return h.hexdigest()


def dfa_key(spec: ConstraintSpec) -> str:
    """The automaton's key: the constraint alone (an automaton does not depend on the vocabulary)."""
    return "dfa-" + hashlib.sha256(f"v{FORMAT_VERSION}\0{spec.canonical}".encode(errors="surrogatepass")).hexdigest()


def is_valid_key(text: str) -> bool:
    return bool(re.fullmatch(r"(dfa-)?[0-9a-f]{64}", text))


# ---- checksum ---------------------------------------------------------------------------------


_K3, _K4 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _term(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(32))) * _K3
    return z ^ (z >> np.uint64(29))


def _finish(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _K3
    z = (z ^ (z >> np.uint64(27))) * _K4
    return z ^ (z >> np.uint64(31))


def checksum_numpy(data: bytes | np.ndarray, seed: int = 0) -> int:
    """The core's checksum (definition in csrc/checksum.h) in numpy, for builds without the core."""
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else np.ascontiguousarray(data).view(np.uint8)
    raw = raw.reshape(-1)
    n = raw.shape[0]
    padded = np.zeros((n + 7) // 8 * 8, dtype=np.uint8)
    padded[:n] = raw
    words = padded.view("<u8").astype(np.uint64)
    idx = np.arange(words.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        terms = _term((words ^ (idx * np.uint64(_K1))) + np.uint64(seed & _M64))
        h = int(terms.sum(dtype=np.uint64))
        return int(_finish(np.array([(h ^ (n * _K2)) & _M64], dtype=np.uint64))[0])


def checksum(data: bytes | np.ndarray, seed: int = 0) -> int:
    if core is not None:
        return core.checksum(data, seed)
    return checksum_numpy(data, seed)


# ---- write ------------------------------------------------------------------------------------


def write_arrays(path: Path, key: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write ``arrays`` (and the JSON-able ``meta``) under ``path``, atomically, then trim the folder
    to its budget."""
    header: dict[str, Any] = {**meta, "key": key, "arrays": {}}
    offset = 0
    contiguous = []
    for name, a in arrays.items():
        data = np.ascontiguousarray(a)
        contiguous.append(data)
        header["arrays"][name] = {"dtype": data.dtype.str, "shape": list(data.shape), "offset": offset}
        offset += (data.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    header["payload"] = offset
    if offset > limits().disk_cache_bytes:
        return  # never fits: writing it would only evict everything else
    hjson = json.dumps(header).encode()
    head_len = (_FIXED + len(hjson) + _ALIGN - 1) // _ALIGN * _ALIGN
    head = hjson + b"\0" * (head_len - _FIXED - len(hjson))
    total = checksum(head)
    payload = []
    for data in contiguous:
        payload.append(data)
        pad = (-data.nbytes) % _ALIGN
        if pad:
            payload.append(np.zeros(pad, np.uint8))
    # the checksum of the payload as one buffer: chained over the pieces in file order
    body = np.concatenate([p.reshape(-1).view(np.uint8) for p in payload]) if payload else np.zeros(0, np.uint8)
    total = checksum(body, total)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + head_len.to_bytes(8, "little") + total.to_bytes(8, "little") + head)
            f.write(body.data)  # no copy; the GIL is released during the write itself
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    trim(path.parent, limits().disk_cache_bytes, keep=path)


def trim(folder: Path, budget: int, keep: Path | None = None) -> int:
    """Delete the least recently used cache files of ``folder`` until they total ``budget`` bytes or
    less (``keep`` last of all). Returns the bytes deleted. Files another process deletes first are
    skipped."""
    entries = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(".bin") and not e.name.startswith(".tmp-"):
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    entries.append((e.path == str(keep), st.st_mtime_ns, st.st_size, e.path))
    except OSError:
        return 0
    total = sum(size for _, _, size, _ in entries)
    freed = 0
    for _, _, size, p in sorted(entries):
        if total - freed <= budget:
            break
        try:
            os.unlink(p)
        except OSError:
            continue
        freed += size
    return freed


_ROWS = ("row_of", "off", "kind", "data")


def write_cache(path: Path, c: CompiledConstraint) -> None:
    """Write ``c``, which must be complete (the callers make sure: a lazy form's rows hold garbage),
    with its rows compressed (a dense form, e.g. the Python backend's, is compressed for the file)."""
    if not c.compressed:
        if core is None:
            return  # without the core a file could not be read back either
        # a dense form (the Python backend's): compressed for the file by a copy over the core
        c = CompiledConstraint(c.vocab, c.table, c.accept, c.masks, c.start, c.key).compress()
    rows, transitions = c.compressed_rows, c.transitions
    assert rows is not None and transitions is not None
    classes, comb = transitions
    assert isinstance(comb, Comb)
    arrays: dict[str, np.ndarray] = {
        "classes": classes,
        "comb_base": comb.base,
        "comb_slots": comb.slots,
        "accept": c.accept,
    }
    arrays.update(zip(_ROWS, rows, strict=True))
    write_arrays(path, c.key, arrays, {"start": c.start})


def try_write_cache(path: Path, compiled: CompiledConstraint) -> None:
    """``write_cache``, logging instead of raising: a read-only or full cache never fails a request."""
    try:
        write_cache(path, compiled)
    except OSError as exc:
        log.warning("constraint cache not written (%s): %s", path, exc)


def try_write_dfa(path: Path, key: str, dfa: ByteDFA) -> None:
    if dfa.transitions is not None:  # the smaller form, as built
        classes, columns = dfa.transitions
        arrays = {"classes": classes, "columns": columns, "accept": dfa.accept}
    else:
        arrays = {"table": dfa.table, "accept": dfa.accept}
    try:
        write_arrays(path, key, arrays, {"start": dfa.start})
    except OSError as exc:
        log.warning("constraint cache not written (%s): %s", path, exc)


# ---- read -------------------------------------------------------------------------------------


class _Corrupt(Exception):
    """A cache file that exists but fails a check: ignored with a warning."""


def read_arrays(path: Path, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(header, arrays) of the file at ``path`` stored under ``key``, read into memory and verified;
    None when missing or when it fails a check (then with a warning: it will be rebuilt)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the early returns keep it readable
    except OSError:
        return None
    try:
        with f:
            result = _read_verified(f, key)
        try:
            os.utime(path)  # a hit: most recently used (the disk budget evicts by this time)
        except OSError:
            pass
        return result
    except _Corrupt as exc:
        log.warning("constraint cache file %s ignored (%s); it will be rebuilt", path, exc)
        return None
    except OSError as exc:
        log.warning("constraint cache file %s not read (%s)", path, exc)
        return None


def _read_verified(f, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    size = os.fstat(f.fileno()).st_size
    fixed = f.read(_FIXED)
    if len(fixed) < _FIXED or fixed[:8] != _MAGIC:
        raise _Corrupt("not a cache file of this version")
    head_len = int.from_bytes(fixed[8:16], "little")
    expect = int.from_bytes(fixed[16:24], "little")
    if not _FIXED <= head_len <= min(size, 1 << 20):
        raise _Corrupt("bad header length")
    head = f.read(head_len - _FIXED)
    try:
        header = json.loads(head.rstrip(b"\0"))
        payload = int(header["payload"])
        arrays_meta = header["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _Corrupt(f"bad header: {exc}") from None
    if size != head_len + payload:
        raise _Corrupt(f"size {size}, header says {head_len + payload}")
    if header.get("key") != key:
        raise _Corrupt("stored under another key")
    body = np.empty(payload, dtype=np.uint8)
    if f.readinto(body.data) != payload:
        raise _Corrupt("shorter than its header says")
    if checksum(body, checksum(head)) != expect:
        raise _Corrupt("checksum mismatch")
    try:
        out = {}
        for name, meta in arrays_meta.items():
            dt = np.dtype(meta["dtype"])
            shape = tuple(int(x) for x in meta["shape"])
            out[name] = np.frombuffer(body, dtype=dt, count=int(np.prod(shape)), offset=int(meta["offset"])).reshape(
                shape
            )
    except (ValueError, KeyError, TypeError) as exc:
        raise _Corrupt(f"bad array layout: {exc}") from None
    return header, out


def read_cache(path: Path, vocab: Vocab) -> CompiledConstraint | None:
    """The complete form stored at ``path`` (its name is its key), or None (missing, corrupt, or for
    another vocabulary width)."""
    found = read_arrays(path, path.stem)
    if found is None:
        return None
    header, a = found
    for array in a.values():  # the core checks every index once, then reads them unchecked
        array.flags.writeable = False
    try:
        classes, accept, start = a["classes"], a["accept"], int(header["start"])
        comb = Comb(a["comb_base"], a["comb_slots"])
        rows = (a["row_of"], a["off"], a["kind"], a["data"])
    except (KeyError, ValueError, TypeError):
        log.warning("constraint cache file %s ignored (arrays missing); it will be rebuilt", path)
        return None
    if core is None or comb.base.ndim != 1 or accept.shape != comb.base.shape:
        return None
    try:  # checks every index of the compressed rows and the comb
        g = core.Grammar.compressed(native_vocab(vocab), classes, comb, accept, *rows, start)
        return CompiledConstraint.from_compressed(vocab, g, accept, header["key"])
    except (ValueError, TypeError) as exc:  # the checksum passed, so written by another version or vocabulary
        log.warning("constraint cache file %s ignored (%s); it will be rebuilt", path, exc)
        return None


def read_dfa(path: Path) -> ByteDFA | None:
    found = read_arrays(path, path.stem)
    if found is None:
        return None
    header, a = found
    dfa = _dfa_of(header, a)
    if dfa is None:
        log.warning("constraint cache file %s ignored (arrays missing or out of range); it will be rebuilt", path)
    return dfa


def _dfa_of(header: dict[str, Any], a: dict[str, np.ndarray]) -> ByteDFA | None:
    """The automaton a file holds, in either form (byte table, or byte classes and their columns),
    or None unless every array has the shape, type and range the rest of the code relies on (a file
    that passed its checksum may still come from another version, or be crafted)."""
    accept, classes = a.get("accept"), a.get("classes")
    table = a.get("table") if classes is None else a.get("columns")
    if table is None or accept is None or table.ndim != 2 or table.dtype != np.int32 or accept.dtype != np.uint8:
        return None
    states, width = table.shape
    start = header.get("start", 0)
    if accept.shape != (states,) or not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < states:
        return None
    if classes is None:
        if width != 256:
            return None
    elif not (
        1 <= width <= 256 and classes.shape == (256,) and classes.dtype == np.uint8 and int(classes.max()) < width
    ):
        return None
    if table.size and (int(table.min()) < -1 or int(table.max()) >= states):
        return None
    return ByteDFA(table, accept, start, classes=classes)
