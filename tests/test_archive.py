"""The .llmpkg format: reproducible writing, verified reading, and refusal of hostile archives."""

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from llmserve.errors import ExitCode, IntegrityError, UnsafeArchiveError
from llmserve.packaging.archive import (
    DIGESTS_NAME,
    RECORD_NAME,
    ArchiveLimits,
    read_index,
    read_member,
    unpack,
    write_archive,
)

FILES = {"llmserve.yaml": b"modelId: x\n", "model_repository/x/1/weights/w.safetensors": b"W" * 5000}


def _index(files: dict[str, bytes], **override) -> bytes:
    body = {
        "format": 1,
        "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()},
    }
    body["files"].update(override)
    return json.dumps(body).encode()


def _info(name, data=b"", **kw):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, data


def _tar(path: Path, members) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return path


def _hostile(tmp_path, members, files=FILES, **override) -> Path:
    return _tar(tmp_path / "bad.llmpkg", [_info(DIGESTS_NAME, _index(files, **override)), *members])


def _assert_refused(tmp_path, pkg, error, words):
    dest = tmp_path / "out" / "pkg"
    with pytest.raises(error) as info:
        unpack(pkg, dest)
    assert words in info.value.message, info.value.message
    assert info.value.exit_code == ExitCode.INTEGRITY
    # Nothing half-written: neither the destination nor any staging folder remains.
    assert not dest.exists()
    assert list((tmp_path / "out").iterdir()) == []
    return info.value


def test_round_trip_and_reproducible(tmp_path):
    a = write_archive(tmp_path / "a.llmpkg", dict(FILES))
    b = write_archive(tmp_path / "b.llmpkg", dict(reversed(list(FILES.items()))))
    assert (tmp_path / "a.llmpkg").read_bytes() == (tmp_path / "b.llmpkg").read_bytes()
    assert a.digest == b.digest
    out = tmp_path / "u"
    unpack(tmp_path / "a.llmpkg", out)
    for name, data in FILES.items():
        assert (out / name).read_bytes() == data
    assert read_index(tmp_path / "a.llmpkg").files.keys() == FILES.keys()
    assert read_member(tmp_path / "a.llmpkg", "llmserve.yaml") == FILES["llmserve.yaml"]


def test_archive_members_are_normalised(tmp_path):
    write_archive(tmp_path / "a.llmpkg", dict(FILES))
    with tarfile.open(tmp_path / "a.llmpkg") as tar:
        members = tar.getmembers()
    assert [m.name for m in members][:2] == [DIGESTS_NAME, "llmserve.yaml"]
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" and m.isreg() for m in members)


def test_write_failure_leaves_no_partial_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_archive(tmp_path / "a.llmpkg", {"x": tmp_path / "missing"})
    assert list(tmp_path.iterdir()) == []


def test_absolute_path_refused(tmp_path):
    pkg = _hostile(tmp_path, [_info("/etc/passwd", b"x")])
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "absolute")


def test_dotdot_refused(tmp_path):
    pkg = _hostile(tmp_path, [_info("model_repository/../../evil", b"x")])
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "not a plain relative path")


def test_dotdot_in_index_refused(tmp_path):
    pkg = _hostile(tmp_path, [], **{"../evil": {"sha256": "0" * 64, "size": 1}})
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "'../evil'")


def test_escaping_symlink_refused(tmp_path):
    pkg = _hostile(
        tmp_path,
        [
            _info("llmserve.yaml", FILES["llmserve.yaml"]),
            _info("model_repository/link", type=tarfile.SYMTYPE, linkname="../../../etc/passwd"),
        ],
    )
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "escapes the package")


def test_escaping_hardlink_refused(tmp_path):
    pkg = _hostile(tmp_path, [_info("hard", type=tarfile.LNKTYPE, linkname="/etc/shadow")])
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "escapes the package")


def test_inner_symlink_refused_too(tmp_path):
    pkg = _hostile(tmp_path, [_info("a/link", type=tarfile.SYMTYPE, linkname="b")])
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "regular files only")


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_device_files_refused(tmp_path, kind):
    pkg = _hostile(tmp_path, [_info("dev", type=kind, devmajor=1, devminor=3)])
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "device or FIFO")


def test_duplicate_entries_refused(tmp_path):
    data = FILES["llmserve.yaml"]
    pkg = _hostile(tmp_path, [_info("llmserve.yaml", data), _info("llmserve.yaml", data)])
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "duplicate entry 'llmserve.yaml'")


