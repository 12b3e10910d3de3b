"""The embedded engine's hang watch: --engine-stall-timeout, else LLMSERVE_ENGINE_STALL_TIMEOUT_S, else 60 s;
a host without the watch (Triton) refuses it instead of dropping it."""

import pytest
import typer

from llmserve.cli.app import app
from llmserve.errors import InvalidInputError
from llmserve.serve.options import STALL_TIMEOUT_ENV, ServeOptions
from llmserve.serve.triton.host import refuse_unenforced_options


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(STALL_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv("LLMSERVE_API_KEY", raising=False)


def test_the_flag_wins_over_the_environment_which_wins_over_the_default(monkeypatch, tmp_path):
    assert ServeOptions(package=tmp_path).stall_timeout_s() == 60.0
    assert ServeOptions(package=tmp_path).stall_timeout_asked_by() is None
    monkeypatch.setenv(STALL_TIMEOUT_ENV, "12.5")
    assert ServeOptions(package=tmp_path).stall_timeout_s() == 12.5
    assert ServeOptions(package=tmp_path).stall_timeout_asked_by() == STALL_TIMEOUT_ENV
    flagged = ServeOptions(package=tmp_path, engine_stall_timeout_s=3)
    assert (flagged.stall_timeout_s(), flagged.stall_timeout_asked_by()) == (3, "--engine-stall-timeout")


@pytest.mark.parametrize("value", [0, -1, float("nan")])
def test_a_flag_that_is_not_a_positive_number_is_refused(tmp_path, value):
    with pytest.raises(InvalidInputError, match="--engine-stall-timeout"):
        ServeOptions(package=tmp_path, engine_stall_timeout_s=value)


def test_a_malformed_environment_value_is_refused_at_start(monkeypatch, tmp_path):
    monkeypatch.setenv(STALL_TIMEOUT_ENV, "soon")
    with pytest.raises(InvalidInputError, match=STALL_TIMEOUT_ENV):
        ServeOptions(package=tmp_path)


@pytest.mark.parametrize("by_env", [False, True])
def test_the_triton_host_refuses_a_stall_timeout_it_cannot_enforce(monkeypatch, tmp_path, by_env):
    if by_env:
        monkeypatch.setenv(STALL_TIMEOUT_ENV, "30")
    options = ServeOptions(package=tmp_path, engine_stall_timeout_s=None if by_env else 30)
    with pytest.raises(InvalidInputError, match="hang watch") as caught:
        refuse_unenforced_options(options)
    assert (STALL_TIMEOUT_ENV if by_env else "--engine-stall-timeout") in str(caught.value)
    assert "--engine vllm" in caught.value.hint


def test_the_triton_host_takes_options_without_a_stall_timeout(tmp_path):
    refuse_unenforced_options(ServeOptions(package=tmp_path))  # nothing asked: nothing to refuse


def test_serve_help_names_the_flag_and_its_default():
    serve = typer.main.get_command(app).commands["serve"]
    (param,) = [p for p in serve.params if "--engine-stall-timeout" in p.opts]
    assert STALL_TIMEOUT_ENV in param.help and "--engine triton" in param.help
