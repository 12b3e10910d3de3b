"""KServe v2 gRPC through the local gateway, with the real `tritonclient.grpc` client against real
`llmserve serve` processes: one deployment of two versions (v1 the default, v2 versioned beside it),
made once for the module. Calls pinned to a version reach that version's server (the response's
model_version says which), a ModelStreamInfer stream goes through, calls without the key are refused,
and calls naming no version split by the default pool's weights, counted in the gateway's stats."""

from __future__ import annotations

import contextlib
import queue

import pytest
import tritonclient.grpc as grpcclient
from deploy_helpers import MODEL
from deploy_helpers import auth as http_auth
from support.kserve_inputs import text_inputs
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(600)

ONE_TOKEN = {"max_tokens": 1, "temperature": 0}


def inputs(prompt: str, sampling: dict, stream: bool | None = None) -> list:
    return text_inputs(grpcclient, prompt, sampling=sampling, stream=stream)


@pytest.fixture(scope="module")
def deployed(cli, deploy_packages) -> dict:
    """v1 deployed (default pool, 100%), then v2 versioned beside it (reachable by its number only)."""
    rc, _, text = cli.run("deploy", str(deploy_packages["v1"]), "--pause", "0")
    assert rc == 0, text
    rc, _, text = cli.run("deploy", str(deploy_packages["v2"]), "--strategy", "versioned")
    assert rc == 0, text
    status = cli.status()
    assert status["gateway"]["grpc"] and status["config"]["grpc_port"], status["gateway"]
    return status


def auth(status: dict) -> dict[str, str]:
    """The deployment's key as gRPC metadata (keys are lower case there)."""
    return {"authorization": http_auth(status)["Authorization"]}


@pytest.fixture()
def client(deployed):
    with grpcclient.InferenceServerClient(deployed["gateway"]["grpc"]) as c:
        yield c


def served_version(client, headers: dict, **kw) -> str:
    result = client.infer(MODEL, inputs("hello", ONE_TOKEN), headers=headers, **kw)
    assert result.as_numpy("text_output")[0]  # a real generation came back
    return result.get_response().model_version


def test_unary_calls_reach_the_version_they_name(deployed, client):
    key = auth(deployed)
    # the request's model_version field, or the x-model-version metadata (which wins, as the header does on HTTP)
    assert served_version(client, key, model_version="2") == "2"
    assert served_version(client, key, model_version="1") == "1"
    assert served_version(client, {**key, "x-model-version": "2"}) == "2"
    # the metadata picks the server; a server refuses a request for a version that is not its own
    with pytest.raises(InferenceServerException) as info:
        served_version(client, {**key, "x-model-version": "1"}, model_version="2")
    assert info.value.status() == "StatusCode.NOT_FOUND" and "available version: 1" in info.value.message()
    assert served_version(client, key) == "1"  # no version: the default pool (v1 only)
    assert client.get_model_metadata(MODEL, "2", headers=key).versions == ["2"]
    assert client.get_model_metadata(MODEL, headers=key).versions == ["1"]
    with pytest.raises(InferenceServerException) as info:
        served_version(client, key, model_version="9")
    assert info.value.status() == "StatusCode.NOT_FOUND" and "version 9" in info.value.message()
    # health, answered by the gateway without a key, as `llmserve serve` answers it
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "2")
    assert not client.is_model_ready(MODEL, "9") and not client.is_model_ready("no-such-model")


def test_a_stream_goes_through_to_the_version_named(deployed, client):
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)), headers=auth(deployed))
    try:
        sampling = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
        for rid in ("a", "b"):
            client.async_stream_infer(
                MODEL, inputs("once upon", sampling, stream=True), request_id=rid, model_version="2"
            )
        finals, deltas = set(), []
        while finals != {"a", "b"}:
            result, error = responses.get(timeout=120)
            assert error is None, error
            resp = result.get_response()
            assert resp.model_version == "2"
            deltas.append(resp.id)
            if resp.parameters["triton_final_response"].bool_param:
                finals.add(resp.id)
    finally:
        client.stop_stream()
    assert len(deltas) > 2  # token by token, not one answer per request


def test_calls_without_the_key_are_refused(deployed, client):
    for headers in (None, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        with pytest.raises(InferenceServerException) as info:
            served_version(client, headers, model_version="1")
        assert info.value.status() == "StatusCode.UNAUTHENTICATED", info.value
        with pytest.raises(InferenceServerException) as info:
            client.get_model_metadata(MODEL, headers=headers)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    errors: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: errors.put(error))
    try:
        # refused as the stream opens: the send itself may already see the stream closed
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer(MODEL, inputs("x", ONE_TOKEN))
        assert "UNAUTHENTICATED" in str(errors.get(timeout=60))
    finally:
        client.stop_stream()


