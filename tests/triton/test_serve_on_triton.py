"""`llmserve serve --engine triton`: a real Triton hosts an LLM package (llmserve's vLLM backend inside it) and the
non-LLM example (Triton's Python backend) side by side, in executionMode standalone; real tritonclient calls.

One server is shared by the module (starting it builds a vLLM engine inside Triton: about a minute here); the last
test stops it with SIGTERM and checks that nothing of it is left.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from support.cli import cli_argv, cli_env, run_cli
from support.models import write_vllm_source
from support.processes import processes_mentioning
from triton_models import BROKEN_MODEL
from triton_serving import Served, start_serve, stop, wait_ready
from tritonclient.utils import InferenceServerException

from llmserve.packaging import build_package
from llmserve.packaging.archive import read_member
from llmserve.serve.triton.server import free_ports

REPO = Path(__file__).resolve().parents[2]
SCHEMA = {
    "type": "object",
    "properties": {
        "size": {"enum": ["small", "medium", "large"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["size", "count"],
    "additionalProperties": False,
}


def classifier_package(tmp: Path, mode: str = "standalone", version: int = 1, outputs: str = "") -> Path:
    src = tmp / f"triton-classifier-{mode}-{version}{'-x' if outputs else ''}"
    shutil.copytree(REPO / "examples" / "triton-classifier", src)
    manifest = src / "llmserve.yaml"
    text = manifest.read_text().replace("executionMode: embedded", f"executionMode: {mode}")
    text = text.replace("modelVersion: 1", f"modelVersion: {version}")
    manifest.write_text(text + outputs)
    trained = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), str(src / "train.py"), str(src / "model")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "held-out accuracy" in trained.stdout
    return build_package(src, tmp / "dist").path


@pytest.fixture(scope="module")
def host(tmp_path_factory, tiny_model_dir, triton_env):
    tmp = tmp_path_factory.mktemp("triton-host")
    llm_src = write_vllm_source(tmp / "llm", tiny_model_dir, extra="executionMode: standalone\n")
    llm = build_package(llm_src, tmp / "dist").path
    served = start_serve([llm, classifier_package(tmp)], tmp / "serve.log", triton_env)
    served.packages = [llm]
    try:
        wait_ready(served)
        yield served
    finally:
        stop(served)


def llm_inputs(prompt: str, params: dict, *, stream: bool, module=grpcclient, binary: bool = True, extra=()) -> list:
    """The Triton vLLM backend's input tensors for one generation (`module`: tritonclient.grpc or .http, whose
    tensors take `binary`; `extra`: more BOOL inputs set true, e.g. return_finish_reason)."""
    inputs = []
    for name, datatype, value in (
        ("text_input", "BYTES", np.array([prompt.encode()], dtype=np.object_)),
        ("stream", "BOOL", np.array([stream])),
        ("sampling_parameters", "BYTES", np.array([json.dumps(params).encode()], dtype=np.object_)),
        ("exclude_input_in_output", "BOOL", np.array([True])),
        *((flag, "BOOL", np.array([True])) for flag in extra),
    ):
        tensor = module.InferInput(name, [1], datatype)
        if module is grpcclient:
            tensor.set_data_from_numpy(value)
        else:
            tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    return inputs


def generate(
    served: Served, prompt: str, params: dict, *, stream: bool, headers: dict | None = None
) -> tuple[str, list[InferenceServerException]]:
    """One KServe v2 stream-infer call on the LLM (the Triton vLLM backend's tensors): its text and its errors."""
    inputs = llm_inputs(prompt, params, stream=stream)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc}")
    client.start_stream(lambda result, error: answers.put((result, error)), headers=headers)
    client.async_stream_infer("tiny-chat", inputs, enable_empty_final_response=True)
    parts, errors = [], []
    while True:
        result, error = answers.get(timeout=120)
        if error is not None:
            errors.append(error)
            break
        parts.append(result.as_numpy("text_output")[0].decode())
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return "".join(parts), errors


