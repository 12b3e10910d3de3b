"""Which engine `llmserve serve` runs: --engine, else the packages' `engine.host`, else by backend."""

import pytest

from llmserve.serve.triton.host import EngineChoiceError, choose_engine


@pytest.mark.parametrize(
    "requested, backends, declared, engine",
    [
        (None, ["vllm"], {}, "vllm"),  # one vLLM package: the embedded engine
        (None, ["python"], {}, "triton"),  # custom execute(): only Triton's Python backend runs it
        (None, ["vllm", "python"], {}, "triton"),
        (None, ["vllm"], {"tiny-chat": "triton"}, "triton"),  # the package asks for Triton
        (None, ["vllm", "python"], {"tiny-chat": "triton", "scorer": "triton"}, "triton"),
        ("vllm", ["vllm"], {"tiny-chat": "triton"}, "vllm"),  # --engine wins over the package
        ("triton", ["vllm"], {"tiny-chat": "vllm"}, "triton"),
    ],
)
def test_the_engine_follows_flag_then_package_then_backend(requested, backends, declared, engine):
    assert choose_engine(requested, backends, declared=declared) == engine


def test_packages_asking_for_different_hosts_must_be_told_which():
    with pytest.raises(EngineChoiceError, match="different engine hosts") as caught:
        choose_engine(None, ["vllm", "vllm"], declared={"a": "vllm", "b": "triton"})
    assert "--engine" in caught.value.hint


def test_a_package_asking_for_vllm_beside_a_python_package_is_refused():
    # the declared host becomes the request, and the embedded engine cannot run a custom execute()
    with pytest.raises(EngineChoiceError, match="Python backend"):
        choose_engine(None, ["vllm", "python"], declared={"tiny-chat": "vllm"})
