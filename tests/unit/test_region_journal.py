"""The cross-region journal of regional rollouts (llmserve.deploy.kubernetes.region_journal) and how
RegionalRollout uses it, over fake regions and an in-memory store; tests/deploy_k8s/test_k8s_regions.py runs
the same on a real control plane with the ConfigMap store."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from llmserve.deploy.kubernetes import region_journal as rj
from llmserve.deploy.kubernetes import regions
from llmserve.deploy.options import DeployOptions
from llmserve.deploy.status import ClusterRolloutRecord, Outcome, RegionGate, RegionUndo

V1, V2, V3 = (1, "sha256:1"), (2, "sha256:2"), (3, "sha256:3")


class Died(BaseException):
    """The CLI killed: no `except LLMServeError` runs, nothing is undone or closed."""


class FakeRegion:
    """One region: what it serves, as (version, digest) pairs; its deploy puts the package's on it."""

    def __init__(self, ctx: str, serving=(), how: str = "ok"):
        self.ctx = ctx
        self.ns = f"ns-{ctx}"
        self.c = SimpleNamespace(server=f"https://{ctx}")
        self.serving = set(serving)
        self.how = how
        self.deploys = 0
        self.seen_journal: list[tuple[str, set | None]] = []  # (phase, before) the journal had at each deploy

    def deploy(self, opts):
        self.deploys += 1
        if self.how == "dies":
            raise Died()
        if self.how == "fails":
            from llmserve.deploy.errors import RolloutFailedError

            raise RolloutFailedError("rollout #2 rolled back: v2 has 0/1 ready replicas after 6 s")
        action = "unchanged" if self.serving == {PKG_SERVED[0]} else "deployed"
        self.serving = set(PKG_SERVED)
        rollout = ClusterRolloutRecord(
            id=7, strategy="red-black", status="done", phase="done", package="p", version=PKG_SERVED[0][0],
            steps=[100], plan=[], replicas=1, message=None, started=0.0, updated=0.0, step=1, from_=None, to="x",
        )  # fmt: skip
        return Outcome(deployment="tiny-chat", action=action, rollout=rollout if action == "deployed" else None)

    def rollback(self, name, to_version, opts):
        return Outcome(deployment=name, action="rolled-back")


PKG_SERVED = [V2]


@pytest.fixture
def world(monkeypatch):
    """regions' cluster reads and writes over FakeRegions; `undone` lists the regions undone, in order."""
    state: dict = {"undone": [], "gates": {}, "package": ("p2.llmpkg", "sha256:2", 2)}

    def identify(opts):
        ref, digest, version = state["package"]
        return regions.PackageIdentity("tiny-chat", ref, digest, version)

    def before(k, name):
        return rj.BeforeState(
            last_rollout=3,
            serving=[
                rj.ServedVersion(object=f"o{v}", version=v, digest=d, package=None, replicas=1) for v, d in k.serving
            ],
        )

    def served(k, name):
        return before(k, name).serving

    def undo(k, name, before_state, digest, opts):
        state["undone"].append(k.ctx)
        k.serving = before_state.key()
        return RegionUndo(action="rolled-back", version=1)

    def gate(k, name, version, opts):
        failed = state["gates"].get(k.ctx)
        return RegionGate(pause_s=0, pods=1, failed=failed, restarts=0, errors=None, figures="not scraped")

    def watch_deploy(fake_deploy):
        def deploy(self, opts):
            rec = next((r for r in state["store"].load("tiny-chat") if r.is_open), None)
            entry = rec.region(self.ctx) if rec else None
            self.seen_journal.append((entry.phase, entry.before.key() if entry and entry.before else None))
            return fake_deploy(self, opts)

        return deploy

    monkeypatch.setattr(regions, "identify_package", identify)
    monkeypatch.setattr(regions, "region_before", before)
    monkeypatch.setattr(regions, "served", served)
    monkeypatch.setattr(regions, "undo_to_before", undo)
    monkeypatch.setattr(regions, "region_gate", gate)
    monkeypatch.setattr(FakeRegion, "deploy", watch_deploy(FakeRegion.deploy))
    state["store"] = rj.MemoryJournal()
    return state


