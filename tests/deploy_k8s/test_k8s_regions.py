"""Region-by-region rollouts (`llmserve deploy --contexts a,b`) on the real test control plane: two kubeconfig
contexts on the same cluster, each carrying its own namespace, stand in for two regions."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from support.cli import run_cli_json
from support.waiting import wait_until

MODEL = "tiny-chat"
VERSION = "llmserve.dev/model-version"
FAST = ("--pause", "0.3", "--health-timeout", "30", "--drain-timeout", "1", "--steps", "100")


@pytest.fixture
def regions(kubeconfig, kube_api, namespace, node_agent, tmp_path) -> dict:
    """Contexts region-a (the test's namespace) and region-b (a second namespace) in one kubeconfig."""
    core = client.CoreV1Api(kube_api)
    ns_b = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns_b}})
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    base = cfg["contexts"][0]["context"]
    cfg["contexts"] = [
        {"name": "region-a", "context": {**base, "namespace": namespace}},
        {"name": "region-b", "context": {**base, "namespace": ns_b}},
    ]
    cfg["current-context"] = "region-a"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    yield {"kubeconfig": str(path), "a": namespace, "b": ns_b}
    core.delete_namespace(ns_b)


def _cli(regions: dict, *args: str, timeout: float = 300) -> tuple[int, dict | None, str]:
    env = {"KUBECONFIG": regions["kubeconfig"], "PYTHONWARNINGS": "ignore"}
    return run_cli_json(*args, "--target", "kubernetes", env=env, timeout=timeout)


def _served(kube_api, ns: str) -> dict[str, tuple[int, int, str]]:
    apps = client.AppsV1Api(kube_api)
    return {
        d.metadata.name: (d.spec.replicas, d.status.ready_replicas or 0, d.metadata.labels[VERSION])
        for d in apps.list_namespaced_deployment(ns).items
    }


def test_failing_second_region_rolls_back_the_first(regions, kube_api, k8s_packages):
    both = ("--contexts", "region-a,region-b", "--region-pause", "1")
    t0 = time.monotonic()
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v1"]), *both, *FAST)
    assert rc == 0, text
    assert [(r["context"], r["namespace"], r["result"], r["version"]) for r in out["regions"]] == [
        ("region-a", regions["a"], "deployed", 1),
        ("region-b", regions["b"], "deployed", 1),
    ]
    assert all(r["gate"]["failed"] is None and r["gate"]["restarts"] == 0 for r in out["regions"])
    # the pods' IPs are not reachable from here (simulated pod network): the gate says so, and passes
    assert all(r["gate"]["errors"] is None and "unavailable" in r["gate"]["figures"] for r in out["regions"])
    print(f"v1 to two regions: {time.monotonic() - t0:.1f} s")

    # Region b cannot start the second pod a red-black step needs: a quota of one pod in its namespace.
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_resource_quota(
        regions["b"], {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}}
    )
    wait_until(
        lambda: (core.read_namespaced_resource_quota("one-pod", regions["b"]).status.used or {}).get("pods") == "1",
        what="the quota's usage computed by the resourcequota controller",
    )

    t0 = time.monotonic()
    rc, out, text = _cli(
        regions, "deploy", str(k8s_packages["v2"]), *both, *FAST[:2], "--health-timeout", "6", *FAST[4:]
    )
    print(f"v2, region b failing: {time.monotonic() - t0:.1f} s")
    assert rc == 7, text
    assert out["error"] == "regional-rollout-failed" and out["exit_code"] == 7
    a, b = out["regions"]
    assert a["context"] == "region-a" and a["result"] == "deployed" and a["version"] == 2
    assert a["gate"]["failed"] is None
    assert a["rollback"]["action"] == "rolled-back" and a["rollback"]["version"] == 1
    assert b["context"] == "region-b" and b["result"] == "failed" and "rollback" not in b
    assert "0/1 ready" in b["error"]
    assert "region 'region-b' failed" in out["message"] and "rolled back: region-a" in out["message"]

    # Both regions serve v1 again: only v1's Deployment, ready, and no open rollout.
    for ns in (regions["a"], regions["b"]):
        wait_until(lambda ns=ns: [v for (_, _, v) in _served(kube_api, ns).values()] == ["1"], what=f"only v1 in {ns}")
        rc, status, text = run_cli_json(
            "status", MODEL, "--target", "kubernetes", "--namespace", ns, "--no-metrics",
            env={"KUBECONFIG": regions["kubeconfig"], "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
        assert rc == 0, text
        assert [(d["version"], d["ready"], d["replicas"]) for d in status["deployments"]] == [(1, 1, 1)]
        assert status["open_rollout"] is None
        assert status["rollouts"][0]["status"] in ("done", "rolled-back")

    # `llmserve rollback --contexts`: with the quota gone, v2 everywhere, then both regions back to v1.
    core.delete_namespaced_resource_quota("one-pod", regions["b"])
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v2"]), *both, *FAST)
    assert rc == 0, text
    assert [r["version"] for r in out["regions"]] == [2, 2]
    rc, out, text = _cli(
        regions, "rollback", MODEL, "--contexts", "region-a,region-b", "--steps", "100", "--pause", "0.3"
    )
    assert rc == 0, text
    assert [(r["context"], r["result"], r["version"]) for r in out["regions"]] == [
        ("region-a", "rolled-back", 1),
        ("region-b", "rolled-back", 1),
    ]


def test_first_region_of_a_new_deployment_is_removed_when_the_next_fails(regions, kube_api, k8s_packages):
    """A region that had no deployment before is taken down (not left on the new package)."""
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_resource_quota(
        regions["b"], {"metadata": {"name": "no-pod"}, "spec": {"hard": {"pods": "0"}}}
    )
    wait_until(
        lambda: (core.read_namespaced_resource_quota("no-pod", regions["b"]).status.hard or {}).get("pods") == "0",
        what="the quota's status",
    )
    rc, out, text = _cli(
        regions, "deploy", str(k8s_packages["v1"]), "--contexts", "region-a,region-b", "--region-pause", "0.5",
        *FAST[:2], "--health-timeout", "4", *FAST[4:],
    )  # fmt: skip
    assert rc == 7, text
    a, b = out["regions"]
    assert a["result"] == "deployed" and a["rollback"]["action"] == "removed"
    assert b["result"] == "failed"
    wait_until(lambda: not _served(kube_api, regions["a"]), what="region a emptied")
    assert f"{MODEL}-llmserve" not in {cm.metadata.name for cm in core.list_namespaced_config_map(regions["a"]).items}


def test_contexts_and_context_exclude_each_other(regions, k8s_packages):
    rc, out, text = _cli(
        regions, "deploy", str(k8s_packages["v1"]), "--contexts", "region-a,region-b", "--context", "region-a"
    )
    assert rc == 3, text
    assert "exclude each other" in out["message"]
    rc, out, text = _cli(regions, "deploy", str(k8s_packages["v1"]), "--contexts", "region-a,nowhere")
    assert rc == 3, text
    assert "no context 'nowhere'" in out["message"]
