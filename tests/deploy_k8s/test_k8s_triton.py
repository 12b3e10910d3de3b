"""Triton-hosted packages on the `kubernetes` target: the manifests `llmserve deploy --target kubernetes` renders
for them (container ports, probes, /dev/shm, serve arguments), and one pod whose server really runs (node agent)
hosting a Python-backend LLM package in a real Triton 2.51, Ready only once Triton has the model READY, answering
KServe v2 HTTP, gRPC and the OpenAI API through its Service's endpoint with the key from a Secret.

The node agent's "image" is this machine: the pod finds Triton as an image's own installation would be found
(here the Triton environment `make triton-env` builds, named by LLMSERVE_TRITON_ENV in the node's environment).
A missing Triton environment fails the test: it is never skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from kubernetes import client
from support.cli import run_cli_json
from support.processes import processes_mentioning
from tritonclient.utils import InferenceServerException

from llmserve.deploy.kubernetes import manifests
from llmserve.formats.manifest import Manifest
from llmserve.serve.triton import PYTHON_ENV_ENV, locate_tritonserver

REPO = Path(__file__).resolve().parents[2]
TRITON_ENV = Path(os.environ.get(PYTHON_ENV_ENV) or REPO / ".venv-triton")
MODEL = "tiny-py-llm"
KEY = "k8s-triton-key-0123456789abcdef"
FAST = ("--pause", "0.5", "--drain-timeout", "1")
MANIFEST = f"""\
modelId: {MODEL}
modelVersion: 1
backend: python
executionMode: {{mode}}
python:
  frontend: llm-text
  tensors:
    inputs:
      - {{{{name: text_input, datatype: BYTES, dims: [1]}}}}
      - {{{{name: stream, datatype: BOOL, dims: [1], optional: true}}}}
      - {{{{name: sampling_parameters, datatype: BYTES, dims: [1], optional: true}}}}
      - {{{{name: exclude_input_in_output, datatype: BOOL, dims: [1], optional: true}}}}
    outputs:
      - {{{{name: text_output, datatype: BYTES, dims: [-1]}}}}
