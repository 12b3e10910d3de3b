"""The order and bookkeeping of region-by-region rollouts (llmserve.deploy.kubernetes.regions) over fake regions;
tests/deploy_k8s/test_k8s_regions.py runs them on a real control plane."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmserve.deploy.errors import DeployInputError, RolloutFailedError
from llmserve.deploy.kubernetes import regions
from llmserve.deploy.options import DeployOptions
from llmserve.deploy.status import ClusterRolloutRecord, Outcome, RegionGate, RegionUndo


def test_contexts_are_distinct_names_in_order():
    assert regions.parse_contexts("eu-1, us-1,ap-1") == ["eu-1", "us-1", "ap-1"]
    with pytest.raises(DeployInputError, match="given twice"):
        regions.parse_contexts("a,b,a")
    with pytest.raises(DeployInputError, match="expected"):
        regions.parse_contexts(" , ")


class FakeRegion:
    def __init__(self, ctx: str, fail: bool = False):
        self.ns = f"ns-{ctx}"
        self.c = SimpleNamespace(server=f"https://{ctx}")
        self.fail = fail
        self.deployed: list[str | None] = []

    def deploy(self, opts):
        self.deployed.append(opts.name)
        if self.fail:
            raise RolloutFailedError("rollout #2 rolled back: v2 has 0/1 ready replicas after 6 s")
        return Outcome(deployment="tiny-chat", action="deployed", rollout=_rollout(version=2))


def _rollout(version: int) -> ClusterRolloutRecord:
    return ClusterRolloutRecord(
        id=1, strategy="red-black", status="done", phase="done", package="p.llmpkg", version=version, steps=[100],
        plan=[], replicas=1, message=None, started=0.0, updated=1.0, step=1, from_=None, to=f"tiny-chat-{version}",
    )  # fmt: skip


def _run(monkeypatch, fakes: dict, gate_fails: set[str] = frozenset(), undo_fails: set[str] = frozenset()):
    undone: list[str] = []

    def gate(k, name, version, opts):
        ctx = k.ns[3:]
        failed = "Deployment x has 0/1 ready replicas" if ctx in gate_fails else None
        return RegionGate(pause_s=0, pods=1, failed=failed, restarts=0, errors=None, figures="not scraped")

    def undo(k, name, opts):
        ctx = k.ns[3:]
        if ctx in undo_fails:
            raise RolloutFailedError("cannot")
        undone.append(ctx)
        return RegionUndo(action="rolled-back", version=1)

    monkeypatch.setattr(regions, "region_gate", gate)
    monkeypatch.setattr(regions, "undo_region", undo)
    rollout = regions.RegionalRollout(fakes.__getitem__, list(fakes), gate=regions.GateOptions(pause_s=0))
    try:
        return rollout.deploy(DeployOptions(package="p.llmpkg")), undone, None
    except regions.RegionalRolloutError as exc:
        return None, undone, exc


def test_every_region_passes_in_order(monkeypatch):
    fakes = {c: FakeRegion(c) for c in ("a", "b", "c")}
    out, undone, err = _run(monkeypatch, fakes)
    assert err is None and not undone
    assert [(r.context, r.result, r.version) for r in out.regions] == [
        ("a", "deployed", 2),
        ("b", "deployed", 2),
        ("c", "deployed", 2),
    ]
    # the first region names the deployment for the next ones
    assert [f.deployed for f in fakes.values()] == [[None], ["tiny-chat"], ["tiny-chat"]]


def test_a_failing_region_rolls_back_the_moved_ones_newest_first(monkeypatch):
    fakes = {"a": FakeRegion("a"), "b": FakeRegion("b"), "c": FakeRegion("c", fail=True), "d": FakeRegion("d")}
    out, undone, err = _run(monkeypatch, fakes)
    assert out is None and err is not None and err.exit_code == 7
    assert undone == ["b", "a"]
    assert not fakes["d"].deployed
    data = err.to_dict()
    assert data["error"] == "regional-rollout-failed"
    assert [(r["context"], r["result"]) for r in data["regions"]] == [
        ("a", "deployed"),
        ("b", "deployed"),
        ("c", "failed"),
        ("d", "not-started"),
    ]
    assert "region 'c' failed" in err.message and "rolled back: a, b" in err.message


def test_a_failed_gate_rolls_back_its_own_region_too_and_a_failed_rollback_is_named(monkeypatch):
    fakes = {c: FakeRegion(c) for c in ("a", "b")}
    _, undone, err = _run(monkeypatch, fakes, gate_fails={"b"}, undo_fails={"a"})
    assert err is not None and undone == ["b"]
    a, b = err.regions
    assert b.result == "gate-failed" and b.rollback is not None and b.rollback.action == "rolled-back"
    assert a.rollback is not None and a.rollback.action == "rollback-failed"
    assert "rollback FAILED in: a" in err.message and "--contexts a" in (err.hint or "")