def test_the_classifier_answers_over_grpc_and_http_next_to_the_llm(host):
    parcels = np.array([[21, 14, 8, 0.6], [88, 61, 44, 14.0], [44, 36, 21, 3.9]], dtype=np.float32)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{host.grpc}")
    assert grpc.is_model_ready("tiny-chat") and grpc.is_model_ready("parcel-classifier")
    features = grpcclient.InferInput("FEATURES", list(parcels.shape), "FP32")
    features.set_data_from_numpy(parcels)
    result = grpc.infer("parcel-classifier", [features])
    assert result.as_numpy("LABEL").tolist() == [b"small", b"large", b"medium"]
    probabilities = result.as_numpy("PROBABILITIES")
    assert probabilities.shape == (3, 3) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    http = httpclient.InferenceServerClient(f"127.0.0.1:{host.http}")
    features = httpclient.InferInput("FEATURES", list(parcels.shape), "FP32")
    features.set_data_from_numpy(parcels)
    assert http.infer("parcel-classifier", [features]).as_numpy("LABEL").tolist() == [b"small", b"large", b"medium"]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_answers_through_triton_validate(host, stream):
    for prompt in ("A parcel:", "héllo ☃ 日本", "Describe the box"):
        params = {"max_tokens": 60, "temperature": 0.8, "seed": 7, "structured_outputs": {"json": SCHEMA}}
        text, errors = generate(host, prompt, params, stream=stream)
        assert not errors, [str(e) for e in errors]
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_constraint_key_works_through_triton(host):
    text, errors = generate(host, "Code:", {"max_tokens": 20, "constraint_regex": "[0-9]{3}-[a-z]{2}"}, stream=False)
    assert not errors and re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text


def test_an_unknown_sampling_key_is_refused_by_name(host):
    text, errors = generate(host, "Hi", {"max_tokens": 4, "temprature": 0.5}, stream=False)
    assert text == "" and len(errors) == 1
    assert "sampling_parameters key 'temprature' is not a known sampling setting" in str(errors[0])


def test_standalone_triton_serves_kserve_itself(host):
    metadata = httpclient.InferenceServerClient(f"127.0.0.1:{host.http}").get_server_metadata()
    assert metadata["name"] == "triton" and metadata["version"] == "2.51.0"
    assert "nv_inference_request_success" in _get(f"http://127.0.0.1:{host.metrics}/metrics")


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_frontends_attach_to_a_running_triton_with_triton_url(host, tmp_path):
    http, grpc = free_ports("127.0.0.1", 2)
    attached = Served(
        subprocess.Popen(
            cli_argv(
                "serve", *host.packages, "--openai", "--port", http, "--grpc-port", grpc,
                "--triton-url", f"127.0.0.1:{host.grpc}", "--triton-http-url", f"127.0.0.1:{host.http}",
            ),
            stdout=(tmp_path / "attached.log").open("wb"),
            stderr=subprocess.STDOUT,
            env=cli_env({"LLMSERVE_API_KEY": ""}),
        ),
        tmp_path / "attached.log", http, grpc, 0,
    )  # fmt: skip
    try:
        wait_ready(attached)
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="none", max_retries=0)
        response_format = {"type": "json_schema", "json_schema": {"name": "parcel", "schema": SCHEMA}}
        answer = client.chat.completions.create(
            model="tiny-chat",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=60,
            response_format=response_format,
        )
        jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMA)
        # KServe v2 over the attached frontends reaches every model of that Triton, the classifier included
        parcels = np.array([[21, 14, 8, 0.6]], dtype=np.float32)
        features = grpcclient.InferInput("FEATURES", list(parcels.shape), "FP32")
        features.set_data_from_numpy(parcels)
        result = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}").infer("parcel-classifier", [features])
        assert result.as_numpy("LABEL").tolist() == [b"small"]
    finally:
        assert stop(attached) == 0
    assert processes_mentioning(f"--grpc-port={host.grpc}"), "stopping the attached frontends leaves Triton running"


