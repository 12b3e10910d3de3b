"""Each command through the real `llmserve` entry point (a subprocess of the installed script).

Every command's --help (exit 0, an example, no engine imported) is checked in tests/unit/test_cli_help.py."""

import json
import shutil
from pathlib import Path

from support.cli import run_cli


def test_version():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("llmserve ")


def test_package_and_inspect_tiny_model(tmp_path, tiny_vllm_source):
    r = run_cli("package", tiny_vllm_source, "--out", tmp_path, "--output", "json")
    assert r.returncode == 0, r.stderr
    built = json.loads(r.stdout)
    pkg = Path(built["path"])
    assert pkg == tmp_path / "tiny-chat-1.llmpkg" and pkg.is_file()
    assert built["modelId"] == "tiny-chat" and built["backend"] == "vllm" and len(built["digest"]) == 64

    r = run_cli("inspect", pkg, "-o", "json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["verified"] is True and report["digest"] == built["digest"]
    assert report["manifest"]["modelId"] == "tiny-chat"
    sizes = {f["path"]: f["size"] for f in report["files"]}
    weights = tiny_vllm_source / "model" / "model.safetensors"
    assert sizes["model_repository/tiny-chat/1/weights/model.safetensors"] == weights.stat().st_size

    r = run_cli("inspect", pkg)
    assert r.returncode == 0
    assert "verified" in r.stdout and "modelId: tiny-chat" in r.stdout


def test_inspect_detects_tampering(tmp_path, tiny_vllm_package):
    bad = tmp_path / "bad.llmpkg"
    raw = bytearray(tiny_vllm_package.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    r = run_cli("inspect", bad)
    assert r.returncode == 4
    assert "error" in r.stderr and "hint" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("inspect", bad, "--output", "json")
    assert r.returncode == 4
    assert json.loads(r.stdout)["error"] in ("integrity", "unsafe-archive")


def test_bad_manifest_error_names_line_and_exit_code(tmp_path):
    (tmp_path / "llmserve.yaml").write_text("modelId: ok\nmodelVersion: 1\nbackend: vllm\ncolour: blue\n")
    r = run_cli("package", tmp_path)
    assert r.returncode == 3
    assert "llmserve.yaml:4: colour: unknown key" in r.stderr
    assert "hint" in r.stderr and "Traceback" not in r.stderr


def test_debug_shows_traceback(tmp_path):
    r = run_cli("inspect", tmp_path / "missing.llmpkg", env={"LLMSERVE_DEBUG": "1"})
    assert r.returncode == 5
    assert "Traceback" in r.stderr


def test_engine_override_refused_from_cli(tmp_path, tiny_vllm_source):
    src = tmp_path / "src"
    shutil.copytree(tiny_vllm_source, src)
    with open(src / "llmserve.yaml", "a") as fh:
        fh.write("vllmVersion: 0.10.1.1\n")
    r = run_cli("package", src, "--out", tmp_path)
    assert r.returncode == 6
    assert "engine-version-override" in r.stderr
    assert not list(tmp_path.glob("*.llmpkg"))


def test_schema_is_json_schema():
    r = run_cli("schema")
    assert r.returncode == 0
    schema = json.loads(r.stdout)
    assert schema["title"].startswith("llmserve package manifest")
    assert "modelId" in schema["properties"]


def test_usage_error_exit_code():
    r = run_cli("package")
    assert r.returncode == 2
