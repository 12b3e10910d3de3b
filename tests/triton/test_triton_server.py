"""A real tritonserver started by llmserve: explicit model control, readiness on READY, HTTP and gRPC infer with
BYTES of non-ASCII text both ways, a clear error for a model that fails to load, nothing left behind after stop."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from support.processes import processes_mentioning
from triton_models import BROKEN_MODEL, ECHO_MODEL, HANGING_MODEL

from llmserve.errors import ExitCode
from llmserve.serve.triton import TritonModelLoadError, TritonServer, TritonStartError
from llmserve.serve.triton.server import group_members

# Accents, CJK, an emoji outside the BMP, a combining mark, right-to-left text, an empty string and a NUL inside.
TEXTS = ["héllo wörld", "日本語のテキスト", "emoji 🦙 outside the BMP", "e\u0301 combining", "שלום עולם", "", "a\x00b"]


def _expected_text(value: bytes) -> bytes:
    return f"«{value.decode('utf-8', errors='replace').upper()}» · {len(value)} bytes · ☃ 日本".encode()


def _bytes(value: object) -> bytes:
    """An output element as bytes: binary outputs come back as bytes, JSON ones as str."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _shm_regions(server: TritonServer) -> list[Path]:
    return list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory, triton_install):
    from triton_models import write_model

    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "echo", ECHO_MODEL)
    write_model(repo, "broken", BROKEN_MODEL)
    with TritonServer(repo, ["echo"], install=triton_install, stop_timeout=20) as server:
        yield server
    assert server.processes() == []


def test_the_model_is_ready_and_only_the_model_asked_for_is_loaded(echo_server):
    client = httpclient.InferenceServerClient(echo_server.http_url)
    try:
        assert client.is_server_ready() and client.is_model_ready("echo")
        index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        assert index["echo"] == "READY" and index.get("broken") != "READY"  # explicit model control
    finally:
        client.close()
    assert echo_server.http_url.startswith("127.0.0.1:") and echo_server.grpc_url.startswith("127.0.0.1:")


@pytest.mark.parametrize("binary_data", [True, False], ids=["binary", "json"])
def test_http_infer_round_trips_non_ascii_bytes(echo_server, binary_data):
    texts = TEXTS if binary_data else [t for t in TEXTS if "\x00" not in t]  # JSON strings carry no NUL
    values = np.array([t.encode("utf-8") for t in texts], dtype=np.object_)
    client = httpclient.InferenceServerClient(echo_server.http_url)
    try:
        inp = httpclient.InferInput("IN", [len(values)], "BYTES")
        inp.set_data_from_numpy(values, binary_data=binary_data)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_data) for n in ("ECHO", "TEXT", "NUMPY")]
        result = client.infer("echo", [inp], outputs=outputs)
    finally:
        client.close()
    assert [_bytes(v) for v in result.as_numpy("ECHO")] == [t.encode("utf-8") for t in texts]
    assert [_bytes(v) for v in result.as_numpy("TEXT")] == [_expected_text(t.encode("utf-8")) for t in texts]
    # The model runs in the Triton environment (numpy<2); this client runs in the vLLM one (numpy 2).
    assert _bytes(result.as_numpy("NUMPY")[0]).decode().startswith("1.")
    assert np.__version__.startswith("2.")


def test_grpc_infer_round_trips_non_ascii_bytes(echo_server):
    values = np.array([t.encode("utf-8") for t in TEXTS], dtype=np.object_)
    client = grpcclient.InferenceServerClient(echo_server.grpc_url)
    try:
        inp = grpcclient.InferInput("IN", [len(values)], "BYTES")
        inp.set_data_from_numpy(values)
        result = client.infer("echo", [inp])
        decoded = [bytes(v).decode("utf-8") for v in result.as_numpy("TEXT")]
    finally:
        client.close()
    assert [bytes(v) for v in result.as_numpy("ECHO")] == [t.encode("utf-8") for t in TEXTS]
    assert decoded == [_expected_text(t.encode("utf-8")).decode("utf-8") for t in TEXTS]
    assert decoded[2].startswith("«EMOJI 🦙 OUTSIDE THE BMP»")