def test_zz_sigterm_stops_triton_and_leaves_no_process(host):
    """The last test of the shared server (file order): it stops it."""
    prefix = f"llmserve_triton_{host.proc.pid}_"
    assert processes_mentioning(prefix), "the Python-backend stubs should be running"
    assert stop(host) == 0
    deadline = time.monotonic() + 20
    while processes_mentioning(prefix) or processes_mentioning(f"--grpc-port={host.grpc}"):
        assert time.monotonic() < deadline, processes_mentioning(prefix)
        time.sleep(0.5)
    assert not [p for p in Path("/dev/shm").glob(f"{prefix}*")]
    assert "shutdown: done" in host.text()


def test_a_model_that_fails_to_load_is_named_with_tritons_reason(tmp_path, triton_env):
    src = tmp_path / "broken"
    shutil.copytree(REPO / "examples" / "triton-classifier", src)
    (src / "model.py").write_text(
        BROKEN_MODEL.replace("class TritonPythonModel", "import numpy\n\nclass TritonPythonModel")
    )
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), str(src / "train.py"), str(src / "model")], check=True)
    package = build_package(src, tmp_path / "dist").path
    served = start_serve([package], tmp_path / "serve.log", triton_env)
    assert served.proc.wait(300) == 7, served.text()
    text = served.text()
    assert "Triton could not load model 'parcel-classifier'" in text
    assert "weights file is missing: /nowhere/w.bin" in text
    assert not processes_mentioning(f"llmserve_triton_{served.proc.pid}_")


def test_triton_killed_ends_llmserve_with_the_engine_exit_code(tmp_path, triton_env):
    package = classifier_package(tmp_path)
    served = start_serve([package], tmp_path / "serve.log", triton_env)
    try:
        wait_ready(served)
        pid = _pid_of(f"--grpc-port={served.grpc}")
        os.kill(pid, signal.SIGKILL)
        assert served.proc.wait(60) == 7
        assert "tritonserver exited with code -9" in served.text()
    finally:
        stop(served)
    assert not processes_mentioning(f"llmserve_triton_{served.proc.pid}_")


