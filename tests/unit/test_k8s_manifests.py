"""The Kubernetes target's rendered Deployments: image references, hardening, resources, API key."""

from __future__ import annotations

import json

import pytest

from llmserve.deploy.kubernetes import manifests


def _render(spec: manifests.PodSpec, **kw) -> dict:
    args = dict(
        namespace="ns", object_name="m-red", name="m", strategy="red-black", version=2, color="red", replicas=1,
        spec=spec, package="/p/m-2.llmpkg", digest="a" * 64, interface={}, model_id="m", rollout=1,
        drain_timeout_s=5, health_timeout_s=60,
    )  # fmt: skip
    return manifests.deployment(**(args | kw))


def _containers(body: dict) -> list[dict]:
    pod = body["spec"]["template"]["spec"]
    return pod["containers"] + pod.get("initContainers", [])


@pytest.mark.parametrize(
    "image",
    [
        "tiny-chat:2",
        "localhost:5000/tiny-chat:2@sha256:" + "0123456789abcdef" * 4,
        "registry.example.com:443/team/llm/tiny-chat@sha256:" + "f" * 64,
        "llmserve:latest",
    ],
)
def test_an_image_reference_from_llmserve_build_is_used_unchanged(image):
    body = _render(manifests.PodSpec(image=image), store_ref="s3://b/p/sha256:" + "a" * 64)
    assert [c["image"] for c in _containers(body)] == [image, image]  # server and the pull init container
    # it survives the YAML round trip as a string (a digest's ':' or a numeric tag do not change its type)
    assert json.loads(json.dumps(body))["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_every_container_is_hardened_and_writes_only_to_scratch_volumes():
    body = _render(manifests.PodSpec(gpus=1), store_ref="s3://b/p/sha256:" + "a" * 64)
    pod = body["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": manifests.RUN_AS,
        "runAsGroup": manifests.RUN_AS,
        "fsGroup": manifests.RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    for c in _containers(body):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True and sc["privileged"] is False
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts[manifests.HOME] == "home" and mounts["/tmp"] == "tmp"
        env = {e["name"]: e.get("value") for e in c["env"]}
        # every place the server and the engine write (caches, temp files) lies on a writable volume
        for var in ("HOME", "XDG_CACHE_HOME", "LLMSERVE_CACHE", "TMPDIR"):
            assert any(env[var] == p or env[var].startswith(p + "/") for p in mounts), var
    for name in ("home", "tmp"):
        assert volumes[name]["emptyDir"]["sizeLimit"] == "8Gi"
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}  # GPU pods: NCCL's /dev/shm


def test_limits_default_to_the_requests_and_can_be_set():
    (server,) = _containers(_render(manifests.PodSpec(cpu="2", memory="8Gi", gpus=1)))
    assert server["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
    }
    body = _render(
        manifests.PodSpec(cpu="2", memory="8Gi", cpu_limit="4", memory_limit="12Gi", gpus=1),
        store_ref="s3://b/p/sha256:" + "a" * 64,
    )
    server, pull = _containers(body)
    assert server["resources"]["limits"] == {"cpu": "4", "memory": "12Gi", "nvidia.com/gpu": "1"}
    assert pull["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "12Gi"}}


def test_the_api_key_comes_from_a_secret_never_inline():
    body = _render(manifests.PodSpec(), api_key_secret=("m-api-key-3", "api-key"))
    (server,) = _containers(body)
    (key,) = [e for e in server["env"] if e["name"] == "LLMSERVE_API_KEY"]
    assert key == {
        "name": "LLMSERVE_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "m-api-key-3", "key": "api-key", "optional": False}},
    }
    assert not any("api-key" in a or "api_key" in a for a in server["args"])
    assert body["metadata"]["annotations"][manifests.A_API_KEY] == "m-api-key-3:api-key"
    (open_server,) = _containers(_render(manifests.PodSpec()))
    assert "LLMSERVE_API_KEY" not in {e["name"] for e in open_server["env"]}


@pytest.mark.parametrize(
    ("host", "live"),
    [
        (manifests.Hosting("vllm", "embedded"), "/health"),
        (manifests.Hosting("triton", "embedded"), "/health"),
        (manifests.Hosting("triton", "standalone"), "/v2/health/live"),
    ],
)
def test_the_liveness_probe_reads_the_route_that_fails_on_a_dead_or_hung_engine(host, live):
    """llmserve's /health answers 503 once its engine is dead or hung (and the server then exits 7: tests/serve/
    test_engine_liveness.py). Standalone Triton's pods probe Triton's own route; the llmserve process that runs Triton
    exits when Triton or a model stops serving, which restarts the container just the same."""
    (server,) = _render(manifests.PodSpec(), host=host)["spec"]["template"]["spec"]["containers"]
    probe = server["livenessProbe"]
    assert probe["httpGet"] == {"path": live, "port": "http"}
    # the kubelet restarts the container after period x threshold seconds of failures: within minutes
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 300


def test_health_answers_503_for_an_engine_that_is_not_healthy():
    from dataclasses import dataclass

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from llmserve.serve.readiness import Readiness
    from llmserve.serve.routing import operations_router

    @dataclass
    class Engine:  # what Readiness reads of an engine handle
        healthy: bool

    readiness = Readiness()
    app = FastAPI()
    app.include_router(operations_router(readiness, None))
    client = TestClient(app)
    engine = Engine(True)
    readiness.set_ready(engine)
    assert client.get("/health").status_code == 200
    engine.healthy = False  # the engine core died, or stopped answering its pings (llmserve.serve.server)
    answer = client.get("/health")
    assert answer.status_code == 503 and answer.json() == {"status": "engine-error"}