def _rollout(world, *fakes: FakeRegion) -> regions.RegionalRollout:
    by_ctx = {f.ctx: f for f in fakes}
    store = world["store"]
    return regions.RegionalRollout(
        by_ctx.__getitem__, list(by_ctx), gate=regions.GateOptions(pause_s=0), journal=lambda k: store
    )


def _record(world) -> rj.RegionalRecord:
    return world["store"].load("tiny-chat")[0]


def test_a_record_survives_its_json_form():
    rec = rj.RegionalRecord(
        id=3, deployment="tiny-chat", package="s3://m/tiny-chat:2", digest="sha256:2", version=2,
        strategy="red-black", regions=[rj.RegionEntry(context="a", namespace="ns-a"), rj.RegionEntry(context="b", namespace=None)],
    )  # fmt: skip
    rec.set_phase(
        "a", rj.ROLLING, before=rj.BeforeState(last_rollout=4, serving=[rj.ServedVersion("o1", 1, "d", "p", 2)])
    )
    back = rj.RegionalRecord.from_dict(json.loads(json.dumps(rec.to_dict())))
    assert back == rec and back.region("a").before is not None
    assert back.region("a").before.key() == {(1, "d")} and back.region("a").started is not None
    assert back.contexts == ["a", "b"] and back.is_open
    assert back.summary() == "a rolling, b pending"
    with pytest.raises(TypeError, match="not a field"):
        rec.set_phase("a", rj.MOVED, colour="red")
    # a record written by a later llmserve (an unknown key) still reads
    assert rj.RegionalRecord.from_dict(rec.to_dict() | {"new_key": 1}) == rec


def test_which_regions_a_rollback_looks_at():
    def entry(phase, changed=None):
        return rj.RegionEntry(context="x", namespace=None, phase=phase, changed=changed)

    assert not entry(rj.PENDING).maybe_moved and not entry(rj.ROLLED_BACK, True).maybe_moved
    assert entry(rj.ROLLING).maybe_moved and entry(rj.GATED, True).maybe_moved and entry(rj.FAILED).maybe_moved
    assert not entry(rj.GATED, False).maybe_moved  # it served the package before this rollout began


def test_the_before_state_is_journaled_before_each_region_changes(world):
    a, b = FakeRegion("a", {V1}), FakeRegion("b")
    out = _rollout(world, a, b).deploy(DeployOptions(package="p2.llmpkg"))
    assert [r.result for r in out.regions] == ["deployed", "deployed"]
    assert a.seen_journal == [(rj.ROLLING, {V1})] and b.seen_journal == [(rj.ROLLING, set())]
    rec = _record(world)
    assert rec.status == rj.DONE and [(e.phase, e.changed, e.rollout) for e in rec.regions] == [
        (rj.GATED, True, 7),
        (rj.GATED, True, 7),
    ]


def test_every_region_deploys_the_store_build_resolved_once(world, monkeypatch):
    # s3://.../tiny-chat:2 resolved to one archive digest before region a moved: region b must get that build
    # even if the tag is moved to another one in between
    monkeypatch.setattr(
        regions,
        "identify_package",
        lambda opts: regions.PackageIdentity("tiny-chat", opts.package, "sha256:2", 2, store_digest="abc123"),
    )
    hints = []
    monkeypatch.setattr(FakeRegion, "deploy", lambda self, opts: hints.append(opts.digest_hint) or Outcome(
        deployment="tiny-chat", action="unchanged", rollout=None))  # fmt: skip
    _rollout(world, FakeRegion("a"), FakeRegion("b")).deploy(DeployOptions(package="s3://b/p/tiny-chat:2"))
    assert hints == ["abc123", "abc123"]