def test_a_stub_killed_under_load_ends_llmserve_with_the_engine_exit_code(tmp_path, triton_env):
    # Triton 2.51 does not restart a dead Python-backend stub: its model stays READY and fails every request. llmserve
    # must not pretend to be healthy: it exits 7 (the engine died) soon, and leaves no process behind.
    served = start_serve([classifier_package(tmp_path, "embedded")], tmp_path / "serve.log", triton_env)
    answered, failed, done = [0], [0], threading.Event()

    def load() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc}")
        parcels = np.array([[20, 15, 8, 0.5]], dtype=np.float32)
        while not done.is_set():
            try:
                client.infer("parcel-classifier", _features(grpcclient, parcels), client_timeout=30)
                answered[0] += 1
            except InferenceServerException:
                failed[0] += 1
                time.sleep(0.05)

    try:
        wait_ready(served)
        threads = [threading.Thread(target=load, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(2)
        assert answered[0] > 0 and failed[0] == 0
        (stub,) = [p for p in _stub_pids() if f"llmserve_triton_{served.proc.pid}_" in _cmdline(p)]
        killed_at = time.monotonic()
        os.kill(stub, signal.SIGKILL)
        assert served.proc.wait(60) == 7
        assert time.monotonic() - killed_at < 20  # noticed within a supervision tick, not after a drain timeout
        assert f"the Python-backend stub of model 'parcel-classifier' (pid {stub}) died" in served.text()
    finally:
        done.set()
        stop(served)
    assert not processes_mentioning(f"llmserve_triton_{served.proc.pid}_")


def _stub_pids() -> list[int]:
    return [
        int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and "python_backend_stub" in _cmdline(e.name)
    ]


def _cmdline(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _pid_of(text: str) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and "tritonserver" in cmdline.split("\0")[0]:
                return int(entry.name)
    raise AssertionError(f"no tritonserver process with {text}")


def test_engine_choices_are_refused_with_the_way_out(tmp_path, tiny_vllm_package, tiny_vllm_source):
    result = run_cli("serve", tiny_vllm_source, "--engine", "triton")
    assert result.returncode == 3 and "Package it first" in result.stderr, result.stderr
    package = classifier_package(tmp_path, "embedded")
    result = run_cli("serve", package, "--engine", "vllm")
    assert result.returncode == 3 and "--engine triton" in result.stderr, result.stderr
    standalone = classifier_package(tmp_path, "standalone")
    result = run_cli("serve", standalone, "--engine", "triton", "--openai")
    assert result.returncode == 3 and "executionMode standalone has none" in result.stderr, result.stderr
    result = run_cli("serve", tiny_vllm_package, standalone)
    assert result.returncode == 3 and "share their executionMode" in result.stderr, result.stderr


def test_a_package_that_names_triton_as_its_host_is_served_by_triton(tmp_path, tiny_model_dir):
    # No --engine: `engine: {host: triton}` in llmserve.yaml picks Triton for a lone vLLM package (which would
    # otherwise run on the embedded engine), as Triton's refusal of --openai in standalone mode shows.
    src = write_vllm_source(tmp_path / "src", tiny_model_dir, extra="executionMode: standalone\n")
    manifest = src / "llmserve.yaml"
    manifest.write_text(manifest.read_text().replace("engine:\n", "engine:\n  host: triton\n"))
    package = build_package(src, tmp_path / "dist").path
    model_json = json.loads(read_member(package, "model_repository/tiny-chat/1/model.json"))
    assert "host" not in model_json and model_json["max_model_len"] == 512  # Triton's backend never sees `host`
    result = run_cli("serve", package, "--openai")
    assert result.returncode == 3 and "executionMode standalone has none" in result.stderr, result.stderr
    assert "as the packages' engine.host asks" in result.stderr


# --- executionMode embedded: llmserve's KServe v2 frontends in front of a Triton on loopback --------------------

KEY = "s3cret-key"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, tiny_model_dir, triton_env):
    tmp = tmp_path_factory.mktemp("triton-embedded")
    llm = build_package(write_vllm_source(tmp / "llm", tiny_model_dir), tmp / "dist").path
    packages = [llm, classifier_package(tmp, "embedded")]
    served = start_serve(packages, tmp / "serve.log", triton_env, "--openai", api_key=KEY)
    try:
        wait_ready(served)
        yield served
    finally:
        stop(served)


def _features(module, parcels):
    features = module.InferInput("FEATURES", list(parcels.shape), "FP32")
    features.set_data_from_numpy(parcels)
    return [features]


def test_embedded_grpc_needs_the_key_and_forwards_to_triton(embedded):
    parcels = np.array([[20, 15, 8, 0.5]], dtype=np.float32)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{embedded.grpc}")
    assert client.is_server_live() and client.is_model_ready("parcel-classifier")  # probes need no key
    with pytest.raises(InferenceServerException, match="API key"):
        client.infer("parcel-classifier", _features(grpcclient, parcels))
    result = client.infer("parcel-classifier", _features(grpcclient, parcels), headers=AUTH)
    assert result.as_numpy("LABEL").tolist() == [b"small"]
    assert client.get_server_metadata(headers=AUTH).name == "triton"  # Triton answers, through llmserve's port


def test_embedded_grpc_streams_the_llm_through_the_proxy(embedded):
    params = {"max_tokens": 60, "temperature": 0.8, "seed": 3, "structured_outputs": {"json": SCHEMA}}
    text, errors = generate(embedded, "A parcel:", params, stream=True, headers=AUTH)
    assert not errors
    jsonschema.validate(json.loads(text), SCHEMA)


def test_a_one_shot_infer_on_the_llm_is_answered_through_the_proxy(embedded):
    # Triton answers a decoupled model over ModelStreamInfer only; tritonclient's infer() works as on the embedded engine
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{embedded.grpc}")
    params = {"max_tokens": 60, "temperature": 0.8, "seed": 5, "structured_outputs": {"json": SCHEMA}}
    result = client.infer("tiny-chat", llm_inputs("A parcel:", params, stream=False), headers=AUTH, request_id="r-7")
    jsonschema.validate(json.loads(result.as_numpy("text_output")[0].decode()), SCHEMA)
    answer = result.get_response()
    assert answer.id == "r-7" and answer.model_name == "tiny-chat"
    assert "triton_final_response" not in answer.parameters
    with pytest.raises(InferenceServerException, match="ModelStreamInfer") as caught:
        client.infer("tiny-chat", llm_inputs("Hi", {"max_tokens": 40, "ignore_eos": True}, stream=True), headers=AUTH)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException, match="temprature") as caught:
        client.infer("tiny-chat", llm_inputs("Hi", {"temprature": 1}, stream=False), headers=AUTH)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_an_http_infer_on_the_llm_is_answered_through_the_proxy(embedded):
    # Triton refuses /infer on a decoupled model; tritonclient.http's infer() works as on the embedded engine, with
    # binary tensors (its default) and with JSON ones
    client = httpclient.InferenceServerClient(f"127.0.0.1:{embedded.http}")
    params = {"max_tokens": 60, "temperature": 0.8, "seed": 4, "structured_outputs": {"json": SCHEMA}}
    for binary in (True, False):
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("text_output", "finish_reason")]
        inputs = llm_inputs(
            "A parcel ☃:", params, stream=False, module=httpclient, binary=binary, extra=["return_finish_reason"]
        )
        result = client.infer("tiny-chat", inputs, outputs=outputs, headers=dict(AUTH), request_id=f"h-{binary}")
        text, finish = (result.as_numpy(n).reshape(-1)[0] for n in ("text_output", "finish_reason"))
        text, finish = (v.decode() if isinstance(v, bytes) else v for v in (text, finish))
        jsonschema.validate(json.loads(text), SCHEMA)
        assert finish == "stop" and result.get_response()["id"] == f"h-{binary}", result.get_response()
    with pytest.raises(InferenceServerException, match="generate_stream"):
        client.infer(
            "tiny-chat", llm_inputs("Hi", {"max_tokens": 30}, stream=True, module=httpclient), headers=dict(AUTH)
        )
    with pytest.raises(InferenceServerException, match="temprature"):
        client.infer(
            "tiny-chat",
            llm_inputs("Hi", {"temprature": 1}, stream=False, module=httpclient, binary=False),
            headers=dict(AUTH),
        )
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2], "data": ["one"]}]}
    answer = httpx.post(f"http://127.0.0.1:{embedded.http}/v2/models/tiny-chat/infer", json=body, headers=AUTH)
    assert answer.status_code == 400 and "holds 2 element(s)" in answer.json()["error"], answer.text


