"""The `.llmpkg` archive: an uncompressed POSIX tar with a digest index as its first member.

Why plain tar: weights (safetensors) do not compress, and a plain tar can be hashed and unpacked
in one streaming pass. Why the index first: unpacking checks every member against it while
streaming, so nothing unverified is ever renamed into place.

Layout:
    llmserve.digests.json      {"format": 1, "files": {path: {"sha256": ..., "size": ...}}}
    llmserve.yaml              canonical manifest
    model_repository/<modelId>/config.pbtxt
    model_repository/<modelId>/<version>/...
    plugins/<name>/...

Writing is reproducible: members sorted, mtime/uid/gid zeroed, modes normalised, no directory
entries, so the same inputs give byte-identical archives.

Reading trusts nothing: names, types, sizes and digests are checked while streaming, and pickled
weights are refused (a package built by hand skips the packager's own refusal). An unpacked folder
also holds llmserve.unpacked.json, binding each file's digest to the inode it was written to, so
a later reuse can tell cheaply whether the folder still holds what was verified.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llmserve.errors import IntegrityError, NotFoundError, UnsafeArchiveError

DIGESTS_NAME = "llmserve.digests.json"
RECORD_NAME = "llmserve.unpacked.json"
RESERVED_NAMES = frozenset({DIGESTS_NAME, RECORD_NAME})
PLUGINS_PREFIX = "plugins/"
FORMAT_VERSION = 1
_CHUNK = 1 << 20
_MAX_INDEX_BYTES = 16 << 20
# Most file systems cap a name component at 255 bytes and a path at 4096; past that, unpacking
# would fail with an OSError instead of a clear refusal.
_MAX_COMPONENT_BYTES = 255
_MAX_NAME_BYTES = 4096

# Pickle runs code when loaded. Weights must be safetensors; plugins are code already, so their
# own data files are theirs to choose.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Pickle protocols 2-5 start with PROTO (0x80) and the protocol number; torch.save's zip format starts
# like any zip file.
_PICKLE_MAGIC = tuple(bytes([0x80, proto]) for proto in (2, 3, 4, 5))
_ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class PackageIndex:
    files: dict[str, FileEntry]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files.values())

    @property
    def digest(self) -> str:
        """One digest naming the whole package: the sha256 of its canonical index."""
        return hashlib.sha256(_index_bytes(self.files)).hexdigest()


@dataclass(frozen=True)
class ArchiveLimits:
    """Ceilings that turn a size bomb or a hostile index into a clear error instead of a full disk."""

    max_files: int = 100_000
    max_file_bytes: int = 512 << 30
    max_total_bytes: int = 2 << 40


# --- writing --------------------------------------------------------------------------------------

Source = Path | bytes


def _index_bytes(files: dict[str, FileEntry]) -> bytes:
    body = {
        "format": FORMAT_VERSION,
        "files": {p: {"sha256": files[p].sha256, "size": files[p].size} for p in sorted(files)},
    }
    return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()


def _hash_source(src: Source) -> FileEntry:
    if isinstance(src, bytes):
        return FileEntry("", len(src), hashlib.sha256(src).hexdigest())
    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return FileEntry("", size, h.hexdigest())


def _tarinfo(name: str, size: int, executable: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if executable else 0o644
    info.type = tarfile.REGTYPE
    return info


def validate_member_name(name: str) -> str:
    """Return the name if it is a safe, normalised relative POSIX path; raise otherwise."""
    if not name or "\x00" in name:
        raise UnsafeArchiveError(f"archive member with an empty or NUL-containing name: {name!r}")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":") or "\\" in name:
        raise UnsafeArchiveError(f"archive member '{name}' has an absolute or non-POSIX path")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeArchiveError(f"archive member '{name}' is not a plain relative path (empty, '.' or '..' parts)")
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > _MAX_NAME_BYTES or any(
        len(p.encode("utf-8", "surrogateescape")) > _MAX_COMPONENT_BYTES for p in parts
    ):
        raise UnsafeArchiveError(f"archive member '{name[:80]}...' has a name too long for a file system")
    return name


def pickle_policy_applies(name: str) -> bool:
    """Whether the pickle refusal covers this member (everything but plugin code and safetensors)."""
    return not name.startswith(PLUGINS_PREFIX) and not name.endswith(".safetensors")


def refuse_pickled_name(name: str, source: str) -> None:
    if not name.startswith(PLUGINS_PREFIX) and name.lower().endswith(PICKLE_SUFFIXES):
        raise UnsafeArchiveError(
            f"{source}: '{name}' is a pickled file, which runs code when loaded; refused",
            hint="Rebuild the package from safetensors weights with `llmserve package SRC`.",
        )


def refuse_pickled_content(name: str, head: bytes, source: str) -> None:
    if pickle_policy_applies(name) and head.startswith((*_PICKLE_MAGIC, _ZIP_MAGIC)):
        raise UnsafeArchiveError(
            f"{source}: '{name}' holds pickled (or torch zip) data, which runs code when loaded; refused",
            hint="Rebuild the package from safetensors weights with `llmserve package SRC`.",
        )


def _refuse_file_dir_clash(names: set[str], source: str) -> None:
    # "a" and "a/b" cannot both be unpacked; catching it here keeps it an integrity error, not an OSError.
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in names:
                raise UnsafeArchiveError(f"{source}: '{prefix}' is both a file and a folder in the package")


def write_archive(
    dest: Path, members: dict[str, Source], *, progress: Callable[[int], None] | None = None
) -> PackageIndex:
    """Write members (archive path -> file path or bytes) as a reproducible .llmpkg at dest.

    The archive is written to a temporary file beside dest and renamed into place, so a failure
    never leaves a partial archive under the final name.
    """
    for name in members:
        validate_member_name(name)
        if name in RESERVED_NAMES:
            raise ValueError(f"{name} is reserved")
    entries: dict[str, FileEntry] = {}
    for name, src in members.items():
        e = _hash_source(src)
        entries[name] = FileEntry(name, e.size, e.sha256)
    index = PackageIndex(entries)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            index_bytes = _index_bytes(entries)
            tar.addfile(_tarinfo(DIGESTS_NAME, len(index_bytes)), io.BytesIO(index_bytes))
            # The manifest goes right after the index so `inspect` can show it without reading weights.
            order = sorted(members, key=lambda n: (n != "llmserve.yaml", n))
            for name in order:
                src = members[name]
                if isinstance(src, bytes):
                    tar.addfile(_tarinfo(name, len(src)), io.BytesIO(src))
                else:
                    executable = bool(src.stat().st_mode & stat.S_IXUSR)
                    with open(src, "rb") as fh:
                        tar.addfile(_tarinfo(name, entries[name].size, executable), fh)
                if progress:
                    progress(entries[name].size)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return index


# --- reading --------------------------------------------------------------------------------------


def _open_tar(path: Path) -> tarfile.TarFile:
    if not path.exists():
        raise NotFoundError(f"{path}: no such package", hint="Build one with `llmserve package SRC`.")
    if not path.is_file():
        raise NotFoundError(f"{path}: not a file")
    try:
        # "r:" (not "r:*"): a compressed or foreign file is refused instead of being decompressed.
        return tarfile.open(path, mode="r:")
    except tarfile.ReadError as exc:
        raise IntegrityError(f"{path}: not an llmserve package (not a plain tar archive: {exc})") from exc


def _parse_index(raw: bytes, source: str, limits: ArchiveLimits) -> PackageIndex:
    try:
        body = json.loads(raw)
        if body.get("format") != FORMAT_VERSION:
            raise IntegrityError(
                f"{source}: unsupported package format {body.get('format')!r}",
                hint="Upgrade llmserve, or rebuild the package with this version.",
            )
        files = {}
        for name, meta in body["files"].items():
            validate_member_name(name)
            if name in RESERVED_NAMES:
                raise UnsafeArchiveError(f"{source}: the digest index lists the reserved name '{name}'")
            refuse_pickled_name(name, source)
            size, digest = meta["size"], meta["sha256"]
            if not isinstance(size, int) or size < 0 or not isinstance(digest, str) or len(digest) != 64:
                raise IntegrityError(f"{source}: malformed digest entry for '{name}'")
            if size > limits.max_file_bytes:
                raise UnsafeArchiveError(
                    f"{source}: '{name}' declares {size} bytes, over the {limits.max_file_bytes}-byte limit"
                )
            files[name] = FileEntry(name, size, digest)
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise IntegrityError(f"{source}: the digest index is malformed ({exc})") from exc
    except RecursionError:
        raise IntegrityError(f"{source}: the digest index is malformed (nested too deeply)") from None
    _refuse_file_dir_clash(set(files), source)
    if len(files) > limits.max_files:
        raise UnsafeArchiveError(f"{source}: {len(files)} files, over the limit of {limits.max_files}")
    index = PackageIndex(files)
    if index.total_size > limits.max_total_bytes:
        raise UnsafeArchiveError(
            f"{source}: {index.total_size} bytes in all, over the {limits.max_total_bytes}-byte limit"
        )
    return index


def _check_member(member: tarfile.TarInfo, source: str) -> None:
    name = member.name
    if member.issym() or member.islnk():
        target = member.linkname
        base = posixpath.dirname(name) if member.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchiveError(f"{source}: link '{name}' -> '{target}' escapes the package")
        raise UnsafeArchiveError(f"{source}: link '{name}' -> '{target}': packages hold regular files only")
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        raise UnsafeArchiveError(f"{source}: '{name}' is a device or FIFO entry")
    if member.issparse():
        raise UnsafeArchiveError(f"{source}: '{name}' is a sparse entry (a size bomb shape); refused")
    if not member.isreg():
        raise UnsafeArchiveError(f"{source}: '{name}' is not a regular file (tar type {member.type!r})")
    validate_member_name(name)


def _iter_verified(
    path: Path, limits: ArchiveLimits
) -> Iterator[tuple[PackageIndex, FileEntry | None, tarfile.TarFile, tarfile.TarInfo | None]]:
    """Walk the archive: yield (index, entry, tar, member) per file after structural checks.

    The consumer reads the member's bytes; digest checks happen in `_copy_verified`.
    """
    source = str(path)
    tar = _open_tar(path)
    archive_size = path.stat().st_size
    try:
        try:
            first = tar.next()
        except tarfile.TarError as exc:
            raise IntegrityError(f"{source}: truncated or corrupted archive ({exc})") from exc
        if first is None or first.name != DIGESTS_NAME or not first.isreg():
            raise IntegrityError(f"{source}: the first member must be {DIGESTS_NAME}; this is not an llmserve package")
        if first.size > _MAX_INDEX_BYTES:
            raise UnsafeArchiveError(f"{source}: digest index of {first.size} bytes is implausibly large")
        try:
            fh = tar.extractfile(first)
            raw = fh.read() if fh else b""
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise IntegrityError(f"{source}: truncated archive (digest index cut short: {exc})") from exc
        if len(raw) != first.size:
            raise IntegrityError(f"{source}: truncated archive (digest index cut short)")
        index = _parse_index(raw, source, limits)
        # An uncompressed tar cannot expand: declared contents larger than the file mean a lie.
        if index.total_size > archive_size:
            raise UnsafeArchiveError(
                f"{source}: the index declares {index.total_size} bytes but the archive is only {archive_size} bytes"
            )
        yield index, None, tar, None
        seen: set[str] = set()
        while True:
            try:
                member = tar.next()
            except tarfile.TarError as exc:
                raise IntegrityError(f"{source}: truncated or corrupted archive ({exc})") from exc
            if member is None:
                break
            _check_member(member, source)
            if member.name in seen or member.name == DIGESTS_NAME:
                raise UnsafeArchiveError(f"{source}: duplicate entry '{member.name}'")
            seen.add(member.name)
            entry = index.files.get(member.name)
            if entry is None:
                raise IntegrityError(f"{source}: '{member.name}' is not listed in the digest index")
            if member.size != entry.size:
                raise IntegrityError(
                    f"{source}: '{member.name}' is {member.size} bytes but the index says {entry.size}"
                )
            yield index, entry, tar, member
        missing = sorted(set(index.files) - seen)
        if missing:
            raise IntegrityError(
                f"{source}: truncated archive: {len(missing)} indexed file(s) missing, first '{missing[0]}'"
            )
    finally:
        tar.close()


def _copy_verified(
    tar: tarfile.TarFile, member: tarfile.TarInfo, entry: FileEntry, out: BinaryIO | None, source: str
) -> None:
    fh = tar.extractfile(member)
    if fh is None:
        raise UnsafeArchiveError(f"{source}: '{member.name}' is not a regular file")
    h = hashlib.sha256()
    remaining = member.size
    first = True
    try:
        while remaining:
            chunk = fh.read(min(_CHUNK, remaining))
            if not chunk:
                raise IntegrityError(f"{source}: truncated archive (inside '{member.name}')")
            if first:
                refuse_pickled_content(member.name, chunk, source)
                first = False
            h.update(chunk)
            if out is not None:
                out.write(chunk)
            remaining -= len(chunk)
    except (tarfile.TarError, OSError, EOFError) as exc:
        if isinstance(exc, IntegrityError):
            raise
        raise IntegrityError(f"{source}: truncated or corrupted archive (inside '{member.name}': {exc})") from exc
    if h.hexdigest() != entry.sha256:
        raise IntegrityError(f"{source}: digest mismatch for '{member.name}' (content was altered or corrupted)")


def read_index(path: Path, *, verify: bool = True, limits: ArchiveLimits = ArchiveLimits()) -> PackageIndex:
    """Return the package's index; with verify, hash every member against it (reads the whole file)."""
    index: PackageIndex | None = None
    for idx, entry, tar, member in _iter_verified(path, limits):
        index = idx
        if entry is None or member is None:
            if not verify:
                return idx
            continue
        _copy_verified(tar, member, entry, None, str(path))
    assert index is not None
    return index