def test_a_rerun_after_the_cli_died_continues_and_keeps_the_first_before_state(world):
    a, b, c = FakeRegion("a", {V1}), FakeRegion("b", {V1}, how="dies"), FakeRegion("c", {V1})
    with pytest.raises(Died):
        _rollout(world, a, b, c).deploy(DeployOptions(package="p2.llmpkg"))
    rec = _record(world)
    assert rec.status == rj.RUNNING and rec.summary() == "a gated, b rolling, c pending"
    b.how = "ok"
    b.serving = {V2}  # its own journal finished it meanwhile (as a resumed region rollout does)
    out = _rollout(world, a, b, c).deploy(DeployOptions(package="p2.llmpkg"))
    assert (a.deploys, b.deploys, c.deploys) == (1, 2, 1)  # a stays done
    assert [r.result for r in out.regions] == ["deployed", "unchanged", "deployed"]
    rec = _record(world)
    assert rec.status == rj.DONE and rec.id == 1
    # b serves the package now, but the journal still knows what it served before this rollout: it moved
    entry = rec.region("b")
    assert entry.before is not None and entry.before.key() == {V1} and entry.changed is True


def test_another_package_is_refused_while_one_is_open(world):
    a, b = FakeRegion("a", {V1}), FakeRegion("b", how="dies")
    with pytest.raises(Died):
        _rollout(world, a, b).deploy(DeployOptions(package="p2.llmpkg"))
    world["package"] = ("p3.llmpkg", "sha256:3", 3)
    with pytest.raises(rj.RegionalRolloutOpenError) as info:
        _rollout(world, a, b).deploy(DeployOptions(package="p3.llmpkg"))
    err = info.value
    assert err.exit_code == 8 and "regional rollout #1 of 'tiny-chat' is still running" in err.message
    assert "it rolls out p2.llmpkg, not p3.llmpkg" in err.message
    assert "llmserve rollback tiny-chat --target kubernetes --contexts a,b" in (err.hint or "")
    assert "llmserve deploy p2.llmpkg" in (err.hint or "")
    world["package"] = ("p2.llmpkg", "sha256:2", 2)
    with pytest.raises(rj.RegionalRolloutOpenError, match="it is over --contexts a,b"):
        _rollout(world, a).deploy(DeployOptions(package="p2.llmpkg"))
    assert a.deploys == 1  # nothing moved by the refused commands


def test_rollback_undoes_exactly_the_regions_moved_newest_first(world):
    a, b = FakeRegion("a", {V1}), FakeRegion("b", {V2})  # b already served the package: not moved by it
    c, d = FakeRegion("c", {V1}, how="dies"), FakeRegion("d", {V3})
    with pytest.raises(Died):
        _rollout(world, a, b, c, d).deploy(DeployOptions(package="p2.llmpkg"))
    c.serving = {V1, V2}  # died mid-rollout there
    out = _rollout(world, a, b, c, d).rollback("tiny-chat", None, DeployOptions(package="."))
    assert world["undone"] == ["c", "a"]
    assert [(r.context, r.result) for r in out.regions] == [
        ("a", "rolled-back"),
        ("b", "untouched"),
        ("c", "rolled-back"),
        ("d", "untouched"),
    ]
    assert (a.serving, b.serving, c.serving, d.serving) == ({V1}, {V2}, {V1}, {V3})
    rec = _record(world)
    assert rec.status == rj.ROLLED_BACK and rec.summary() == "a rolled-back, b gated, c rolled-back, d pending"
    # closed: the next rollback is the ordinary one, every listed region
    out = _rollout(world, a, d).rollback("tiny-chat", None, DeployOptions(package="."))
    assert [r.result for r in out.regions] == ["rolled-back", "rolled-back"] and world["undone"] == ["c", "a"]