def test_second_index_refused(tmp_path):
    pkg = _hostile(tmp_path, [_info(DIGESTS_NAME, _index(FILES))])
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "duplicate entry")


def test_digest_mismatch_refused(tmp_path):
    write_archive(tmp_path / "a.llmpkg", dict(FILES))
    raw = bytearray((tmp_path / "a.llmpkg").read_bytes())
    at = raw.index(b"W" * 5000)
    raw[at + 100] = 0x41  # flip one byte of the weights, sizes unchanged
    (tmp_path / "a.llmpkg").write_bytes(bytes(raw))
    err = _assert_refused(tmp_path, tmp_path / "a.llmpkg", IntegrityError, "digest mismatch")
    assert "w.safetensors" in err.message
    with pytest.raises(IntegrityError, match="digest mismatch"):
        read_index(tmp_path / "a.llmpkg", verify=True)


def test_unlisted_member_refused(tmp_path):
    pkg = _hostile(tmp_path, [_info("extra.py", b"import os")], files={})
    _assert_refused(tmp_path, pkg, IntegrityError, "not listed in the digest index")


def test_missing_member_refused(tmp_path):
    pkg = _hostile(tmp_path, [_info("llmserve.yaml", FILES["llmserve.yaml"])])
    _assert_refused(tmp_path, pkg, IntegrityError, "missing")


@pytest.mark.parametrize("cut", ["index", "header", "content"])
def test_truncated_archive_refused(tmp_path, cut):
    write_archive(tmp_path / "a.llmpkg", dict(FILES))
    raw = (tmp_path / "a.llmpkg").read_bytes()
    weights_at = raw.index(b"W" * 5000)
    keep = {"index": 700, "header": weights_at - 300, "content": weights_at + 2500}[cut]
    (tmp_path / "a.llmpkg").write_bytes(raw[:keep])
    _assert_refused(tmp_path, tmp_path / "a.llmpkg", IntegrityError, "truncated")


def test_size_bomb_index_refused(tmp_path):
    # The index claims far more content than the file can hold (an uncompressed tar cannot expand).
    pkg = _hostile(tmp_path, [], **{"huge.dat": {"sha256": "0" * 64, "size": 10**9}})
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "archive is only")


def test_limits_refuse_oversized_files(tmp_path):
    write_archive(tmp_path / "a.llmpkg", dict(FILES))
    with pytest.raises(UnsafeArchiveError, match="over the 1000-byte limit"):
        unpack(tmp_path / "a.llmpkg", tmp_path / "u", limits=ArchiveLimits(max_file_bytes=1000))
    with pytest.raises(UnsafeArchiveError, match="over the limit of 1"):
        unpack(tmp_path / "a.llmpkg", tmp_path / "u", limits=ArchiveLimits(max_files=1))
    assert not (tmp_path / "u").exists()


def test_compressed_or_foreign_files_refused(tmp_path):
    write_archive(tmp_path / "a.llmpkg", dict(FILES))
    gz = tmp_path / "b.llmpkg"
    gz.write_bytes(gzip.compress((tmp_path / "a.llmpkg").read_bytes()))
    _assert_refused(tmp_path, gz, IntegrityError, "not a plain tar")
    junk = tmp_path / "c.llmpkg"
    junk.write_bytes(b"PK\x03\x04 not a tar at all" * 40)
    _assert_refused(tmp_path, junk, IntegrityError, "")


def test_plain_tar_without_index_refused(tmp_path):
    pkg = _tar(tmp_path / "p.llmpkg", [_info("llmserve.yaml", b"x")])
    _assert_refused(tmp_path, pkg, IntegrityError, "not an llmserve package")


def test_malformed_index_refused(tmp_path):
    pkg = _tar(tmp_path / "p.llmpkg", [_info(DIGESTS_NAME, b"{not json")])
    _assert_refused(tmp_path, pkg, IntegrityError, "digest index is malformed")