def read_member(path: Path, name: str, *, limits: ArchiveLimits = ArchiveLimits()) -> bytes:
    """Read one small member (e.g. the manifest), verified against the index, without unpacking."""
    for _idx, entry, tar, member in _iter_verified(path, limits):
        # Other members are skipped unread: tarfile seeks past them.
        if entry is None or member is None or member.name != name:
            continue
        buf = io.BytesIO()
        _copy_verified(tar, member, entry, buf, str(path))
        return buf.getvalue()
    raise IntegrityError(f"{path}: no member '{name}' in the package")


def index_bytes(index: PackageIndex) -> bytes:
    """The canonical bytes of an index, as written into the archive and into an unpacked folder."""
    return _index_bytes(index.files)


def stat_key(st: os.stat_result) -> dict[str, int]:
    """What a file's metadata must still say for its recorded digest to stand without rehashing.

    ctime cannot be set from user space, so a file rewritten and re-dated still shows a new ctime.
    """
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def write_record(root: Path, index: PackageIndex) -> None:
    """Write RECORD_NAME into an unpacked folder: each file's digest bound to its current metadata."""
    files = {}
    for name in sorted(index.files):
        st = os.lstat(root.joinpath(*name.split("/")))
        files[name] = {"sha256": index.files[name].sha256, **stat_key(st)}
    body = {"format": FORMAT_VERSION, "digest": index.digest, "files": files}
    tmp = root / f".{RECORD_NAME}.partial"
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / RECORD_NAME)