def test_calls_that_would_change_triton_are_refused_and_probes_stay_open(embedded):
    # loading a model can upload a config and files that run inside the server; unloading one would end llmserve
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{embedded.grpc}")
    files = {"file:1/model.py": b"open('/tmp/llmserve-should-not-exist', 'w')"}
    for call in (
        lambda: grpc.load_model("evil", config='{"backend": "python"}', files=files, headers=AUTH),
        lambda: grpc.unload_model("parcel-classifier", headers=AUTH),
        lambda: grpc.update_log_settings({"log_verbose_level": 1}, headers=AUTH),
        lambda: grpc.register_system_shared_memory("r", "/r", 64, headers=AUTH),
    ):
        with pytest.raises(InferenceServerException, match="not available through llmserve") as caught:
            call()
        assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert grpc.get_log_settings(headers=AUTH) is not None  # reading is fine
    base = f"http://127.0.0.1:{embedded.http}/v2"
    for path in ("repository/models/evil/load", "repository/models/tiny-chat/unload", "logging"):
        answer = httpx.post(f"{base}/{path}", json={"parameters": {"config": "{}"}}, headers=AUTH)
        assert answer.status_code == 501 and "not available through llmserve" in answer.json()["error"], answer.text
    assert grpc.is_model_ready("parcel-classifier") and grpc.is_model_ready("tiny-chat")
    http = httpclient.InferenceServerClient(f"127.0.0.1:{embedded.http}")
    assert http.is_model_ready("tiny-chat")  # a readiness probe needs no key, as over gRPC
    assert httpx.get(f"{base}/models/tiny-chat", headers={}).status_code == 401


