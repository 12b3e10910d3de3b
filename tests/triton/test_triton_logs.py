"""Triton's log, read for the lines that matter (from a real 2.51 log of a model whose initialize raised)."""

from __future__ import annotations

from llmserve.serve.triton.logs import important_lines, is_address_in_use, load_failure

LOG = r"""I1201 14:08:53.332889 18767 pinned_memory_manager.cc:283] "Pinned memory pool disabled"
E1201 14:08:53.333553 18767 server.cc:241] "CudaDriverHelper has not been initialized."
I1201 14:08:53.335757 18767 model_lifecycle.cc:472] "loading: broken:1"
Error: Failed to initialize NVML
W1201 14:08:55.368316 18767 metrics.cc:798] "DCGM unable to start: DCGM initialization error"
I1201 14:09:01.282023 18767 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: broken_0_0 (CPU device 0)"
I1201 14:09:03.102399 18767 pb_stub.cc:366] "Failed to initialize Python stub: RuntimeError: weights file is missing: /nowhere/w.bin\n\nAt:\n  /r/broken/1/model.py(4): initialize\n"
E1201 14:09:03.434480 18767 backend_model.cc:692] "ERROR: Failed to create instance: RuntimeError: weights file is missing: /nowhere/w.bin\n\nAt:\n  /r/broken/1/model.py(4): initialize\n"
E1201 14:09:03.434690 18767 model_lifecycle.cc:642] "failed to load 'broken' version 1: Internal: RuntimeError: weights file is missing: /nowhere/w.bin\n\nAt:\n  /r/broken/1/model.py(4): initialize\n"
I1201 14:09:03.434722 18767 model_lifecycle.cc:777] "failed to load 'broken'"
I1201 14:09:03.442024 18767 server.cc:604]
+---------+---------+--------+
| Backend | Path    | Config |
+---------+---------+--------+
| broken  | 1       | UNAVAILABLE: Internal: RuntimeError: weights file is missing |
I1201 14:09:03.442711 18767 server.cc:305] "Waiting for in-flight requests to complete."
error: creating server: Invalid argument - load failed for model 'broken': version 1 is at UNAVAILABLE state: Internal: RuntimeError: weights file is missing: /nowhere/w.bin

At:
  /r/broken/1/model.py(4): initialize
;
"""


def test_the_reason_is_tritons_first_line_about_the_model():
    assert load_failure(LOG, "broken") == "Internal: RuntimeError: weights file is missing: /nowhere/w.bin"
    assert load_failure(LOG, "other") is None


def test_the_reason_when_the_model_is_not_in_the_repository():
    line = "E1201 14:20:00.000001 1 model_lifecycle.cc:642] \"failed to load 'ghost', failed to poll from model repository\""
    assert load_failure(line, "ghost") == "failed to poll from model repository"


def test_important_lines_keep_errors_and_tracebacks_without_noise_tables_or_repeats():
    lines = important_lines(LOG, "broken")
    assert lines == [
        "ERROR: Failed to create instance: RuntimeError: weights file is missing: /nowhere/w.bin",
        "At:",
        "  /r/broken/1/model.py(4): initialize",
        "failed to load 'broken' version 1: Internal: RuntimeError: weights file is missing: /nowhere/w.bin",
        "failed to load 'broken'",
        "error: creating server: Invalid argument - load failed for model 'broken': version 1 is at UNAVAILABLE "
        "state: Internal: RuntimeError: weights file is missing: /nowhere/w.bin",
    ]
    assert not any("NVML" in line or "DCGM" in line or "CudaDriverHelper" in line for line in lines)


def test_important_lines_are_capped_to_the_last():
    assert len(important_lines(LOG, "broken", limit=2)) == 2


def test_a_port_taken_is_recognised():
    assert is_address_in_use('E1201 1 http_server.cc:1] "failed to start HTTP service: Address already in use"')
    assert not is_address_in_use(LOG)