def test_existing_destination_untouched_on_failure(tmp_path):
    dest = tmp_path / "out" / "pkg"
    dest.mkdir(parents=True)
    (dest / "keep.txt").write_text("precious")
    pkg = _hostile(tmp_path, [_info("/abs", b"x")])
    with pytest.raises(UnsafeArchiveError):
        unpack(pkg, dest, replace=True)
    assert (dest / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["pkg"]


# --- issue #11: a hand-built package is held to the packager's rules, and nothing hostile reaches an OSError ---

WEIGHTS = "model_repository/x/1/weights/"


def _package(tmp_path, files: dict[str, bytes]) -> Path:
    return _tar(
        tmp_path / "hand.llmpkg", [_info(DIGESTS_NAME, _index(files))] + [_info(n, d) for n, d in files.items()]
    )


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.PTH", "state.pkl", "last.ckpt", "x.pickle"])
def test_hand_built_package_with_pickled_weights_refused(tmp_path, name):
    pkg = _package(tmp_path, {**FILES, WEIGHTS + name: b"\x80\x04K\x01."})
    err = _assert_refused(tmp_path, pkg, UnsafeArchiveError, "pickled file")
    assert name in err.message and "llmserve package" in err.hint
    with pytest.raises(UnsafeArchiveError, match="pickled file"):
        read_index(pkg, verify=False)  # refused from the index alone, before any content is read


@pytest.mark.parametrize(
    "head", [b"\x80\x02}q\x00.", b"\x80\x04\x95\x05\x00", b"\x80\x05K\x01.", b"PK\x03\x04archive/data.pkl"]
)
def test_pickle_content_under_another_name_refused(tmp_path, head):
    pkg = _package(tmp_path, {**FILES, WEIGHTS + "weights.data": head + b"\x00" * 64})
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "pickled (or torch zip) data")


def test_pickle_rules_spare_plugins_and_safetensors(tmp_path):
    # A safetensors header of 640 bytes starts with 0x80 0x02, like a pickle: the name decides the loader.
    safetensors = (640).to_bytes(8, "little") + b"{" + b" " * 639
    files = {
        **FILES,
        WEIGHTS + "model-2.safetensors": safetensors,
        "plugins/p/vocab.pkl": b"\x80\x04K\x01.",  # plugins are code already; their data is theirs
    }
    pkg = _package(tmp_path, files)
    unpack(pkg, tmp_path / "u")
    assert (tmp_path / "u" / WEIGHTS / "model-2.safetensors").read_bytes() == safetensors


@pytest.mark.parametrize("name", [RECORD_NAME, DIGESTS_NAME])
def test_reserved_names_refused_in_index(tmp_path, name):
    pkg = _hostile(tmp_path, [], **{name: {"sha256": "0" * 64, "size": 1}})
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "reserved name")
    with pytest.raises(ValueError, match="reserved"):
        write_archive(tmp_path / "w.llmpkg", {name: b"x"})


def test_file_and_folder_of_the_same_name_refused(tmp_path):
    pkg = _package(tmp_path, {**FILES, "a": b"x", "a/b": b"y"})
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "'a' is both a file and a folder")


def test_overlong_names_refused_not_oserror(tmp_path):
    pkg = _package(tmp_path, {**FILES, "d/" + "n" * 300: b"x"})
    _assert_refused(tmp_path, pkg, UnsafeArchiveError, "too long")


def test_deeply_nested_index_refused_not_recursion_error(tmp_path):
    pkg = _tar(tmp_path / "p.llmpkg", [_info(DIGESTS_NAME, b"[" * 100_000 + b"]" * 100_000)])
    _assert_refused(tmp_path, pkg, IntegrityError, "digest index is malformed")


def test_member_larger_than_its_index_entry_refused(tmp_path):
    # The tar header may not declare more bytes than the index: the size check is per member, not just in total.
    pkg = _hostile(tmp_path, [_info("llmserve.yaml", FILES["llmserve.yaml"] + b"more")])
    _assert_refused(tmp_path, pkg, IntegrityError, "bytes but the index says")


def test_total_unpacked_bytes_capped(tmp_path):
    write_archive(tmp_path / "a.llmpkg", dict(FILES))
    with pytest.raises(UnsafeArchiveError, match="bytes in all, over the 4000-byte limit"):
        unpack(tmp_path / "a.llmpkg", tmp_path / "u", limits=ArchiveLimits(max_total_bytes=4000))
    assert not (tmp_path / "u").exists()


def test_unpack_records_what_it_verified(tmp_path):
    index = write_archive(tmp_path / "a.llmpkg", dict(FILES))
    unpack(tmp_path / "a.llmpkg", tmp_path / "u")
    record = json.loads((tmp_path / "u" / RECORD_NAME).read_text())
    assert record["digest"] == index.digest
    assert set(record["files"]) == set(FILES)
    st = (tmp_path / "u" / "llmserve.yaml").stat()
    entry = record["files"]["llmserve.yaml"]
    assert (entry["size"], entry["ino"], entry["mtime_ns"]) == (st.st_size, st.st_ino, st.st_mtime_ns)