def test_a_failed_region_rolls_back_only_what_moved_and_closes_the_record(world):
    a, b, c = FakeRegion("a", {V2}), FakeRegion("b", {V1}), FakeRegion("c", {V1})
    world["gates"]["c"] = "Deployment tiny-chat-2 has 0/1 ready replicas"
    with pytest.raises(regions.RegionalRolloutError) as info:
        _rollout(world, a, b, c).deploy(DeployOptions(package="p2.llmpkg"))
    assert world["undone"] == ["c", "b"]  # a was on the package before: not this rollout's to undo
    ra, rb, rc = info.value.regions
    assert ra.rollback is None and rb.rollback == RegionUndo(action="rolled-back", version=1)
    assert rc.result == "gate-failed" and rc.rollback is not None
    assert "rolled back: b, c" in info.value.message
    rec = _record(world)
    assert rec.status == rj.ROLLED_BACK and rec.summary() == "a gated, b rolled-back, c rolled-back"
    # a new rollout of another package may start: the failed one was closed
    world["package"] = ("p3.llmpkg", "sha256:3", 3)
    world["gates"].clear()
    PKG_SERVED[:] = [V3]
    try:
        _rollout(world, a, b, c).deploy(DeployOptions(package="p3.llmpkg"))
    finally:
        PKG_SERVED[:] = [V2]
    assert [r.id for r in world["store"].load("tiny-chat")] == [2, 1]


def test_a_stuck_rollback_keeps_the_record_open_for_rollback_contexts(world, monkeypatch):
    a, b = FakeRegion("a", {V1}), FakeRegion("b", how="fails")
    real_undo = regions.undo_to_before
    tries: list[str] = []

    def undo_fails_once(k, name, before, digest, opts):
        tries.append(k.ctx)
        if len(tries) == 1:
            from llmserve.deploy.errors import RolloutFailedError

            raise RolloutFailedError("cannot reach the API server")
        return real_undo(k, name, before, digest, opts)

    monkeypatch.setattr(regions, "undo_to_before", undo_fails_once)
    with pytest.raises(regions.RegionalRolloutError, match="rollback FAILED in: a"):
        _rollout(world, a, b).deploy(DeployOptions(package="p2.llmpkg"))
    assert _record(world).status == rj.FAILED and _record(world).region("a").phase == rj.ROLLBACK_FAILED
    # still open: another package is refused, and a rollback that fails again keeps it open and says how to drop it
    world["package"] = ("p3.llmpkg", "sha256:3", 3)
    with pytest.raises(rj.RegionalRolloutOpenError, match="is still failed"):
        _rollout(world, a, b).deploy(DeployOptions(package="p3.llmpkg"))
    tries.clear()
    with pytest.raises(regions.RegionalRolloutError, match="rollback of 'tiny-chat' failed in b") as info:
        _rollout(world, a, b).rollback("tiny-chat", None, DeployOptions(package="."))
    assert "kubectl delete configmap tiny-chat-llmserve-regions -n ns-a --context a" in (info.value.hint or "")
    # b's deploy failed (it rolled itself back) and is looked at too, newest first
    assert tries == ["b", "a"] and _record(world).status == rj.FAILED and a.serving == {V1}
    out = _rollout(world, a, b).rollback("tiny-chat", None, DeployOptions(package="."))
    assert tries == ["b", "a", "b"]  # a was back already: not undone twice
    assert [(r.result, r.version) for r in out.regions] == [("rolled-back", 1), ("rolled-back", 1)]
    assert _record(world).status == rj.ROLLED_BACK and a.serving == {V1}


# -- one region back to its before-state (regions.undo_to_before), over a faked region journal --------------


