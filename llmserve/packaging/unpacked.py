"""Check that an unpacked package folder still holds exactly what was verified when it was unpacked.

The local cache is reused across runs, so its folders are as trustworthy as everything else that
can write to them. Reuse therefore re-checks each folder against the digest index of the archive
being opened (never against the folder's own copy of it):

- the folder must be a real directory owned by this user and writable by no one else;
- it must hold exactly the indexed files (plus the index and the unpack record): any extra,
  missing, linked or special file fails the check;
- code and small files are rehashed every time; safetensors weights, which cannot run code and are
  the bulk of the bytes, are rehashed only when their size, mtime, ctime or inode differ from the
  record written at unpack.

`__pycache__` folders are not package content: Python writes them beside imported plugin code. They
are reported so that the caller can remove them before use, since a planted .pyc would run instead
of the verified source.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from llmserve.packaging.archive import (
    DIGESTS_NAME,
    RECORD_NAME,
    RESERVED_NAMES,
    PackageIndex,
    index_bytes,
    stat_key,
)

_BYTECODE_DIR = "__pycache__"
_CHUNK = 1 << 20
_MAX_RECORD_BYTES = 64 << 20


@dataclass
class UnpackedCheck:
    problem: str | None = None
    rehashed: int = 0
    trusted_by_record: int = 0
    stale_record: bool = False  # metadata moved but content matched: the record should be rewritten
    bytecode_dirs: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem is None

    def summary(self) -> str:
        if self.problem:
            return self.problem
        return (
            f"{self.rehashed} file(s) rehashed, {self.trusted_by_record} safetensors file(s) unchanged since "
            "unpack (size, mtime, ctime, inode)"
        )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _owner_problem(root: Path, st: os.stat_result) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return f"{root} is not a plain folder (a link or a file)"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"{root} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{root} is writable by other users (mode {stat.filemode(st.st_mode)})"
    return None


def _scan(root: Path, check: UnpackedCheck) -> set[str] | None:
    """Relative paths of the regular files under root; None (with check.problem set) on anything else."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for d in list(dirnames):
            if (here / d).is_symlink():
                check.problem = f"{here / d} is a link; unpacked packages hold regular files only"
                return None
            if d == _BYTECODE_DIR:
                check.bytecode_dirs.append(here / d)
                dirnames.remove(d)
        for fn in filenames:
            p = here / fn
            if not stat.S_ISREG(os.lstat(p).st_mode):
                check.problem = f"{p} is not a regular file"
                return None
            found.add(p.relative_to(root).as_posix())
    return found


def _load_record(root: Path, index: PackageIndex) -> dict | None:
    path = root / RECORD_NAME
    try:
        if path.stat().st_size > _MAX_RECORD_BYTES:
            return None
        body = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("digest") != index.digest or not isinstance(body.get("files"), dict):
        return None
    return body["files"]


def _check_file(
    root: Path, name: str, expected_sha: str, expected_size: int, rec: object, check: UnpackedCheck
) -> None:
    path = root.joinpath(*name.split("/"))
    st = os.lstat(path)
    if st.st_size != expected_size:
        check.problem = (
            f"'{name}' was changed since it was unpacked ({st.st_size} bytes, the package says {expected_size})"
        )
        return
    if (
        name.endswith(".safetensors")
        and isinstance(rec, dict)
        and rec.get("sha256") == expected_sha
        and {k: rec.get(k) for k in stat_key(st)} == stat_key(st)
    ):
        check.trusted_by_record += 1
        return
    check.rehashed += 1
    if _sha256(path) != expected_sha:
        check.problem = f"'{name}' was changed since it was unpacked (digest mismatch)"
        return
    if name.endswith(".safetensors"):
        check.stale_record = True


def check_unpacked(root: Path, index: PackageIndex) -> UnpackedCheck:
    """Check root against index (the archive's). Reads only: removing bytecode is the caller's choice."""
    check = UnpackedCheck()
    try:
        check.problem = _owner_problem(root, os.lstat(root))
        if check.problem:
            return check
        found = _scan(root, check)
        if found is None:
            return check
        expected = set(index.files) | RESERVED_NAMES
        extra, missing = sorted(found - expected), sorted(expected - found)
        if extra:
            check.problem = f"'{extra[0]}' is not part of the package ({len(extra)} extra file(s))"
        elif missing:
            check.problem = f"'{missing[0]}' is missing ({len(missing)} file(s))"
        elif (root / DIGESTS_NAME).read_bytes() != index_bytes(index):
            check.problem = f"{DIGESTS_NAME} differs from the package's digest index"
        if check.problem:
            return check
        record = _load_record(root, index)
        if record is None:
            check.problem = f"{RECORD_NAME} is missing or does not describe this package"
            return check
        for name in sorted(index.files):
            entry = index.files[name]
            _check_file(root, name, entry.sha256, entry.size, record.get(name), check)
            if check.problem:
                return check
    except OSError as exc:
        check.problem = f"cannot be read ({exc.strerror or exc})"
    return check
