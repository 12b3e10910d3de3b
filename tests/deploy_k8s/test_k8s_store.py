"""`llmserve deploy s3://.../MODEL:VERSION --target kubernetes`: pods get the package from an init container.

End to end on the test cluster: a real control plane, a real S3 API (moto's server mode), and the node
agent running the pod's containers as processes (its namespace in `node_agent.run`): the init container
runs `llmserve pull` into the pod's emptyDir with the store's settings from a Secret (envFrom), the
server container starts from that cache, becomes ready, and answers a KServe v2 generate request.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from kubernetes import client
from support.cli import run_cli_json

MODEL = "tiny-chat"
SECRET = "testing-secret-key-for-k8s"  # conftest.STORE_SECRET: the store fixture's secret key
FAST = ("--pause", "0.5", "--drain-timeout", "1")

pytestmark = pytest.mark.timeout(900)


def _secret(kube_api, ns: str, name: str, data: dict[str, str]) -> None:
    client.CoreV1Api(kube_api).create_namespaced_secret(
        ns, {"metadata": {"name": name}, "stringData": data, "type": "Opaque"}
    )


def _deploy(kcli, store, *args: str, timeout: float = 600):
    return run_cli_json("deploy", *kcli.args(store["ref"], *args), env={**kcli.env(), **store["env"]}, timeout=timeout)


def test_pods_pull_a_store_reference_in_an_init_container_and_serve(kcli, kube_api, node_agent, store, tmp_path):
    ns = kcli.namespace
    node_agent.run.add(ns)
    keys = {k: v for k, v in store["env"].items() if k != "AWS_CONFIG_FILE" and k != "AWS_SHARED_CREDENTIALS_FILE"}
    _secret(kube_api, ns, "model-store", keys)
    rc, out, text = _deploy(
        kcli, store, "--store-secret", "model-store", "--cache", str(tmp_path / "cli-cache"),
        "--health-timeout", "600", *FAST,
    )  # fmt: skip
    assert rc == 0, text
    assert out["action"] == "deployed"

    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    (dep,) = apps.list_namespaced_deployment(ns).items
    pinned = f"{store['ref'].rsplit('/', 1)[0]}/sha256:{store['digest']}"
    ann = dep.metadata.annotations
    assert ann["llmserve.dev/package"] == store["ref"] and ann["llmserve.dev/digest"] == store["digest"]
    pod_spec = dep.spec.template.spec
    (init,) = pod_spec.init_containers
    assert init.args == ["pull", pinned, "--cache", "/models-cache"]
    assert [e.secret_ref.name for e in init.env_from] == ["model-store"]
    server = pod_spec.containers[0]
    assert server.args[:4] == ["serve", pinned, "--cache", "/models-cache"]
    volumes = {v.name: v for v in pod_spec.volumes}
    assert set(volumes) == {"home", "tmp", "models-cache"} and volumes["models-cache"].empty_dir is not None
    manifest = json.dumps(api_dict(kube_api, dep))
    assert SECRET not in manifest and "testing-key-id" not in manifest  # only the Secret's name

    (pod,) = [p for p in core.list_namespaced_pod(ns).items if p.metadata.deletion_timestamp is None]
    (st,) = pod.status.init_container_statuses
    assert st.state.terminated.exit_code == 0
    runner = node_agent.runners[pod.metadata.uid]
    assert list(runner.volumes["models-cache"].rglob(f"{store['digest']}.llmpkg")), "pulled into the pod's volume"
    # no key option: the deployment got a generated API key, in a Secret the pods read
    secret, key = ann["llmserve.dev/api-key-secret"].split(":")
    api_key = base64.b64decode(core.read_namespaced_secret(secret, ns).data[key]).decode()
    r = httpx.post(
        f"http://{node_agent.address_of(pod.status.pod_ip)}:8000/v2/models/{MODEL}/generate",
        json={"text_input": "hi", "parameters": {"max_tokens": 3}},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["model_name"] == MODEL
    assert SECRET not in runner.log_of("pull") + runner.log_of("server")


def test_a_failing_pull_keeps_the_pod_from_starting_and_is_reported(kcli, kube_api, node_agent, store, tmp_path):
    ns = kcli.namespace
    node_agent.run.add(ns)
    # the Secret points the pods at a store that does not answer; the CLI itself reaches the real one
    _secret(kube_api, ns, "model-store", {**store["env"], "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    rc, out, text = _deploy(
        kcli, store, "--store-secret", "model-store", "--cache", str(tmp_path / "cli-cache"),
        "--health-timeout", "40", *FAST,
    )  # fmt: skip
    assert rc == 7, text
    assert out["error"] == "rollout-failed"
    assert "init container pull failed (exit 8" in out["message"] and "store-unreachable" in out["message"], out
    assert client.AppsV1Api(kube_api).list_namespaced_deployment(ns).items == []  # rolled back: nothing left


def api_dict(kube_api, obj) -> dict:
    return kube_api.sanitize_for_serialization(obj)


def test_manifest_with_a_shared_cache_pvc_and_no_secret():
    from llmserve.deploy.kubernetes import manifests

    ref = "s3://models/prod/sha256:" + "a" * 64
    body = manifests.deployment(
        namespace="ns", object_name="m-v1", name="m", strategy="versioned", version=1, color=None, replicas=2,
        spec=manifests.PodSpec(cache_pvc="fsx-models"), package="s3://models/prod/m:1", digest="a" * 64,
        interface={}, model_id="m", rollout=1, drain_timeout_s=5, health_timeout_s=60, store_ref=ref,
    )  # fmt: skip
    pod = body["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["pull", ref, "--cache", "/models-cache"] and "envFrom" not in init
    assert {"name": "models-cache", "persistentVolumeClaim": {"claimName": "fsx-models"}} in pod["volumes"]
    assert {"name": "models-cache", "mountPath": "/models-cache"} in pod["containers"][0]["volumeMounts"]
    assert body["metadata"]["annotations"]["llmserve.dev/package-uri"] == ref
    # a local package: no init container, no cache volume (as before)
    plain = manifests.deployment(
        namespace="ns", object_name="m-v1", name="m", strategy="versioned", version=1, color=None, replicas=1,
        spec=manifests.PodSpec(), package="/p/m-1.llmpkg", digest="a" * 64, interface={}, model_id="m",
        rollout=1, drain_timeout_s=5, health_timeout_s=60,
    )  # fmt: skip
    assert "initContainers" not in plain["spec"]["template"]["spec"]
    assert [v["name"] for v in plain["spec"]["template"]["spec"]["volumes"]] == ["home", "tmp"]  # scratch only