class Region:
    """A region's own journal (newest first) and what it serves, as undo_to_before reads and changes them."""

    def __init__(self, serving, rollouts, exists=True):
        self.serving, self.rollouts, self.exists = set(serving), rollouts, exists
        self.calls: list[str] = []
        self.ns = "ns"

    def rollback(self, name, to_version, opts):
        self.calls.append("rollback")
        open_ = next((r for r in self.rollouts if r.status == "running"), None)
        if open_ is not None:  # as KubernetesDeployer.rollback: an interrupted rollout undone, nothing more
            open_.status = "rolled-back"
            self.serving = set(open_.back)
        else:
            self.serving = set(self.rollouts[0].back)
        return Outcome(deployment=name, action="rolled-back")

    def down(self, name, drain):
        self.calls.append("down")
        self.serving = set()


def _own(rid, status, digest, back=(), strategy="red-black"):
    return SimpleNamespace(id=rid, status=status, digest=digest, package=f"p{rid}", strategy=strategy, back=back)


@pytest.fixture
def region_reads(monkeypatch):
    def state(c, name):
        k = c
        return SimpleNamespace(
            exists=lambda: k.exists,
            open_rollout=lambda: next((r for r in k.rollouts if r.status == "running"), None),
            rollouts=lambda: k.rollouts,
        )

    monkeypatch.setattr(regions, "ClusterState", state)
    monkeypatch.setattr(
        regions,
        "served",
        lambda k, name: [rj.ServedVersion(f"o{v}", v, d, None, 1) for v, d in sorted(k.serving, key=str)],
    )


def _undo(k: Region, before_serving, last_rollout=3, digest="sha256:2"):
    k.c = k
    before = rj.BeforeState(
        last_rollout=last_rollout, serving=[rj.ServedVersion(f"o{v}", v, d, None, 1) for v, d in before_serving]
    )
    return regions.undo_to_before(k, "tiny-chat", before, digest, DeployOptions(package="."))


def test_undo_reverses_this_rollouts_own_and_nothing_else(region_reads):
    k = Region({V2}, [_own(4, "done", "sha256:2", back={V1}), _own(3, "done", "sha256:1")])
    assert _undo(k, {V1}) == RegionUndo(action="rolled-back", version=1) and k.serving == {V1}
    # run again (a rollback re-run after the CLI died): it serves its before-state, nothing is done
    assert _undo(k, {V1}) == RegionUndo(action="nothing-to-undo", version=1) and k.calls == ["rollback"]


def test_undo_first_undoes_an_interrupted_rollout_of_the_region(region_reads):
    k = Region({V1, V2}, [_own(4, "running", "sha256:2", back={V1}), _own(3, "done", "sha256:1")])
    assert _undo(k, {V1}) == RegionUndo(action="rolled-back", version=1)
    assert k.calls == ["rollback"] and k.serving == {V1}


def test_undo_takes_down_a_region_that_had_nothing(region_reads):
    k = Region({V2}, [_own(1, "done", "sha256:2")])
    assert _undo(k, set(), last_rollout=0) == RegionUndo(action="removed") and k.calls == ["down"]
    gone = Region(set(), [], exists=False)
    assert _undo(gone, set(), last_rollout=0) == RegionUndo(action="nothing-to-undo")


def test_undo_leaves_a_region_changed_since_alone(region_reads):
    from llmserve.deploy.errors import RolloutFailedError

    # someone rolled v3 out there after this rollout moved it: reversing "the last rollout" would undo theirs
    k = Region({V3}, [_own(5, "done", "sha256:3", back={V2}), _own(4, "done", "sha256:2", back={V1})])
    with pytest.raises(
        RolloutFailedError, match=r"changed after this regional rollout moved it \(its last rollout is #5"
    ):
        _undo(k, {V1})
    # and a region whose last rollout predates this one (the regional rollout never got to change it)
    k = Region({V2}, [_own(3, "done", "sha256:2", back={V1})])
    with pytest.raises(RolloutFailedError, match="served v1"):
        _undo(k, {V1})
    assert k.calls == [] and k.serving == {V2}
    gone = Region(set(), [], exists=False)
    with pytest.raises(RolloutFailedError, match="is gone from namespace"):
        _undo(gone, {V1})
