"""The on-disk cache of complete compiled forms.

A form is stored under ``<cache>/constraints/<digest>.bin`` where the digest is sha256 over (format
version, canonical constraint, vocabulary digest). The file is a small JSON header followed by the
arrays, each 64-byte aligned, so that a hit memory-maps the file and uses it in place (no parsing,
no copy). Files are written to a temporary name and renamed: a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from llmserve.constraints.compiled import CompiledConstraint
from llmserve.constraints.spec import ConstraintSpec
from llmserve.constraints.vocab import Vocab

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MAGIC = b"LLMSCST1"
_ALIGN = 64


def default_cache_dir() -> Path:
    root = os.environ.get("LLMSERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmserve")
    return Path(root) / "constraints"


def cache_key(spec: ConstraintSpec, vocab: Vocab) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION}\0{spec.canonical}\0{vocab.digest}".encode())
    return h.hexdigest()


def is_valid_key(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{64}", text))


def write_cache(path: Path, c: CompiledConstraint) -> None:
    """Write ``c``, which must be complete (the callers make sure: a lazy form's rows hold garbage)."""
    arrays: list[tuple[str, np.ndarray]] = [("table", c.table), ("accept", c.accept), ("masks", c.mask_buffer)]
    header: dict[str, Any] = {"start": c.start, "key": c.key, "arrays": {}}
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


def try_write_cache(path: Path, compiled: CompiledConstraint) -> None:
    """``write_cache``, logging instead of raising: a read-only or full cache never fails a request."""
    try:
        write_cache(path, compiled)
    except OSError as exc:
        log.warning("constraint cache not written (%s): %s", path, exc)


def read_cache(path: Path, vocab: Vocab) -> CompiledConstraint | None:
    """The form stored at ``path`` over a read-only memory map, or None (missing, corrupt, or for
    another vocabulary width)."""
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