def test_a_model_failing_to_load_on_a_running_server_is_a_clear_error_and_not_ready(echo_server):
    with pytest.raises(TritonModelLoadError) as info:
        echo_server.load_model("broken")
    err = info.value
    assert err.exit_code == ExitCode.ENGINE
    assert (
        err.message
        == "Triton could not load model 'broken': Internal: RuntimeError: weights file is missing: /nowhere/w.bin"
    )
    lines = [row[0] for row in err.details[0].rows]
    assert any(line.strip().endswith("model.py(3): initialize") for line in lines), lines
    assert str(echo_server.log_path) in err.hint
    assert not echo_server.is_model_ready("broken")
    assert echo_server.is_model_ready("echo")  # the other model still serves
    client = httpclient.InferenceServerClient(echo_server.http_url)
    try:
        states = {m["name"]: m for m in client.get_model_repository_index()}
    finally:
        client.close()
    assert states["broken"]["state"] == "UNAVAILABLE" and "weights file is missing" in states["broken"]["reason"]


def test_a_model_failing_at_start_names_the_model_and_leaves_nothing_running(model_repo, triton_install, tmp_path):
    repo = model_repo(echo=ECHO_MODEL, broken=BROKEN_MODEL)
    server = TritonServer(repo, ["echo", "broken"], install=triton_install, workdir=tmp_path / "work")
    with pytest.raises(TritonModelLoadError) as info:
        server.start()
    err = info.value
    assert err.message.startswith("Triton could not load model 'broken': ")
    assert "weights file is missing: /nowhere/w.bin" in err.message
    lines = [row[0] for row in err.details[0].rows]
    assert any("model.py(3): initialize" in line for line in lines), lines
    assert not any("NVML" in line or "CudaDriverHelper" in line for line in lines)
    assert server.pgid is not None and group_members(server.pgid) == []
    assert processes_mentioning(str(repo)) == []
    assert _shm_regions(server) == []
    assert server.log_path.is_file()  # kept for reading: the hint points at it
    assert str(server.log_path) in err.hint


def test_a_server_that_cannot_start_is_a_start_error(model_repo, triton_install, tmp_path):
    repo = model_repo(echo=ECHO_MODEL)
    server = TritonServer(repo, ["echo"], install=triton_install, extra_args=["--no-such-flag"], workdir=tmp_path / "w")
    with pytest.raises(TritonStartError, match="exited with code"):
        server.start()
    assert server.pgid is not None and group_members(server.pgid) == []


def test_stop_leaves_no_server_or_stub_and_no_shared_memory(model_repo, triton_install):
    repo = model_repo(echo=ECHO_MODEL)
    server = TritonServer(repo, ["echo"], install=triton_install)
    with server:
        members = server.processes()
        assert len(members) >= 2  # tritonserver and the model's Python-backend stub
        assert any("triton_python_backend_stub" in c for c in processes_mentioning(str(repo)))
        assert _shm_regions(server)
        workdir = server.workdir
    assert server.processes() == []
    assert all(not Path(f"/proc/{pid}").exists() or _is_zombie(pid) for pid in members)
    assert processes_mentioning(str(repo)) == []
    assert _shm_regions(server) == []
    assert not workdir.exists()  # llmserve's own working folder goes after a clean run


def test_a_server_that_will_not_stop_is_killed_with_its_stubs(model_repo, triton_install, caplog):
    repo = model_repo(hang=HANGING_MODEL)
    # Triton would wait 600 s for the in-flight request; llmserve waits stop_timeout (+5 s), then kills the group.
    server = TritonServer(
        repo, ["hang"], install=triton_install, stop_timeout=2, extra_args=["--exit-timeout-secs=600"]
    )
    server.start()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"hang"], dtype=np.object_))
    answers: list[object] = []
    client.async_infer("hang", [inp], callback=lambda result, error: answers.append(error or result))
    time.sleep(1.0)  # the request is inside execute()
    assert answers == []
    assert len(server.processes()) >= 2  # tritonserver and the busy stub
    with caplog.at_level(logging.WARNING, logger="llmserve.serve.triton"):
        server.stop()
    client.close()
    assert "killing it" in caplog.text
    assert server.processes() == []
    assert processes_mentioning(str(repo)) == []
    assert _shm_regions(server) == []


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_the_server_environment_puts_the_triton_env_first(echo_server, triton_env):
    env = echo_server.install.environment(dict(os.environ))
    assert env["PATH"].split(os.pathsep)[0] == str(triton_env / "bin")
