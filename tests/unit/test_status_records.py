"""The typed status and result records (llmserve.deploy.status): both targets' status builders over fakes (a state
folder and no process; a cluster of plain objects), the JSON shape `--output json` has always had (scripts and the
end-to-end tests read these keys), and the CLI's rendering of each record (llmserve.cli.deploy_common)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from rich.console import Console

from llmserve.cli import deploy_common
from llmserve.cli.render import OutputFormat
from llmserve.deploy import procs
from llmserve.deploy import rollout as local_rollout
from llmserve.deploy.kubernetes import autoscale, manifests
from llmserve.deploy.kubernetes import rollout as k8s_rollout
from llmserve.deploy.kubernetes.cluster import L_COLOR, L_STRATEGY, L_VERSION
from llmserve.deploy.kubernetes.state import ClusterRollout, ClusterState
from llmserve.deploy.state import SERVING, DeploymentLock, Member, Routes, StateStore
from llmserve.deploy.status import (
    AutoscalerUnreadable,
    ClusterStatus,
    ClusterTeardown,
    LocalStatus,
    LocalTeardown,
    Outcome,
    Recovery,
    RolloutRecord,
)
from llmserve.errors import LLMServeError

# The documented keys, in order, of each level of the JSON (what the dict builders before these records gave).
LOCAL_KEYS = [
    "deployment", "degraded", "model_id", "state_dir", "gateway", "routes", "config", "auth", "instances",
    "open_rollout", "rollouts", "history",
]  # fmt: skip
GATEWAY_KEYS = ["url", "grpc", "pid", "alive", "generation_applied", "log"]
INSTANCE_KEYS = [
    "instance", "version", "status", "strategy", "url", "pid", "alive", "health", "restarts", "down_since",
    "last_exit", "memory_bytes", "weight", "routable_by_version", "inflight", "last_request", "package", "digest",
    "log",
]  # fmt: skip
LOCAL_ROLLOUT_KEYS = [
    "id", "strategy", "status", "phase", "package", "steps", "step", "from_instance", "to_instance", "message",
    "started", "updated",
]  # fmt: skip
HISTORY_KEYS = ["ts", "kind", "rollout", "message"]
CLUSTER_KEYS = [
    "target", "deployment", "namespace", "context", "server", "model_id", "strategy", "default_version", "config",
    "deployments", "services", "open_rollout", "rollouts", "history", "autoscaler",
]  # fmt: skip
CLUSTER_DEPLOYMENT_KEYS = [
    "object", "strategy", "color", "version", "replicas", "ready", "digest", "package", "package_uri", "rollout",
    "superseded_at",
]  # fmt: skip
SERVICE_KEYS = ["service", "selector", "cluster_ip", "ready_endpoints_by_version", "not_ready_endpoints"]
CLUSTER_ROLLOUT_KEYS = [
    "id", "strategy", "status", "phase", "package", "version", "steps", "plan", "replicas", "message", "started",
    "updated", "step", "from", "to",
]  # fmt: skip
AUTOSCALER_KEYS = [
    "object", "target", "min_replicas", "max_replicas", "metric", "queue_target", "current_value", "current_replicas",
    "desired_replicas", "conditions",
]  # fmt: skip


# -- local target ---------------------------------------------------------------------------------


class FakeLocalTarget:
    """The checks status_of makes of processes, answered without any."""

    def __init__(self, gateway: bool, alive: set[int], stats: dict | None):
        self.gateway, self.alive, self._stats = gateway, alive, stats

    def gateway_alive(self, dep) -> bool:
        return self.gateway

    def stats(self, dep) -> dict | None:
        return self._stats

    def instance_alive(self, inst) -> bool:
        return inst.id in self.alive


@pytest.fixture
def local(tmp_path, monkeypatch):
    """tiny-chat: v1 (instance 1) alive and taking all traffic, v2 (instance 2) routed by version but dead, and
    a red-black rollout to v2 left open by a CLI that is gone."""
    monkeypatch.setattr(procs, "health", lambda url, timeout=2.0: 200)
    monkeypatch.setattr(procs, "rss_bytes", lambda session, pid=None: 3 * 2**29)
    store = StateStore(tmp_path)
    store.create_deployment("tiny-chat", "tiny", "127.0.0.1", 8000, {"grpc_port": 8001, "api_key": "sha256:ab"})
    one = store.add_instance("tiny-chat", 1, "v1.llmpkg", "sha256:11", {}, "red-black", 9001)
    two = store.add_instance("tiny-chat", 2, "v2.llmpkg", "sha256:22", {}, "red-black", 9002)
    store.set_instance_status(one.id, SERVING)
    store.set_instance_status(two.id, SERVING)
    m1, m2 = Member(one.id, 1, one.url, 100), Member(two.id, 2, two.url, 0)
    store.set_routes("tiny-chat", Routes("tiny", [m1], {1: [m1], 2: [m2]}), why="test")
    rid = store.begin_rollout("tiny-chat", "red-black", "v2.llmpkg", one.id, [25, 100], Routes("tiny", [m1]))
    store.journal(rid.id, to_instance=two.id, phase="shifting", step_index=0, event="25% on v2")
    stats = {"generation": 1, "inflight": {str(one.id): 2}, "last_request": {str(one.id): 1000.5}}
    return store, FakeLocalTarget(True, {one.id}, stats)


def test_local_status_has_the_documented_json(local):
    store, target = local
    status = local_rollout.status_of(store, "tiny-chat", target)
    data = json.loads(json.dumps(status.to_json()))
    assert list(data) == LOCAL_KEYS
    assert list(data["gateway"]) == GATEWAY_KEYS
    assert data["gateway"] == {
        "url": "http://127.0.0.1:8000",
        "grpc": "127.0.0.1:8001",
        "pid": None,
        "alive": True,
        "generation_applied": 1,
        "log": str(store.log_file("tiny-chat", "gateway")),
    }
    assert list(data["routes"]) == ["generation", "model_id", "default", "pinned"]
    assert data["routes"]["default"] == [{"instance": 1, "version": 1, "url": "http://127.0.0.1:9001", "weight": 100}]
    assert data["auth"] == "api-key"
    assert [list(i) for i in data["instances"]] == [INSTANCE_KEYS, INSTANCE_KEYS]
    one, two = data["instances"]
    assert (one["alive"], one["health"], one["weight"], one["inflight"], one["last_request"]) == (
        True,
        200,
        100,
        2,
        1000.5,
    )
    assert one["memory_bytes"] == 3 * 2**29 and isinstance(one["memory_bytes"], int)
    assert (two["alive"], two["health"], two["memory_bytes"], two["routable_by_version"]) == (False, None, 0, True)
    assert data["degraded"] == ["v2 (instance #2) is not running"]
    # no CLI holds the lock: flagged interrupted (a key only the open rollout of a dead CLI has)
    assert list(data["open_rollout"]) == [*LOCAL_ROLLOUT_KEYS, "interrupted"]
    assert data["open_rollout"]["interrupted"] is True and data["open_rollout"]["step"] == 1
    assert data["open_rollout"]["steps"] == [25, 100] and data["open_rollout"]["to_instance"] == 2
    assert [list(r) for r in data["rollouts"]] == [LOCAL_ROLLOUT_KEYS]
    assert data["history"] and all(list(e) == HISTORY_KEYS for e in data["history"])
    assert data["history"][-1]["message"] == "25% on v2"


def test_an_open_rollout_whose_cli_holds_the_lock_is_not_interrupted(local):
    store, target = local
    with DeploymentLock(store, "tiny-chat"):
        status = local_rollout.status_of(store, "tiny-chat", target)
    assert status.open_rollout is not None and status.open_rollout.interrupted is None
    assert "interrupted" not in status.to_json()["open_rollout"]


def test_a_stopped_gateway_degrades_the_status(local):
    store, _ = local
    status = local_rollout.status_of(store, "tiny-chat", FakeLocalTarget(False, set(), None))
    assert status.gateway.alive is False and status.gateway.generation_applied is None
    assert status.degraded[-1].startswith("the gateway is not running")


def test_a_deploy_outcome_is_the_status_with_what_the_command_did(local):
    store, target = local
    status = local_rollout.status_of(store, "tiny-chat", target)
    r = store.rollouts("tiny-chat")[0]
    rec = local_rollout._rollout_record(r, seconds=12.25)
    out = Outcome(deployment="tiny-chat", action="deployed", status=status, rollout=rec, rolled_forward="step 1 failed")
    out.recovered = Recovery(rollout=4, recovered="rolled-back", resumed=False)
    data = out.to_json()
    assert list(data) == [*LOCAL_KEYS, "action", "rollout", "rolled_forward", "recovered"]
    assert list(data["rollout"]) == [*LOCAL_ROLLOUT_KEYS, "seconds"] and data["rollout"]["seconds"] == 12.25
    assert data["recovered"] == {"rollout": 4, "recovered": "rolled-back", "resumed": False}
    # resuming an interrupted rollout: the engine names the rollout by its id
    resumed = replace(out, recovered="resumed", resumed=True, rollout=4).to_json()
    assert (resumed["rollout"], resumed["recovered"], resumed["resumed"]) == (4, "resumed", True)
    assert list(resumed)[-5:] == ["action", "rollout", "rolled_forward", "recovered", "resumed"]
    # a rollback that only undid an interrupted rollout has no status
    undone = Outcome.undid("tiny-chat", Recovery(rollout=4, recovered="rolled-back", resumed=False))
    assert undone.to_json() == {
        "deployment": "tiny-chat",
        "action": "undid-interrupted-rollout",
        "rollout": 4,
        "recovered": "rolled-back",
        "resumed": False,
    }
    assert list(undone.to_json()) == ["deployment", "action", "rollout", "recovered", "resumed"]


def test_the_local_target_summary_is_an_outcome_with_the_rollout_timed(local):
    store, target = local
    r = store.rollouts("tiny-chat")[0]
    t = SimpleNamespace(store=store, name="tiny-chat", target=target)
    out = local_rollout.LocalRollouts.summary(t, r, "deployed")
    assert (out.deployment, out.action, out.status.deployment) == ("tiny-chat", "deployed", "tiny-chat")
    assert out.rollout.id == r.id and out.rollout.seconds == round(r.updated - r.started, 2)
    assert local_rollout.LocalRollouts.summary(t, None, "unchanged").rollout is None


# -- Kubernetes target ----------------------------------------------------------------------------


def _dep(name: str, version: int, color: str, replicas: int, ready: int | None, superseded: str | None = None):
    ann = {manifests.A_DIGEST: f"sha256:{version}", manifests.A_PACKAGE: f"v{version}.llmpkg", manifests.A_ROLLOUT: "3"}
    if superseded:
        ann[manifests.A_SUPERSEDED] = superseded
    return SimpleNamespace(
        metadata=SimpleNamespace(
            name=name,
            annotations=ann,
            labels={L_STRATEGY: "red-black", L_COLOR: color, L_VERSION: str(version)},
        ),
        spec=SimpleNamespace(replicas=replicas),
        status=SimpleNamespace(ready_replicas=ready),
    )


def _pod(ip: str, version: int):
    return SimpleNamespace(
        status=SimpleNamespace(pod_ip=ip), metadata=SimpleNamespace(labels={L_VERSION: str(version)})
    )


class FakeCore:
    def list_namespaced_service(self, ns, label_selector):
        svc = SimpleNamespace(
            metadata=SimpleNamespace(name="tiny-chat"),
            spec=SimpleNamespace(selector={"app": "tiny-chat"}, cluster_ip="10.0.0.7"),
        )
        return SimpleNamespace(items=[svc])

    def read_namespaced_endpoints(self, name, ns):
        addresses = [SimpleNamespace(ip="10.1.0.1"), SimpleNamespace(ip="10.1.0.2")]
        return SimpleNamespace(
            subsets=[SimpleNamespace(addresses=addresses, not_ready_addresses=[SimpleNamespace(ip="10.1.0.3")])]
        )


def _journal() -> dict:
    done = ClusterRollout(id=1, strategy="red-black", package="v1.llmpkg", version=1, status="done", phase="done")
    done.step_index, done.started, done.updated, done.steps = 0, 100.0, 130.5, [100]
    done.to = {"object": "tiny-chat-blue"}
    running = ClusterRollout(id=2, strategy="red-black", package="v2.llmpkg", version=2, phase="shifting")
    running.step_index, running.started, running.updated, running.steps = 0, 200.0, 210.0, [50, 100]
    running.plan = [{"percent": 50, "new": 1, "old": 1}, {"percent": 100, "new": 2, "old": 0}]
    running.from_, running.to, running.replicas = {"object": "tiny-chat-blue"}, {"object": "tiny-chat-green"}, 2
    return {
        "deployment": {"model_id": "tiny", "strategy": "red-black", "default_version": None, "config": {}},
        "rollouts": [running.to_dict(), done.to_dict()],
        "history": [{"ts": 200.0, "rollout": 2, "kind": "rollout-begin", "message": "red-black rollout #2"}],
    }


@pytest.fixture
def cluster(monkeypatch):
    """tiny-chat in namespace models: v1 (blue, 2/2 ready) and v2 (green, 0/1 ready) mid-rollout, the Lease's
    holder gone; the HPA as `hpa` says (None: no HPA; an exception: unreadable)."""
    journal = _journal()
    monkeypatch.setattr(ClusterState, "load", lambda self: journal)
    monkeypatch.setattr(k8s_rollout, "api_call", lambda what, fn, *a, not_found_ok=False, **kw: fn(*a, **kw))
    monkeypatch.setattr(k8s_rollout.LeaseLock, "holder_state", lambda self: ("host-a:4242", False))
    hpa: dict = {"value": None}

    def read(c, name, version=None):
        if isinstance(hpa["value"], Exception):
            raise hpa["value"]
        return hpa["value"]

    monkeypatch.setattr(autoscale, "read", read)
    c = SimpleNamespace(namespace="models", context="kind-a", server="https://10.0.0.1:6443", core=FakeCore())
    k = k8s_rollout.KubernetesDeployer(c)
    deps = [_dep("tiny-chat-blue", 1, "blue", 2, 2), _dep("tiny-chat-green", 2, "green", 1, None, "1700.5")]
    monkeypatch.setattr(k, "_deployments", lambda name, strategy=None: deps)
    monkeypatch.setattr(k, "_pods", lambda name, extra="": [_pod("10.1.0.1", 1), _pod("10.1.0.2", 2)])
    return k, hpa


HPA = {
    "metadata": {"annotations": {autoscale.A_QUEUE_TARGET: "4"}},
    "spec": {"scaleTargetRef": {"name": "tiny-chat-blue"}, "minReplicas": 1, "maxReplicas": 4},
    "status": {
        "currentReplicas": 2,
        "desiredReplicas": 3,
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "message": "ok"},
            {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric", "message": "no metric"},
        ],
    },
}


def test_cluster_status_has_the_documented_json(cluster):
    k, hpa = cluster
    hpa["value"] = HPA
    data = json.loads(json.dumps(k.status("tiny-chat").to_json()))
    assert list(data) == CLUSTER_KEYS and data["target"] == "kubernetes"
    assert (data["namespace"], data["context"], data["server"]) == ("models", "kind-a", "https://10.0.0.1:6443")
    assert [list(d) for d in data["deployments"]] == [CLUSTER_DEPLOYMENT_KEYS] * 2
    blue, green = data["deployments"]
    assert (blue["version"], blue["ready"], blue["superseded_at"]) == (1, 2, None)
    assert (green["version"], green["ready"], green["replicas"], green["superseded_at"]) == (2, 0, 1, 1700.5)
    assert [list(s) for s in data["services"]] == [SERVICE_KEYS]
    assert data["services"][0]["ready_endpoints_by_version"] == {"1": 1, "2": 1}
    assert data["services"][0]["not_ready_endpoints"] == 1
    assert list(data["open_rollout"]) == [*CLUSTER_ROLLOUT_KEYS, "interrupted", "holder"]
    o = data["open_rollout"]
    assert (o["id"], o["step"], o["from"], o["to"], o["interrupted"], o["holder"]) == (
        2,
        1,
        "tiny-chat-blue",
        "tiny-chat-green",
        True,
        "host-a:4242",
    )
    assert [list(r) for r in data["rollouts"]] == [CLUSTER_ROLLOUT_KEYS] * 2
    assert data["rollouts"][1]["from"] is None and data["rollouts"][1]["to"] == "tiny-chat-blue"
    assert [list(e) for e in data["history"]] == [HISTORY_KEYS]
    assert list(data["autoscaler"]) == AUTOSCALER_KEYS
    assert data["autoscaler"]["queue_target"] == "4" and data["autoscaler"]["desired_replicas"] == 3
    assert data["autoscaler"]["conditions"][1] == {
        "type": "ScalingActive",
        "status": "False",
        "reason": "FailedGetPodsMetric",
        "message": "no metric",
    }


def test_an_unreadable_or_missing_autoscaler(cluster):
    k, hpa = cluster
    assert k.status("tiny-chat").to_json()["autoscaler"] is None
    hpa["value"] = LLMServeError("Kubernetes API: read HorizontalPodAutoscaler failed (403): forbidden")
    status = k.status("tiny-chat")
    assert isinstance(status.autoscaler, AutoscalerUnreadable)
    assert status.to_json()["autoscaler"] == {
        "error": "Kubernetes API: read HorizontalPodAutoscaler failed (403): forbidden"
    }


# -- rendering ------------------------------------------------------------------------------------


@pytest.fixture
def screen(monkeypatch) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(deploy_common, "console", Console(file=out, width=250, color_system=None))
    return out


def test_render_local_status_degraded_and_interrupted(local, screen):
    store, target = local
    status = local_rollout.status_of(store, "tiny-chat", target)
    assert isinstance(status, LocalStatus)
    deploy_common.render_status(status)
    text = screen.getvalue()
    assert "tiny-chat (model tiny)  gateway http://127.0.0.1:8000 grpc 127.0.0.1:8001 up  routes generation" in text
    assert "1.5 GiB" in text and "100%" in text and "None (dead)" in text
    assert "degraded: v2 (instance #2) is not running" in text
    assert "interrupted rollout #1 red-black phase shifting step 1/2" in text
    assert "hint: `llmserve deploy v2.llmpkg` resumes it; `llmserve rollback tiny-chat` undoes it." in text
    assert "25% on v2" in text


def test_render_a_local_deploy_outcome(local, screen, capsys):
    store, target = local
    status = local_rollout.status_of(store, "tiny-chat", target)
    rec = local_rollout._rollout_record(store.rollouts("tiny-chat")[0], seconds=12.25)
    out = Outcome(deployment="tiny-chat", action="deployed", status=status, rollout=rec)
    deploy_common.render_result(out, OutputFormat.text)
    text = screen.getvalue()
    assert "routes generation 1  deployed" in text and "rollout #1 running in 12.2 s" in text
    deploy_common.render_result(out, OutputFormat.json)
    assert json.loads(capsys.readouterr().out) == out.to_json()


def test_render_a_rollback_that_undid_an_interrupted_rollout(screen):
    out = Outcome(deployment="tiny-chat", action="undid-interrupted-rollout", rollout=4, recovered="rolled-back")
    deploy_common.render_result(out, OutputFormat.text)
    assert "rollback of 'tiny-chat': undid-interrupted-rollout (rollout #4: rolled-back)" in screen.getvalue()


def test_render_cluster_status_with_its_autoscaler(cluster, screen):
    k, hpa = cluster
    hpa["value"] = HPA
    status = k.status("tiny-chat")
    assert isinstance(status, ClusterStatus)
    deploy_common.render_status(status)
    text = screen.getvalue()
    assert "tiny-chat (model tiny, red-black)  namespace models on https://10.0.0.1:6443" in text
    assert "tiny-chat-green" in text and "0/1" in text and "2/2" in text
    assert "service tiny-chat -> ready endpoints v1: 1, v2: 1 (1 not ready)" in text
    assert "autoscaler tiny-chat -> tiny-chat-blue: 1..4 replicas" in text and "now 2, wants 3" in text
    assert "ScalingActive: FailedGetPodsMetric no metric" in text and "AbleToScale" not in text
    assert "interrupted rollout #2 red-black phase shifting step 1/2" in text
    assert "`llmserve deploy v2.llmpkg --target kubernetes` resumes it" in text


def test_render_cluster_status_when_the_autoscaler_is_unreadable(cluster, screen):
    k, hpa = cluster
    hpa["value"] = LLMServeError("Kubernetes API: read HorizontalPodAutoscaler failed (403): forbidden")
    deploy_common.render_status(k.status("tiny-chat"))
    assert "autoscaler: Kubernetes API: read HorizontalPodAutoscaler failed (403): forbidden" in screen.getvalue()


def test_a_rollout_record_omits_the_keys_it_does_not_have():
    rec = RolloutRecord(
        id=1, strategy="versioned", status="done", phase="done", package="p", steps=[100], step=1,
        from_instance=None, to_instance=3, message=None, started=1.0, updated=2,
    )  # fmt: skip
    data = rec.to_json()
    assert list(data) == LOCAL_ROLLOUT_KEYS
    # values pass through as the state holds them: an int timestamp stays an int
    assert data["updated"] == 2 and isinstance(data["updated"], int)


def test_status_figures_land_in_the_records_and_their_json(local, cluster):
    from rich.console import Console

    from llmserve.cli.status_figures import attach_kubernetes, attach_local, render_local

    store, target = local
    status = local_rollout.status_of(store, "tiny-chat", target)
    # the instances' recorded URLs (127.0.0.1:9001, :9002) have no server: each says so in its figures
    attach_local([status], interval=0.05, timeout=0.5, api_key=None)
    for inst in status.instances:
        assert inst.metrics is not None and inst.metrics["error"].startswith("unreachable"), inst.metrics
    assert [list(i) for i in status.to_json()["instances"]] == [[*INSTANCE_KEYS, "metrics"]] * 2
    screen = Console(record=True, width=200)
    render_local(status, screen)
    shown = screen.export_text()
    assert shown.count("no figures") == 2 and "instance 2 (v2): unreachable" in shown, shown

    k, _ = cluster
    cstatus = k.status("tiny-chat")
    attach_kubernetes([cstatus], {}, interval=0.05, timeout=0.5, api_key=None)  # no pods listed yet
    assert [d.pods for d in cstatus.deployments] == [[], []]
    assert [list(d) for d in cstatus.to_json()["deployments"]] == [[*CLUSTER_DEPLOYMENT_KEYS, "pods"]] * 2


# -- deploy down ----------------------------------------------------------------------------------


class TeardownTarget(FakeLocalTarget):
    """What Deployer.down asks of processes, recorded instead of done."""

    def __init__(self):
        super().__init__(True, set(), None)
        self.acts: list[tuple] = []

    def apply_routes(self, dep, routes, why):
        self.acts.append(("routes", why, routes.default))

    def stop_instance(self, dep, inst, drain_timeout, why):
        self.acts.append(("stop", inst.id))

    def stop_gateway(self, dep):
        self.acts.append(("stop-gateway",))


def test_local_down_has_the_documented_json(local):
    store, _ = local
    deployer = local_rollout.Deployer(store)
    deployer.target = TeardownTarget()
    out = deployer.down("tiny-chat", drain_timeout_s=1.0)
    assert isinstance(out, LocalTeardown)
    assert json.loads(json.dumps(out.to_json())) == {
        "deployment": "tiny-chat",
        "action": "removed",
        "stopped_instances": [1, 2],
    }
    assert list(out.to_json()) == ["deployment", "action", "stopped_instances"]
    assert deployer.target.acts == [("routes", "teardown", []), ("stop", 1), ("stop", 2), ("stop-gateway",)]
    assert store.deployment("tiny-chat") is None


class FakeLease:
    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_cluster_down_has_the_documented_json(cluster, monkeypatch):
    k, _ = cluster
    deleted: list[str] = []
    monkeypatch.setattr(k8s_rollout, "LeaseLock", FakeLease)
    monkeypatch.setattr(ClusterState, "delete", lambda self: deleted.append("configmap"))
    monkeypatch.setattr(autoscale, "remove", lambda c, name: True)
    monkeypatch.setattr(k, "_delete_dep", lambda obj: deleted.append(obj))
    monkeypatch.setattr(k, "_delete_service", lambda svc: deleted.append(f"service {svc}"))
    monkeypatch.setattr(k.keys, "remove_created", lambda name: ["secret/tiny-chat-api-key"])
    out = k.down("tiny-chat", 1.0)
    assert isinstance(out, ClusterTeardown)
    assert list(out.to_json()) == ["deployment", "action", "removed", "namespace"]
    assert out.to_json() == {
        "deployment": "tiny-chat",
        "action": "removed",
        "removed": [
            "tiny-chat-blue",
            "tiny-chat-green",
            "service/tiny-chat",
            "secret/tiny-chat-api-key",
            "horizontalpodautoscaler/tiny-chat",
        ],
        "namespace": "models",
    }
    assert deleted == ["tiny-chat-blue", "tiny-chat-green", "service tiny-chat", "configmap"]


def test_render_teardowns(screen, capsys):
    local = LocalTeardown(deployment="tiny-chat", stopped_instances=[1, 2])
    cluster = ClusterTeardown(
        deployment="tiny-chat", removed=["tiny-chat-blue", "service/tiny-chat"], namespace="models"
    )
    deploy_common.render_teardown(local, OutputFormat.text)
    deploy_common.render_teardown(cluster, OutputFormat.text)
    assert screen.getvalue().splitlines() == [
        "removed tiny-chat (2 server(s) stopped)",
        "removed tiny-chat from namespace models (2 object(s))",
    ]
    deploy_common.render_teardown(cluster, OutputFormat.json)
    assert json.loads(capsys.readouterr().out) == cluster.to_json()
