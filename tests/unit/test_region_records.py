"""The typed results of region-by-region rollouts (llmserve.deploy.status: RegionalOutcome and the per-region
records) as llmserve.deploy.kubernetes.regions builds them over fake regions: the JSON `--output json` and the
error's `regions` have always had (tests/deploy_k8s/test_k8s_regions.py and scripts read these keys), the gate's
observations, and the CLI's rendering (llmserve.cli.deploy_regions)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from llmserve.cli import deploy_regions
from llmserve.cli.render import OutputFormat
from llmserve.deploy.errors import RolloutFailedError
from llmserve.deploy.kubernetes import regions
from llmserve.deploy.options import DeployOptions
from llmserve.deploy.status import (
    ClusterDeploymentStatus,
    ClusterRolloutRecord,
    ClusterStatus,
    Outcome,
    RegionalOutcome,
    RegionDeploy,
    RegionGate,
    RegionRollback,
    RegionUndo,
)

# The documented keys, in order (what the dict builders before these records gave).
OUTCOME_KEYS = ["target", "deployment", "action", "regions"]
REGION_KEYS = ["context", "namespace", "server", "result"]
DEPLOYED_KEYS = [*REGION_KEYS, "deployment", "version", "deployments"]
SUMMARY_KEYS = ["object", "version", "color", "replicas", "ready", "digest"]
GATE_KEYS = ["pause_s", "pods", "failed", "restarts", "errors", "figures"]


def _rollout(version: int) -> ClusterRolloutRecord:
    return ClusterRolloutRecord(
        id=1, strategy="red-black", status="done", phase="done", package="p.llmpkg", version=version, steps=[100],
        plan=[], replicas=1, message=None, started=0.0, updated=1.0, step=1, from_=None, to=f"tiny-chat-{version}",
    )  # fmt: skip


def _status(*versions: int) -> ClusterStatus:
    deployments = [
        ClusterDeploymentStatus(
            object=f"tiny-chat-{v}",
            strategy="versioned",
            color=None,
            version=v,
            replicas=2,
            ready=2,
            digest=f"sha256:{v}",
            package=f"v{v}.llmpkg",
            package_uri=None,
            rollout="1",
            superseded_at=None,
        )
        for v in versions
    ]
    return ClusterStatus(
        deployment="tiny-chat", namespace="ns", context=None, server="https://k", model_id="tiny", strategy="versioned",
        default_version=None, config={}, deployments=deployments, services=[], open_rollout=None, rollouts=[],
        history=[], autoscaler=None,
    )  # fmt: skip


class FakeRegion:
    """One region's deployer: `how` its deploy goes (deployed, unchanged: already serving v1 and v2, resumed: an
    interrupted rollout resumed by its id, failed)."""

    def __init__(self, ctx: str, how: str = "deployed"):
        self.ns = f"ns-{ctx}"
        self.c = SimpleNamespace(server=f"https://{ctx}")
        self.how = how

    def deploy(self, opts):
        if self.how == "failed":
            raise RolloutFailedError("rollout #2 rolled back: v2 has 0/1 ready replicas after 6 s")
        if self.how == "unchanged":
            return Outcome(deployment="tiny-chat", action="unchanged", status=_status(1, 2))
        rollout = 5 if self.how == "resumed" else _rollout(2)
        return Outcome(deployment="tiny-chat", action="deployed", status=_status(2), rollout=rollout)

    def rollback(self, name, to_version, opts):
        if self.how == "failed":
            raise RolloutFailedError("deployment 'tiny-chat' has no finished rollout to roll back")
        if self.how == "resumed":  # only an interrupted rollout undone: no status
            return Outcome(deployment=name, action="undid-interrupted-rollout", rollout=5, recovered="rolled-back")
        return Outcome(deployment=name, action="rolled-back", status=_status(1), rollout=_rollout(1))


def _gate(failed: str | None = None) -> RegionGate:
    return RegionGate(pause_s=0.0, pods=1, failed=failed, restarts=0, errors=None, figures="not scraped")


@pytest.fixture
def fake_gates(monkeypatch):
    """region_gate and undo_region without a cluster: the gate fails where `gates[ctx]` says why; undoing a region
    rolls it back, removes it (`undo[ctx] == "removed"`) or fails (`"failed"`)."""
    gates: dict[str, str] = {}
    undo: dict[str, str] = {}

    def gate(k, name, version, opts):
        return _gate(gates.get(k.ns[3:]))

    def undo_region(k, name, opts):
        how = undo.get(k.ns[3:], "rolled-back")
        if how == "failed":
            raise RolloutFailedError("cannot reach the API server")
        return RegionUndo(action="removed") if how == "removed" else RegionUndo(action="rolled-back", version=1)

    monkeypatch.setattr(regions, "region_gate", gate)
    monkeypatch.setattr(regions, "undo_region", undo_region)
    return gates, undo


def _rollout_over(*fakes: FakeRegion) -> regions.RegionalRollout:
    by_ctx = {f.ns[3:]: f for f in fakes}
    return regions.RegionalRollout(by_ctx.__getitem__, list(by_ctx), gate=regions.GateOptions(pause_s=0))


def test_a_regional_deploy_has_the_documented_json(fake_gates):
    out = _rollout_over(FakeRegion("a"), FakeRegion("b", "unchanged"), FakeRegion("c", "resumed")).deploy(
        DeployOptions(package="p.llmpkg")
    )
    assert isinstance(out, RegionalOutcome) and all(isinstance(r, RegionDeploy) for r in out.regions)
    data = json.loads(json.dumps(out.to_json()))
    assert list(data) == OUTCOME_KEYS
    assert (data["target"], data["deployment"], data["action"]) == ("kubernetes", "tiny-chat", "deployed")
    a, b, c = data["regions"]
    assert list(a) == [*DEPLOYED_KEYS, "rollout", "gate"]
    assert (a["context"], a["namespace"], a["server"], a["result"], a["version"]) == (
        "a",
        "ns-a",
        "https://a",
        "deployed",
        2,
    )
    assert a["deployments"] == [
        {"object": "tiny-chat-2", "version": 2, "color": None, "replicas": 2, "ready": 2, "digest": "sha256:2"}
    ]
    assert list(a["deployments"][0]) == SUMMARY_KEYS
    assert a["rollout"]["version"] == 2 and a["rollout"]["from"] is None
    assert list(a["gate"]) == GATE_KEYS
    # unchanged: no rollout of its own, so no rollout key; the version is the newest Deployment's
    assert list(b) == [*DEPLOYED_KEYS, "gate"] and (b["result"], b["version"]) == ("unchanged", 2)
    # a resumed rollout is named by its id
    assert c["rollout"] == 5 and c["version"] == 2


def test_all_unchanged_is_unchanged(fake_gates):
    out = _rollout_over(FakeRegion("a", "unchanged")).deploy(DeployOptions(package="p.llmpkg"))
    assert out.action == "unchanged"


def test_a_failed_region_names_every_region_in_the_error(fake_gates):
    _, undo = fake_gates
    undo["a"] = "removed"
    fakes = (FakeRegion("a"), FakeRegion("b", "unchanged"), FakeRegion("c", "failed"), FakeRegion("d"))
    with pytest.raises(regions.RegionalRolloutError) as info:
        _rollout_over(*fakes).deploy(DeployOptions(package="p.llmpkg"))
    err = info.value
    a, b, c, _ = err.regions
    assert a.rollback == RegionUndo(action="removed") and b.rollback == RegionUndo(action="rolled-back", version=1)
    assert (c.result, c.deployment, c.exit_code) == ("failed", None, 7)
    data = json.loads(json.dumps(err.to_dict()))
    ra, rb, rc, rd = data["regions"]
    assert list(ra) == [*DEPLOYED_KEYS, "rollout", "gate", "rollback"] and ra["rollback"] == {"action": "removed"}
    assert list(rb) == [*DEPLOYED_KEYS, "gate", "rollback"]
    assert rb["rollback"] == {"action": "rolled-back", "version": 1}
    # a region whose deploy failed has what it failed with, and nothing of a deployment
    assert list(rc) == [*REGION_KEYS, "error", "exit_code"] and rc["exit_code"] == 7
    assert rc["error"].startswith("rollout #2 rolled back")
    assert list(rd) == REGION_KEYS and rd["result"] == "not-started"
    assert data["details"][0]["rows"] == [
        ["a", "ns-a", "deployed, then removed"],
        ["b", "ns-b", "unchanged, then rolled-back"],
        ["c", "ns-c", "failed: rollout #2 rolled back: v2 has 0/1 ready replicas after 6 s"],
        ["d", "ns-d", "not-started"],
    ]
    assert "region 'c' failed: rollout #2" in err.message and "rolled back: a, b" in err.message


def test_a_failed_gate_and_a_failed_rollback_in_the_json(fake_gates):
    gates, undo = fake_gates
    gates["b"] = "Deployment tiny-chat-2 has 0/2 ready replicas"
    undo["a"] = "failed"
    with pytest.raises(regions.RegionalRolloutError) as info:
        _rollout_over(FakeRegion("a"), FakeRegion("b")).deploy(DeployOptions(package="p.llmpkg"))
    ra, rb = info.value.to_dict()["regions"]
    assert ra["rollback"] == {"action": "rollback-failed", "error": "cannot reach the API server"}
    # the gate's reason is the region's error, after the gate
    assert list(rb) == [*DEPLOYED_KEYS, "rollout", "gate", "error", "rollback"]
    assert rb["result"] == "gate-failed" and rb["error"] == rb["gate"]["failed"]
    assert "rollback FAILED in: a" in info.value.message


def test_a_rolled_back_region_keeps_its_version_key_where_it_is_unknown():
    assert RegionUndo(action="rolled-back").to_json() == {"action": "rolled-back", "version": None}
    assert RegionUndo(action="removed").to_json() == {"action": "removed"}
    region = RegionDeploy(context="a", namespace=None, server="s", result="deployed", deployment="x")
    assert region.to_json() == {
        "context": "a",
        "namespace": None,
        "server": "s",
        "result": "deployed",
        "deployment": "x",
        "version": None,
        "deployments": [],
    }


def test_a_regional_rollback_has_the_documented_json():
    rollout = _rollout_over(FakeRegion("a"), FakeRegion("b", "resumed"))
    out = rollout.rollback("tiny-chat", None, DeployOptions(package="."))
    assert all(isinstance(r, RegionRollback) for r in out.regions)
    data = out.to_json()
    assert list(data) == OUTCOME_KEYS and data["action"] == "rolled-back"
    assert data["regions"] == [
        {"context": "a", "namespace": "ns-a", "server": "https://a", "result": "rolled-back", "version": 1},
        {
            "context": "b",
            "namespace": "ns-b",
            "server": "https://b",
            "result": "undid-interrupted-rollout",
            "version": None,
        },
    ]
    with pytest.raises(regions.RegionalRolloutError) as info:
        _rollout_over(FakeRegion("a"), FakeRegion("b", "failed")).rollback(
            "tiny-chat", None, DeployOptions(package=".")
        )
    _, failed = info.value.to_dict()["regions"]
    assert failed == {
        "context": "b",
        "namespace": "ns-b",
        "server": "https://b",
        "result": "failed",
        "error": "deployment 'tiny-chat' has no finished rollout to roll back",
    }
    assert info.value.details[0].rows[1] == [
        "b",
        "ns-b",
        "failed: deployment 'tiny-chat' has no finished rollout to roll back",
    ]


# -- the gate and the undo of one region, over faked cluster reads -----------------------------------


def _pod(name: str):
    return SimpleNamespace(metadata=SimpleNamespace(name=name), restarts=0)


@pytest.fixture
def cluster_reads(monkeypatch):
    """What region_gate reads of a region, as `reads` says: pods of the new version (by name), a Deployment short
    of ready replicas, their restarts, and the /metrics figures scraped from them."""
    reads: dict = {"pods": ["p1", "p2"], "not_ready": None, "restarts": {}, "figures": {}}
    monkeypatch.setattr(regions, "_new_pods", lambda k, name, version: [_pod(p) for p in reads["pods"]])
    monkeypatch.setattr(regions, "pod_url", lambda p, port="http": f"http://{p.metadata.name}:8000")
    monkeypatch.setattr(regions, "_api_key", lambda k, name: None)
    monkeypatch.setattr(regions, "_replicas", lambda k, name: {})
    monkeypatch.setattr(regions, "_not_ready", lambda k, name, at_start: reads["not_ready"])
    monkeypatch.setattr(regions, "_restarts", lambda p: {"server": reads["restarts"].get(p.metadata.name, 0)})
    monkeypatch.setattr(regions, "snapshots", lambda urls, interval, timeout, headers: reads["figures"])
    return reads


SCRAPED = {"endpoints": [{"errors_per_s": 0.5}, {"errors_per_s": None}], "interval_s": 4.0}  # 2 errors


def test_the_gate_counts_server_errors_where_figures_were_read(cluster_reads):
    cluster_reads["figures"] = {"p1": SCRAPED, "p2": {"error": "timed out"}}
    gate = regions.region_gate(None, "tiny-chat", 2, regions.GateOptions(pause_s=0, max_errors=2))
    assert gate == RegionGate(pause_s=0, pods=2, failed=None, restarts=0, errors=2, figures="1/2 pod(s) scraped")
    assert list(gate.to_json()) == GATE_KEYS
    over = regions.region_gate(None, "tiny-chat", 2, regions.GateOptions(pause_s=0, max_errors=1))
    assert over.failed == "2 server error(s) on v2 during the 0 s pause (allowed: 1)"


def test_the_gate_fails_on_restarts_and_on_readiness_first(cluster_reads):
    cluster_reads["restarts"] = {"p2": 3}
    gate = regions.region_gate(None, "tiny-chat", 2, regions.GateOptions(pause_s=0))
    assert (gate.failed, gate.restarts) == ("new pods restarted: p2 (3x)", 3)
    cluster_reads["not_ready"] = "Deployment tiny-chat-2 has 1/2 ready replicas"
    gate = regions.region_gate(None, "tiny-chat", 2, regions.GateOptions(pause_s=0))
    assert (gate.failed, gate.errors, gate.figures) == (cluster_reads["not_ready"], None, "not scraped")


def test_the_gate_says_why_it_has_no_figures(cluster_reads):
    cluster_reads["figures"] = {"p1": {"error": "connection refused"}, "p2": {"error": "connection refused"}}
    gate = regions.region_gate(None, "tiny-chat", 2, regions.GateOptions(pause_s=0))
    assert (gate.failed, gate.errors, gate.figures) == (None, None, "unavailable: connection refused")
    cluster_reads["pods"], cluster_reads["figures"] = [], {}
    gate = regions.region_gate(None, "tiny-chat", 2, regions.GateOptions(pause_s=0))
    assert (gate.pods, gate.figures) == (0, "unavailable: no pod to scrape")


def test_undoing_a_region_removes_a_first_deployment_and_rolls_back_others(monkeypatch):
    journal: list = []
    monkeypatch.setattr(regions, "ClusterState", lambda c, name: SimpleNamespace(rollouts=lambda: journal))
    downs: list[str] = []
    k = SimpleNamespace(
        c=None,
        down=lambda name, drain: downs.append(name),
        rollback=lambda name, to_version, opts: FakeRegion("a").rollback(name, to_version, opts),
    )
    assert regions.undo_region(k, "tiny-chat", DeployOptions(package=".")) == RegionUndo(action="removed")
    assert downs == ["tiny-chat"]
    journal.append(SimpleNamespace(status="done", strategy="red-black", from_={"package": "v1.llmpkg"}))
    undo = regions.undo_region(k, "tiny-chat", DeployOptions(package="."))
    assert undo == RegionUndo(action="rolled-back", version=1) and downs == ["tiny-chat"]


# -- rendering ------------------------------------------------------------------------------------


@pytest.fixture
def screen(monkeypatch) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(deploy_regions, "console", Console(file=out, width=200, color_system=None))
    return out


def test_render_a_regional_deploy_and_rollback(fake_gates, screen, capsys):
    out = _rollout_over(FakeRegion("a"), FakeRegion("b", "unchanged")).deploy(DeployOptions(package="p.llmpkg"))
    out.regions[1].gate = RegionGate(pause_s=0, pods=1, failed=None, restarts=1, errors=3, figures="1/1 pod(s) scraped")
    deploy_regions.render_regions(out, OutputFormat.text)
    lines = [" ".join(line.replace("│", " ").split()) for line in screen.getvalue().splitlines()]
    assert lines[0] == "tiny-chat deployed"
    assert "a ns-a deployed v2 ok (restarts 0, errors -)" in lines
    assert "b ns-b unchanged v2 ok (restarts 1, errors 3)" in lines
    deploy_regions.render_regions(out, OutputFormat.json)
    assert json.loads(capsys.readouterr().out) == out.to_json()
    back = _rollout_over(FakeRegion("a"), FakeRegion("b", "resumed")).rollback(
        "tiny-chat", None, DeployOptions(package=".")
    )
    screen.truncate(0)
    screen.seek(0)
    deploy_regions.render_regions(back, OutputFormat.text)
    lines = [" ".join(line.replace("│", " ").split()) for line in screen.getvalue().splitlines()]
    assert "a ns-a rolled-back v1 -" in lines and "b ns-b undid-interrupted-rollout - -" in lines
