"""Stopping a Triton-hosted `llmserve serve` (SIGTERM) is quick when it is idle and never cuts a request short.

Triton unloads its models after its last in-flight request; unloading is cleanup (a Python model's finalize, an
engine's shutdown) and made an idle stop take 5-10 s, up to Triton's exit timeout for a model whose finalize hangs.
llmserve gives the unload llmserve.serve.triton.server.UNLOAD_GRACE_S (2 s), then ends the process group. The model here
answers after REQUEST_S and its finalize never ends on its own.
"""

from __future__ import annotations

import shutil
import signal
import textwrap
import threading
import time

import httpx
import pytest
from support.models import llm_text_manifest
from support.processes import processes_mentioning
from triton_serving import start_serve, stop, wait_ready

from llmserve.packaging import build_package

MODEL = "slow-stop"
REQUEST_S = 4.0
# Triton's exit timeout is the drain timeout: alone, it would wait this long for the hanging finalize below
DRAIN_S = 60
MODEL_PY = """\
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        open(os.environ["SLOW_STOP_MARKER"], "w").close()  # the request is inside execute() now
        time.sleep(REQUEST_S)
        answers = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            out = pb_utils.Tensor("text_output", np.array([b"done: " + text], dtype=np.object_))
            answers.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return answers

    def finalize(self):
        time.sleep(600)  # a finalize that hangs: the stop must not wait for it
""".replace("REQUEST_S", str(REQUEST_S))


@pytest.fixture(scope="module")
def package(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("slow-stop")
    src = tmp / "src"
    shutil.copytree(tiny_model_dir, src / "model")
    (src / "model.py").write_text(MODEL_PY)
    manifest = llm_text_manifest(MODEL).replace("python:\n", "python:\n  modelPy: model.py\n")
    (src / "llmserve.yaml").write_text(textwrap.dedent(manifest))
    return build_package(src, tmp / "dist").path


def _stop_seconds(served) -> float:
    t0 = time.monotonic()
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(120) == 0, served.text()[-3000:]
    return time.monotonic() - t0


def _start(tmp_path, package, triton_env, monkeypatch):
    marker = tmp_path / "in-execute"
    monkeypatch.setenv("SLOW_STOP_MARKER", str(marker))  # the server (and so Triton's stub) inherits it
    served = start_serve([package], tmp_path / "serve.log", triton_env, "--drain-timeout", str(DRAIN_S))
    return served, marker


def test_an_idle_server_stops_in_a_couple_of_seconds(tmp_path, package, triton_env, monkeypatch):
    served, _ = _start(tmp_path, package, triton_env, monkeypatch)
    try:
        wait_ready(served)
        took = _stop_seconds(served)
        # about UNLOAD_GRACE_S plus the process's own exit (seconds on a loaded 2-core host); Triton alone waits its
        # whole exit timeout (DRAIN_S) for this model
        assert took < DRAIN_S / 2, took
    finally:
        stop(served)
    assert not processes_mentioning(f"llmserve_triton_{served.proc.pid}_")


def test_a_request_in_flight_at_stop_is_answered_in_full(tmp_path, package, triton_env, monkeypatch):
    served, marker = _start(tmp_path, package, triton_env, monkeypatch)
    answers: list[httpx.Response] = []
    try:
        wait_ready(served)
        url = f"http://127.0.0.1:{served.http}/v2/models/{MODEL}/generate"
        asking = threading.Thread(
            target=lambda: answers.append(httpx.post(url, json={"text_input": "hello"}, timeout=60)), daemon=True
        )
        asking.start()
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the request never reached the model"
        took = _stop_seconds(served)
        asking.join(30)
        assert [a.status_code for a in answers] == [200], [a.text for a in answers]
        assert answers[0].json()["text_output"] == "done: hello"
        assert REQUEST_S / 2 < took < DRAIN_S / 2, took
    finally:
        stop(served)
    assert not processes_mentioning(f"llmserve_triton_{served.proc.pid}_")