def unpack(
    path: Path,
    dest: Path,
    *,
    limits: ArchiveLimits = ArchiveLimits(),
    progress: Callable[[int], None] | None = None,
    replace: bool = False,
) -> PackageIndex:
    """Unpack a package into dest, verifying everything before dest appears.

    Files go to a temporary sibling folder; only when every member has been checked is it renamed
    to dest. On any error the temporary folder is removed and dest is untouched.
    """
    source = str(path)
    dest = Path(dest)
    if dest.exists() and not replace:
        raise IntegrityError(f"{dest}: already exists", hint="Choose another destination or remove it first.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".unpacking", dir=dest.parent))
    try:
        index: PackageIndex | None = None
        for idx, entry, tar, member in _iter_verified(path, limits):
            index = idx
            if entry is None or member is None:
                continue
            target = staging.joinpath(*member.name.split("/"))
            # validate_member_name already refused '..' and absolute names; this guards the rest.
            if not target.resolve().is_relative_to(staging.resolve()):
                raise UnsafeArchiveError(f"{source}: '{member.name}' would be written outside the destination")
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as out:
                _copy_verified(tar, member, entry, out, source)
            os.chmod(target, 0o755 if member.mode & 0o100 else 0o644)
            if progress:
                progress(entry.size)
        assert index is not None
        (staging / DIGESTS_NAME).write_bytes(_index_bytes(index.files))
        write_record(staging, index)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)
            os.replace(staging, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, dest)
        return index
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