def test_malformed_generate_bodies_are_400s_naming_the_problem(embedded):
    url = f"http://127.0.0.1:{embedded.http}/v2/models/tiny-chat"
    for path, body, needle in (
        ("generate", b"{nope", "not valid JSON"),
        ("generate", b"", "not valid JSON"),
        ("generate", b"[1, 2]", "must be a JSON object"),
        ("generate", b'{"text_input": 5}', "'text_input' must be a string"),
        ("generate", b'{"text_input": "x", "parameters": [1]}', "'parameters' must be a JSON object"),
        ("generate", b'{"text_input": "x", "stream": true}', "generate_stream"),
        (
            "generate",
            b'{"text_input": "x", "max_tokens": 3, "parameters": {"max_tokens": 6}}',
            "max_tokens: given both",
        ),
        ("generate_stream", b"{nope", "not valid JSON"),
        # Triton's JSON reader answered these with a 500
        ("generate", b'{"text_input": "x", "exclude_input_in_output": "yes"}', "'exclude_input_in_output' must be"),
        ("generate", b'{"text_input": "x", "return_finish_reason": 1}', "'return_finish_reason' must be"),
        ("generate", b'{"text_input": "x", "id": 5}', "'id' (the request's id) must be a string"),
        ("generate", b'{"text_input": "x", "sampling_parameters": 5}', "'sampling_parameters' must be"),
    ):
        answer = httpx.post(f"{url}/{path}", content=body, headers=AUTH, timeout=60)
        assert answer.status_code == 400 and needle in answer.json()["error"], (path, body, answer.text)
    # the generate extension's request id: Triton passes it on as a parameter too, which the model refused by name
    body = {"text_input": "x", "id": "req-7", "max_tokens": 2, "exclude_input_in_output": True}
    answer = httpx.post(f"{url}/generate", json=body, headers=AUTH, timeout=60)
    assert answer.status_code == 200 and "text_output" in answer.json(), answer.text