"""

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def triton_store(tmp_path_factory, triton_packages) -> dict:
    """A moto server with the embedded package pushed (the pod pulls it, as pods of store references do: a
    package path under /tmp would be hidden by the pod's own /tmp), and the settings a client needs."""
    import boto3
    from store.store_helpers import aws_test_env, start_moto, stop
    from support.cli import run_cli

    proc, url = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    home = tmp_path_factory.mktemp("aws")
    env = aws_test_env(url, home, secret="testing-secret")
    try:
        boto3.client(
            "s3", endpoint_url=url, aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1"
        ).create_bucket(Bucket="models")
        p = run_cli("push", triton_packages["embedded"], "s3://models/prod", "-o", "json", env=env)
        assert p.returncode == 0, p.stderr
        yield {"env": env, "ref": f"s3://models/prod/{MODEL}:1"}
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def triton_packages(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """The Python-backend LLM package, executionMode embedded and standalone."""
    from llmserve.packaging import build_package

    tmp = tmp_path_factory.mktemp("k8s-triton")
    out = {}
    for mode in ("embedded", "standalone"):
        src = tmp / mode
        shutil.copytree(tiny_model_dir, src / "model")
        (src / "llmserve.yaml").write_text(MANIFEST.format(mode=mode))
        out[mode] = build_package(src, tmp / f"dist-{mode}").path
    return out


def _server(ns: str, kube_api) -> dict:
    (dep,) = client.AppsV1Api(kube_api).list_namespaced_deployment(ns).items
    return kube_api.sanitize_for_serialization(dep)


def test_manifests_of_triton_packages_have_their_ports_probes_and_shared_memory():
    def render(manifest: dict, gpus: int = 0) -> tuple[dict, dict]:
        host = manifests.Hosting.of(Manifest.model_validate(manifest))
        d = manifests.deployment(
            namespace="ns", object_name="m-v1", name="m", strategy="versioned", version=1, color=None, replicas=1,
            spec=manifests.PodSpec(gpus=gpus), package="/p/m-1.llmpkg", digest="a" * 64, interface={}, model_id="m",
            rollout=1, drain_timeout_s=5, health_timeout_s=60, host=host,
        )  # fmt: skip
        return d, d["spec"]["template"]["spec"]

    base = {"modelId": "m", "modelVersion": 1}
    tensor = [{"name": "X", "datatype": "FP32", "dims": [-1]}]
    python = {**base, "backend": "python", "python": {"tensors": {"inputs": tensor, "outputs": tensor}}}
    vllm = {**base, "backend": "vllm"}
    llm = {**python, "python": {**python["python"], "frontend": "llm-text"}}
    for manifest, host, ports, ready, live, args in (
        (vllm, "vllm", {"http": 8000, "grpc": 8001}, "/health", "/health", ["--openai"]),
        ({**vllm, "engine": "triton"}, "triton", {"http": 8000, "grpc": 8001}, "/health", "/health",
         ["--openai", "--engine", "triton"]),
        (llm, "triton", {"http": 8000, "grpc": 8001}, "/health", "/health", ["--openai", "--engine", "triton"]),
        # python.frontend none: no text generated, KServe v2 only (serve refuses --openai for it)
        ({**python, "python": {**python["python"], "frontend": "none"}}, "triton", {"http": 8000, "grpc": 8001},
         "/health", "/health", ["--engine", "triton"]),
        ({**llm, "executionMode": "standalone"}, "triton-standalone", {"http": 8000, "grpc": 8001, "metrics": 8002},
         "/v2/health/ready", "/v2/health/live", ["--engine", "triton", "--metrics-port", "8002"]),
    ):  # fmt: skip
        d, pod = render(manifest)
        (c,) = pod["containers"]
        assert d["metadata"]["annotations"][manifests.A_HOST] == host
        assert {p["name"]: p["containerPort"] for p in c["ports"]} == ports, host
        assert c["readinessProbe"]["httpGet"] == {"path": ready, "port": "http"}, host
        assert c["startupProbe"]["httpGet"] == {"path": ready, "port": "http"}, host
        assert c["livenessProbe"]["httpGet"] == {"path": live, "port": "http"}, host
        assert c["args"][c["args"].index("--drain-timeout") + 2 :] == args, host
        shm = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert shm == ([{"name": "dshm", "emptyDir": {"medium": "Memory"}}] if host != "vllm" else []), host
        assert ({"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]) == (host != "vllm"), host
        # still hardened: scratch on emptyDirs, read-only root
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp", manifests.HOME}


def test_a_standalone_package_is_refused_while_a_key_is_wanted(kcli, kube_api, triton_packages):
    """Triton's own endpoints take no API key: deploying them with one would leave the key unenforced."""
    rc, _, text = kcli.run("deploy", str(triton_packages["standalone"]), *FAST)
    assert rc == 3, text
    assert "executionMode standalone" in text and "--no-api-key" in text
    ns = kcli.namespace
    assert client.AppsV1Api(kube_api).list_namespaced_deployment(ns).items == []
    secrets = client.CoreV1Api(kube_api).list_namespaced_secret(ns, label_selector="llmserve.dev/api-key=true")
    assert secrets.items == []  # refused before a key was generated


def test_a_triton_pod_becomes_ready_and_serves_through_its_service(
    kcli, kube_api, node_agent, triton_store, monkeypatch, tmp_path
):
    try:
        locate_tritonserver(TRITON_ENV)
    except Exception as exc:  # the Triton environment is part of the test stack (`make triton-env`)
        pytest.fail(f"no Triton for the pod to find ({TRITON_ENV}): {exc}", pytrace=False)
    monkeypatch.setenv(PYTHON_ENV_ENV, str(TRITON_ENV))  # the node's "image" holds Triton (node agent: host env)
    ns = kcli.namespace
    node_agent.run.add(ns)
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(
        ns, {"metadata": {"name": "model-key"}, "stringData": {"api-key": KEY}, "type": "Opaque"}
    )
    store = {k: v for k, v in triton_store["env"].items() if not k.endswith("_FILE")}
    core.create_namespaced_secret(ns, {"metadata": {"name": "model-store"}, "stringData": store, "type": "Opaque"})
    t0 = time.monotonic()
    rc, _, text = run_cli_json(
        "deploy",
        *kcli.args(triton_store["ref"], "--store-secret", "model-store", "--cache", str(tmp_path / "cli-cache"),
                   "--api-key-secret", "model-key", "--health-timeout", "240", *FAST),
        env={**kcli.env(), **triton_store["env"]}, timeout=400,
    )  # fmt: skip
    if rc != 0:
        pods = [r.log_of("server")[-3000:] for r in list(node_agent.runners.values()) if r.ns == ns]
        pytest.fail(f"{text[-3000:]}\nserver logs:\n" + "\n---\n".join(pods[:2]), pytrace=False)
    took = time.monotonic() - t0

    dep = _server(ns, kube_api)
    assert dep["metadata"]["annotations"][manifests.A_HOST] == "triton"
    (pod,) = client.CoreV1Api(kube_api).list_namespaced_pod(ns).items
    runner = node_agent.runners[pod.metadata.uid]
    log = runner.log_of("server")
    assert f"Triton hosts {MODEL} (executionMode embedded)" in log, log[-3000:]
    # Triton wrote only to the pod's scratch volumes: its backend folder under TMPDIR (/tmp), the unpacked
    # package and its model repository under the llmserve cache in HOME
    assert f"--backend-directory={runner.volumes['tmp']}/" in log, log[-3000:]
    assert f"--model-repository={runner.volumes['home']}/" in log, log[-3000:]

    # through the Service: its ready endpoint is the pod (no kube-proxy: the node agent routes pod IPs)
    ep = client.CoreV1Api(kube_api).read_namespaced_endpoints(MODEL, ns)
    (addr,) = [a.ip for s in ep.subsets or [] for a in s.addresses or []]
    (grpc_port,) = [p.port for s in ep.subsets for p in s.ports if p.name == "grpc"]
    host = node_agent.address_of(addr)
    base = f"http://{host}:8000"
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1], "data": [json.dumps({"max_tokens": 3})]},
        ]
    }
    url = f"{base}/v2/models/{MODEL}/infer"
    assert httpx.post(url, json=body, timeout=60).status_code == 401
    r = httpx.post(url, json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"][0]

    # the OpenAI API on the same port (a generating package): chat rendered with the package's template
    chat = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens > 0

    grpc = grpcclient.InferenceServerClient(f"{host}:{grpc_port}")
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
    with pytest.raises(InferenceServerException):
        grpc.infer(MODEL, [tensor])
    result = grpc.infer(MODEL, [tensor], headers={"authorization": f"Bearer {KEY}"})
    assert result.as_numpy("text_output")[0]
    grpc.close()

    rc, _, text = kcli.run("deploy", "down", MODEL, "--drain-timeout", "1")
    assert rc == 0, text
    deadline = time.monotonic() + 60
    while pod.metadata.uid in node_agent.runners and time.monotonic() < deadline:
        time.sleep(0.5)
    assert runner.proc is None or runner.proc.poll() is not None
    deadline = time.monotonic() + 30
    while processes_mentioning(str(runner.dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(runner.dir)) == []  # no tritonserver, no stub left of the pod
    print(f"triton pod ready and rolled out in {took:.1f} s")
