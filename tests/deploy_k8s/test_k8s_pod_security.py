"""The pods llmserve renders for Kubernetes pass the restricted Pod Security Standard, enforced by a real
kube-apiserver's admission (the `restricted_api` fixture: a PodSecurityPolicy written to the standard).

Each pod template of a rendered Deployment is created as a Pod with server-side dry run: the whole
admission chain runs, nothing is stored. An admitted pod must come back with the security settings we
sent (the policy had nothing to default: the manifest meets it as written). A pod that breaks one rule
must be refused, so this test fails when the policy stops biting.
"""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llmserve.deploy.kubernetes import manifests

STORE_REF = "s3://models/prod/sha256:" + "a" * 64


def _deployment(**spec) -> dict:
    store = spec.pop("store", False)
    host = manifests.Hosting(*spec.pop("host", ("vllm",)))
    return manifests.deployment(
        namespace="ns", object_name="m-v1", name="m", strategy="versioned", version=1, color=None, replicas=1,
        spec=manifests.PodSpec(**spec), package="s3://models/prod/m:1" if store else "/p/m-1.llmpkg",
        digest="a" * 64, interface={}, model_id="m", rollout=1, drain_timeout_s=5, health_timeout_s=60,
        store_ref=STORE_REF if store else None, api_key_secret=("m-api-key", "api-key"), host=host,
    )  # fmt: skip


VARIANTS = {
    "package-in-image": {},
    "store-pull-init-container": {"store": True, "store_secret": "model-store"},
    "gpu-models-pvc-cache-pvc": {"store": True, "gpus": 2, "models_pvc": "models", "cache_pvc": "fsx"},
    # Triton's own ports and probes, a memory-backed /dev/shm for its Python-backend stubs
    "triton-standalone": {"host": ("triton", "standalone")},
}


def _pod(deployment: dict) -> dict:
    t = deployment["spec"]["template"]
    name = f"p-{uuid.uuid4().hex[:8]}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": t["metadata"]["labels"]},
        "spec": t["spec"],
    }


@pytest.fixture(scope="module")
def restricted_ns(restricted_api) -> str:
    ns = f"r-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(restricted_api).create_namespace({"metadata": {"name": ns}})
    return ns


def _dry_run(api, ns: str, pod: dict) -> dict:
    created = client.CoreV1Api(api).create_namespaced_pod(ns, pod, dry_run="All")
    return api.sanitize_for_serialization(created)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_pods_are_admitted_as_written(restricted_api, restricted_ns, variant):
    sent = _pod(_deployment(**VARIANTS[variant]))
    got = _dry_run(restricted_api, restricted_ns, sent)
    assert got["metadata"]["annotations"]["kubernetes.io/psp"] == "restricted"
    assert got["spec"]["securityContext"] == sent["spec"]["securityContext"]
    containers = sent["spec"]["containers"] + sent["spec"].get("initContainers", [])
    assert len(containers) == (2 if VARIANTS[variant].get("store") else 1)
    back = {c["name"]: c for c in got["spec"]["containers"] + got["spec"].get("initContainers", [])}
    for c in containers:
        assert back[c["name"]]["securityContext"] == c["securityContext"], c["name"]  # nothing defaulted
        assert set(c["resources"]["limits"]) >= {"cpu", "memory"}, c["name"]
    assert got["spec"]["automountServiceAccountToken"] is False
    assert not any(v.get("projected") or v.get("secret") for v in got["spec"]["volumes"])  # no token volume


def _break(pod: dict, how: str) -> dict:
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    server = spec["containers"][0]
    if how == "no-seccomp":
        spec["securityContext"].pop("seccompProfile")
        server["securityContext"].pop("seccompProfile")
    elif how == "root":
        server["securityContext"]["runAsUser"] = 0
        server["securityContext"].pop("runAsNonRoot")
        spec["securityContext"].pop("runAsNonRoot")
    elif how == "privilege-escalation":
        server["securityContext"]["allowPrivilegeEscalation"] = True
    elif how == "writable-root":
        server["securityContext"]["readOnlyRootFilesystem"] = False
    elif how == "capability":
        server["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    elif how == "host-path":
        spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    elif how == "unhardened":  # the manifests before hardening: no security settings at all
        spec.pop("securityContext")
        server.pop("securityContext")
    return pod


@pytest.mark.parametrize(
    "how", ["no-seccomp", "root", "privilege-escalation", "writable-root", "capability", "host-path", "unhardened"]
)
def test_a_pod_breaking_the_policy_is_refused(restricted_api, restricted_ns, how):
    bad = _break(_pod(_deployment()), how)
    with pytest.raises(ApiException) as err:
        _dry_run(restricted_api, restricted_ns, bad)
    assert err.value.status == 403, err.value.body
    assert "PodSecurityPolicy: unable to admit pod" in json.loads(err.value.body)["message"]