def test_embedded_http_needs_the_key_and_forwards_to_triton(embedded):
    parcels = np.array([[90, 60, 45, 15.0]], dtype=np.float32)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{embedded.http}")
    assert client.is_server_ready()
    with pytest.raises(InferenceServerException):
        client.infer("parcel-classifier", _features(httpclient, parcels))
    # a copy: tritonclient's HTTP client adds its own headers (an int length among them) to the dict it is given
    result = client.infer("parcel-classifier", _features(httpclient, parcels), headers=dict(AUTH))
    assert result.as_numpy("LABEL").tolist() == [b"large"]
    import urllib.request

    body = json.dumps({"text_input": "Code:", "parameters": {"max_tokens": 12, "constraint_regex": "[a-z]{4}"}})
    request = urllib.request.Request(
        f"http://127.0.0.1:{embedded.http}/v2/models/tiny-chat/generate", data=body.encode(), headers=AUTH
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.loads(response.read())
    assert re.fullmatch(r"Code:[a-z]{4}", answer["text_output"]), answer
    # an object parameter, as the embedded engine takes it (Triton itself takes only scalars)
    parameters = {"max_tokens": 60, "seed": 2, "structured_outputs": {"json": SCHEMA}, "stop": ["\u0001"]}
    body = json.dumps({"text_input": "A parcel:", "exclude_input_in_output": True, "parameters": parameters})
    request = urllib.request.Request(
        f"http://127.0.0.1:{embedded.http}/v2/models/tiny-chat/generate", data=body.encode(), headers=AUTH
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        jsonschema.validate(json.loads(json.loads(response.read())["text_output"]), SCHEMA)


def test_a_compressed_generate_body_is_read_as_a_plain_one(embedded):
    """The proxy reads a generate body (to send its object parameters as the JSON text Triton passes on): a gzip or
    deflate one is inflated first, within --max-body-bytes, and sent on plain."""
    url = f"http://127.0.0.1:{embedded.http}/v2/models/tiny-chat/generate"
    parameters = {"max_tokens": 60, "seed": 3, "structured_outputs": {"json": SCHEMA}}
    body = json.dumps({"text_input": "A parcel:", "exclude_input_in_output": True, "parameters": parameters}).encode()
    for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        answer = httpx.post(url, content=packed, headers={**AUTH, "Content-Encoding": encoding}, timeout=120)
        assert answer.status_code == 200, (encoding, answer.text)
        jsonschema.validate(json.loads(answer.json()["text_output"]), SCHEMA)
    bomb = gzip.compress(b'{"text_input": "' + b" " * (9 << 20) + b'"}')  # 9 MiB plain, ~9 KB sent
    answer = httpx.post(url, content=bomb, headers={**AUTH, "Content-Encoding": "gzip"}, timeout=60)
    assert answer.status_code == 413 and "--max-body-bytes" in answer.json()["error"], answer.text
    for encoding, packed in (("gzip", b"not gzip"), ("br", body)):
        answer = httpx.post(url, content=packed, headers={**AUTH, "Content-Encoding": encoding}, timeout=60)
        assert answer.status_code == 400, (encoding, answer.text)


def test_embedded_health_and_one_merged_metrics_page(embedded):
    assert _get(f"http://127.0.0.1:{embedded.http}/health") == '{"status":"ready"}'
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{embedded.http}/metrics", headers=AUTH)
    with urllib.request.urlopen(request, timeout=30) as response:
        page = response.read().decode()
    assert "nv_inference_request_success" in page  # Triton's endpoint
    assert "vllm:num_requests_running" in page  # vLLM inside Triton, from the multiprocess folder
    assert "llmserve_ready 1.0" in page
    assert 'llmserve_metrics_source_up{source="triton"} 1.0' in page


def _tokens_generated(served: Served) -> float:
    """vLLM's count of generated tokens (the engine inside Triton), from the merged /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(f"http://127.0.0.1:{served.http}/metrics", headers=AUTH)
    with urllib.request.urlopen(request, timeout=30) as response:
        page = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        if family.name == "vllm:generation_tokens"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def test_a_cancelled_stream_aborts_its_generation_in_the_engine(embedded):
    before = _tokens_generated(embedded)
    params = {"max_tokens": 480, "ignore_eos": True, "temperature": 0.8, "seed": 1}
    inputs = llm_inputs("Tell me everything:", params, stream=True)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{embedded.grpc}")
    client.start_stream(lambda result, error: answers.put((result, error)), headers=AUTH)
    client.async_stream_infer("tiny-chat", inputs)
    _, error = answers.get(timeout=120)
    assert error is None  # it is generating; now the client goes away mid-answer
    client.stop_stream(cancel_requests=True)
    client.close()
    # Not cancelled, the engine would make all 480 tokens (a few seconds here); cancelled, the count stops short.
    deadline, last, stable_since = time.monotonic() + 90, -1.0, time.monotonic()
    while time.monotonic() - stable_since < 2.0:
        assert time.monotonic() < deadline, "the generated-token count never settled"
        now = _tokens_generated(embedded)
        if now != last:
            last, stable_since = now, time.monotonic()
        time.sleep(0.2)
    assert 0 < last - before < params["max_tokens"], "the engine went on generating for a client that left"


def _openai(served: Served):
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{served.http}/v1", api_key=KEY, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_with_a_json_schema_through_triton_validates(embedded, stream):
    client = _openai(embedded)
    assert [m.id for m in client.models.list().data] == ["tiny-chat"]
    response_format = {"type": "json_schema", "json_schema": {"name": "parcel", "schema": SCHEMA, "strict": True}}
    for seed in (1, 2, 3):
        messages = [{"role": "user", "content": f"Describe parcel {seed} ☃"}]
        kwargs = {"model": "tiny-chat", "messages": messages, "max_tokens": 60, "seed": seed, "temperature": 0.9}
        if stream:
            chunks = list(
                client.chat.completions.create(
                    **kwargs, response_format=response_format, stream=True, stream_options={"include_usage": True}
                )
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert chunks[-1].usage.completion_tokens > 0
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        else:
            answer = client.chat.completions.create(**kwargs, response_format=response_format)
            text = answer.choices[0].message.content
            assert answer.choices[0].finish_reason == "stop" and answer.usage.prompt_tokens > 0
        jsonschema.validate(json.loads(text), SCHEMA)


def test_streamed_usage_counts_every_generated_token(embedded):
    # deltas the detokenizer holds back (no text yet) still count: usage matches the tokens generated
    client = _openai(embedded)
    for seed in (1, 2, 3):
        kwargs = {"model": "tiny-chat", "prompt": "Count:", "max_tokens": 16, "seed": seed, "temperature": 1.0}
        kwargs["extra_body"] = {"ignore_eos": True}
        chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == 16, chunks[-1].usage
        assert client.completions.create(**kwargs).usage.completion_tokens == 16


def test_openai_completion_with_a_constraint_key_through_triton(embedded):
    answer = _openai(embedded).completions.create(
        model="tiny-chat", prompt="Code:", max_tokens=12, extra_body={"vllm_xargs": {"constraint_regex": "[0-9]{4}"}}
    )
    assert re.fullmatch(r"[0-9]{4}", answer.choices[0].text), answer
    # counted by the backend: the four digits take 1 to 4 tokens of this vocabulary (it has multi-digit tokens)
    assert 1 <= answer.usage.completion_tokens <= 12 and answer.usage.prompt_tokens > 0


def test_structured_outputs_on_the_openai_routes_through_triton(embedded):
    client = _openai(embedded)
    messages = [{"role": "user", "content": "A parcel"}]
    answer = client.chat.completions.create(
        model="tiny-chat", messages=messages, max_tokens=60, extra_body={"structured_outputs": {"json": SCHEMA}}
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content), SCHEMA)
    import openai

    for extra, needle in (
        ({"guided_json": SCHEMA}, "use response_format"),
        ({"structured_outputs": {"json": SCHEMA}, "response_format": {"type": "json_object"}}, "not both"),
        ({"structured_outputs": {"jsn": SCHEMA}}, "jsn"),
    ):
        with pytest.raises(openai.BadRequestError, match=needle):
            client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=60, extra_body=extra)
    with pytest.raises(openai.BadRequestError, match="one text prompt per request through Triton, got 2"):
        client.completions.create(model="tiny-chat", prompt=["a", "b"], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="'model' is required"):
        client.chat.completions.create(model=None, messages=messages)  # type: ignore[arg-type]


def test_openai_fields_triton_cannot_honour_are_refused_by_name(embedded):
    import openai

    client = _openai(embedded)
    messages = [{"role": "user", "content": "Hi"}]
    for kwargs, name in (
        ({"logprobs": True}, "logprobs"),
        ({"n": 2}, "n"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"extra_body": {"top_k": "many"}}, "top_k"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=4, **kwargs)
        assert name in str(caught.value), caught.value
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="parcel-classifier", messages=messages, max_tokens=4)


def test_zz_embedded_sigterm_leaves_no_process(embedded):
    prefix = f"llmserve_triton_{embedded.proc.pid}_"
    assert processes_mentioning(prefix)
    assert stop(embedded) == 0
    deadline = time.monotonic() + 20
    while processes_mentioning(prefix):
        assert time.monotonic() < deadline, processes_mentioning(prefix)
        time.sleep(0.5)


def test_versions_of_one_model_are_served_by_one_triton_model(tmp_path, triton_env):
    versions = [classifier_package(tmp_path, "embedded", v) for v in (1, 2)]
    served = start_serve(versions, tmp_path / "serve.log", triton_env)
    try:
        wait_ready(served)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.grpc}")
        assert sorted(client.get_model_metadata("parcel-classifier").versions) == ["1", "2"]
        parcels = np.array([[90, 60, 45, 15.0]], dtype=np.float32)
        features = grpcclient.InferInput("FEATURES", list(parcels.shape), "FP32")
        features.set_data_from_numpy(parcels)
        for version in ("1", "2"):
            result = client.infer("parcel-classifier", [features], model_version=version)
            assert result.get_response().model_version == version
            assert result.as_numpy("LABEL").tolist() == [b"large"]
    finally:
        assert stop(served) == 0


def test_versions_whose_configurations_differ_are_refused(tmp_path):
    v1 = classifier_package(tmp_path, "embedded", 1)
    extra = "      - {name: EXTRA, datatype: FP32, dims: [-1]}\n"
    v2 = classifier_package(tmp_path, "embedded", 2, outputs=extra)
    result = run_cli("serve", v1, v2, "--engine", "triton")
    assert result.returncode == 3 and "have different Triton configurations" in result.stderr, result.stderr
