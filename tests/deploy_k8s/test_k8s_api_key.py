"""The API key on the `kubernetes` target: pods read it from a Secret, and a rollout never changes it silently.

End to end on the test cluster: a pod whose server really runs (node agent), reached through its
Service's ready endpoint, refuses a request without the key (401) and serves one with it; the key is in
no manifest and no process argument. Rollouts (pods marked ready without running) keep the live key when
given none, refuse a different key unless --rotate-api-key confirms it, and `deploy down` removes the
Secrets llmserve created.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest
import tritonclient.grpc as grpcclient
from kubernetes import client
from support.cli import run_cli_json
from tritonclient.utils import InferenceServerException

MODEL = "tiny-chat"
KEY = "k8s-test-key-0123456789abcdef"
FAST = ("--pause", "0.5", "--drain-timeout", "1")
ANN = "llmserve.dev/api-key-secret"

pytestmark = pytest.mark.timeout(900)


def _secret(kube_api, ns: str, name: str, data: dict[str, str]) -> None:
    client.CoreV1Api(kube_api).create_namespaced_secret(
        ns, {"metadata": {"name": name}, "stringData": data, "type": "Opaque"}
    )


def _live(kube_api, ns) -> dict[str, tuple[str, str | None]]:
    """Deployment -> (model version, the Secret its pods read the key from)."""
    return {
        d.metadata.name: (d.metadata.labels["llmserve.dev/model-version"], (d.metadata.annotations or {}).get(ANN))
        for d in client.AppsV1Api(kube_api).list_namespaced_deployment(ns).items
    }


def _secret_value(kube_api, ns, ref: str) -> str:
    name, key = ref.split(":")
    return base64.b64decode(client.CoreV1Api(kube_api).read_namespaced_secret(name, ns).data[key]).decode()


def test_pods_refuse_requests_without_the_key_from_the_secret(kcli, kube_api, node_agent, store, tmp_path):
    ns = kcli.namespace
    node_agent.run.add(ns)
    _secret(kube_api, ns, "model-key", {"api-key": KEY})
    # the pods pull the package from the store (test_k8s_store's moto server), its settings from a Secret
    _secret(kube_api, ns, "model-store", {k: v for k, v in store["env"].items() if not k.endswith("_FILE")})
    rc, _out, text = run_cli_json(
        "deploy",
        *kcli.args(store["ref"], "--store-secret", "model-store", "--cache", str(tmp_path / "cli-cache"),
                   "--api-key-secret", "model-key", "--health-timeout", "300", *FAST),
        env={**kcli.env(), **store["env"]}, timeout=400,
    )  # fmt: skip
    assert rc == 0, text
    assert KEY not in text

    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    (dep,) = apps.list_namespaced_deployment(ns).items
    assert KEY not in json.dumps(kube_api.sanitize_for_serialization(dep))
    server = dep.spec.template.spec.containers[0]
    (ref,) = [e.value_from.secret_key_ref for e in server.env if e.name == "LLMSERVE_API_KEY"]
    assert (ref.name, ref.key) == ("model-key", "api-key")

    # through the Service: its ready endpoint is the pod (no kube-proxy here: the node agent routes pod IPs)
    ep = core.read_namespaced_endpoints(MODEL, ns)
    (addr,) = [a.ip for s in ep.subsets or [] for a in s.addresses or []]
    base = f"http://{node_agent.address_of(addr)}:8000"
    body = {"text_input": "hi", "parameters": {"max_tokens": 3}}
    url = f"{base}/v2/models/{MODEL}/generate"
    assert httpx.post(url, json=body, timeout=60).status_code == 401
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}, timeout=60).status_code == 401
    r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    # KServe v2 gRPC on the same pod: the same key, as call metadata
    grpc = grpcclient.InferenceServerClient(f"{node_agent.address_of(addr)}:8001")
    try:
        with pytest.raises(InferenceServerException):
            grpc.get_model_metadata(MODEL)
        assert grpc.get_model_metadata(MODEL, headers={"authorization": f"Bearer {KEY}"}).name == MODEL
    finally:
        grpc.close()
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200  # probes need no key

    (pod,) = [p for p in core.list_namespaced_pod(ns).items if p.metadata.deletion_timestamp is None]
    runner = node_agent.runners[pod.metadata.uid]
    assert KEY not in " ".join(runner.proc.args) and KEY not in runner.log_of("server")


def test_a_rollout_keeps_the_key_and_refuses_to_change_it_unless_rotated(kcli, kube_api, k8s_packages, tmp_path):
    ns = kcli.namespace
    rc, out, text = kcli.run("deploy", str(k8s_packages["v1"]), *FAST, "--health-timeout", "30")
    assert rc == 0, text
    ((ver, generated),) = _live(kube_api, ns).values()
    assert ver == "1" and generated and generated.startswith(f"{MODEL}-api-key-")  # authenticated by default
    first = _secret_value(kube_api, ns, generated)
    assert len(first) >= 32 and first not in text

    # a key from the environment that differs from the live one: refused, nothing moves
    other = {**kcli.env(), "LLMSERVE_API_KEY": "another-key-entirely"}
    rc, out, text = run_cli_json("deploy", *kcli.args(str(k8s_packages["v2"]), *FAST), env=other)
    assert rc != 0 and out["error"] == "invalid-deploy-input", text
    assert "--rotate-api-key" in out["hint"] and "another-key-entirely" not in text
    assert list(_live(kube_api, ns).values()) == [("1", generated)]

    # no key option (a shell without the key): the live key stays
    rc, out, text = kcli.run("deploy", str(k8s_packages["v2"]), *FAST, "--health-timeout", "30")
    assert rc == 0, text
    assert list(_live(kube_api, ns).values()) == [("2", generated)]

    # the same key from a file is no change; another Secret is, until --rotate-api-key
    key_file = tmp_path / "key"
    key_file.write_text(first + "\n")
    key_file.chmod(0o600)
    rc, out, text = kcli.run("deploy", str(k8s_packages["v3"]), "--api-key-file", str(key_file), *FAST)
    assert rc == 0, text
    assert list(_live(kube_api, ns).values()) == [("3", generated)]
    _secret(kube_api, ns, "rotated", {"token": "rotated-key-value"})
    rc, out, text = kcli.run("deploy", str(k8s_packages["v2"]), "--api-key-secret", "rotated:token", *FAST)
    assert rc != 0 and "--rotate-api-key" in out["hint"], text
    assert list(_live(kube_api, ns).values()) == [("3", generated)]
    rc, out, text = kcli.run(
        "deploy", str(k8s_packages["v2"]), "--api-key-secret", "rotated:token", "--rotate-api-key", *FAST
    )
    assert rc == 0, text
    assert list(_live(kube_api, ns).values()) == [("2", "rotated:token")]
    assert generated.split(":")[0] not in _secrets(kube_api, ns)  # the rotated-out key is not kept

    # a missing Secret is a clear error before anything changes
    rc, out, text = kcli.run("deploy", str(k8s_packages["v1"]), "--api-key-secret", "nope", "--rotate-api-key", *FAST)
    assert rc != 0 and "Secret nope" in out["message"], text

    # rotated again, to a key from a file: llmserve keeps it in a Secret of its own
    key_file.write_text("the-third-key-0123456789")
    rc, out, text = kcli.run(
        "deploy", str(k8s_packages["v3"]), "--api-key-file", str(key_file), "--rotate-api-key", *FAST
    )
    assert rc == 0, text
    ((ver, created),) = _live(kube_api, ns).values()
    assert ver == "3" and created.startswith(f"{MODEL}-api-key-") and created != generated
    assert _secret_value(kube_api, ns, created) == "the-third-key-0123456789"

    # down removes the Secret llmserve created, never the operator's
    rc, out, text = kcli.run("deploy", "down", MODEL, "--drain-timeout", "1")
    assert rc == 0, text
    names = _secrets(kube_api, ns)
    assert created.split(":")[0] not in names and "rotated" in names


def _secrets(kube_api, ns) -> set[str]:
    return {s.metadata.name for s in client.CoreV1Api(kube_api).list_namespaced_secret(ns).items}