def test_unversioned_calls_split_by_weight(cli, deployed, client):
    """The default pool's weights, as a red-black step sets them, apply to gRPC as to HTTP (smooth weighted
    round robin: 75/25 is exactly 3 in 4), and gRPC calls count in the gateway's per-backend stats."""
    from llmserve.deploy.local_target import LocalTarget
    from llmserve.deploy.state import StateStore

    store = StateStore(cli.state_dir)
    target = LocalTarget(store)
    dep = store.require(MODEL)
    _gen, before = store.routes(MODEL)
    v1, v2 = before.pinned[1][0], before.pinned[2][0]
    split = type(before).from_dict(before.to_dict())
    split.default = [type(v1)(v1.instance, 1, v1.url, 75), type(v2)(v2.instance, 2, v2.url, 25)]
    counts0 = target.stats(dep)["counts"]
    target.apply_routes(dep, split, why="test: a 75/25 step")
    try:
        seen = [served_version(client, auth(deployed)) for _ in range(8)]
    finally:
        target.apply_routes(dep, before, why="test: back")
    assert sorted(seen) == ["1"] * 6 + ["2"] * 2, seen
    counts = target.stats(dep)["counts"]
    ok = {i: counts[str(i)]["ok"] - counts0.get(str(i), {}).get("ok", 0) for i in (v1.instance, v2.instance)}
    assert ok == {v1.instance: 6, v2.instance: 2}
    assert all(n == 0 for n in target.stats(dep)["inflight"].values())


def test_the_version_field_is_read_from_the_raw_bytes():
    """No process needed: the one field the proxy reads, from messages serialized by the real protobuf classes."""
    from tritonclient.grpc import service_pb2 as pb

    from llmserve.deploy.grpc_proxy import string_field

    infer = pb.ModelInferRequest(model_name=MODEL, model_version="2", id="r")
    infer.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    infer.raw_input_contents.append(b"\x05\x00\x00\x00hello" * 1000)
    data = infer.SerializeToString()
    assert string_field(data, 2) == "2" and string_field(data, 1) == MODEL
    assert string_field(pb.ModelInferRequest(model_name=MODEL).SerializeToString(), 2) is None
    ready = pb.ModelReadyRequest(name=MODEL, version="7").SerializeToString()
    assert string_field(ready, 2) == "7"
    assert string_field(data[:-3], 2) is None  # truncated: the server says what is wrong with it


def test_calls_wait_for_a_restarting_gateway(cli, deployed):
    """kill -9 of the gateway under gRPC load, clients without retries: the watchdog holds the gRPC port's
    socket as it holds the HTTP port's, so calls made while the gateway restarts wait in its backlog and are
    served by the next gateway. Only calls on the connections the killed gateway cut may fail: the one in
    flight, and at most one more that a client started before it saw its connection close ("Socket closed")."""
    import threading
    import time
    from pathlib import Path

    from deploy_helpers import kill_pid

    from llmserve.deploy.state import StateStore

    watchdog = StateStore(cli.state_dir).require(MODEL).gateway_pid

    def gateway() -> list[int]:
        return [int(p) for p in Path(f"/proc/{watchdog}/task/{watchdog}/children").read_text().split()]

    key, stop, ok, failures = auth(deployed), threading.Event(), [0], []

    def calls() -> None:
        with grpcclient.InferenceServerClient(deployed["gateway"]["grpc"]) as c:
            while not stop.is_set():
                try:
                    served_version(c, key)
                    ok[0] += 1
                except InferenceServerException as exc:
                    failures.append(f"{exc.status()} {exc.message()}")

    workers = [threading.Thread(target=calls, daemon=True) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 60
        while ok[0] < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        (killed,) = gateway()
        kill_pid(killed)
        t0, before = time.monotonic(), ok[0]
        while time.monotonic() < t0 + 90 and (ok[0] < before + 10 or gateway() in ([], [killed])):
            time.sleep(0.05)
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    assert gateway() and gateway() != [killed]
    assert ok[0] >= before + 10, (ok[0], before, failures[:5])
    assert len(failures) <= 2 * len(workers), failures[:7]  # without the held socket: ~36,000 UNAVAILABLE
