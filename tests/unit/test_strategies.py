"""The rollout strategies (llmserve.deploy.strategy) against an in-memory target: every decision, in
milliseconds. The targets' own end-to-end tests (tests/deploy, tests/deploy_k8s) run the same strategies
on real processes and a real Kubernetes API."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from llmserve.deploy.errors import DeployInputError, HealthCheckFailedError, InterfaceChangedError, RolloutFailedError
from llmserve.deploy.status import Outcome, Recovery
from llmserve.deploy.strategy import (
    DONE,
    RED_BLACK,
    RETIRE,
    ROLLED_BACK,
    RUNNING,
    VERSIONED,
    LiveVersion,
    NewVersion,
    Rollouts,
    Step,
)

IFACE = {"backend": "vllm", "io": "x"}


class Killed(BaseException):
    """The CLI dies here (BaseException: nothing in the strategies may catch it)."""


@dataclass
class Rec:
    id: int
    strategy: str
    package: str
    version: int
    steps: list[int]
    old: int | None
    promote: bool | None = None
    phase: str = "starting"
    step_index: int = -1
    status: str = RUNNING
    message: str | None = None
    started_new: bool = False


@dataclass
class Fake:
    """Versions with health, a traffic split, a journal and a log of what was done in which order."""

    name: str = "m"
    traffic: dict[int, int] = field(default_factory=dict)  # version -> percent (the default route)
    pinned: set[int] = field(default_factory=set)
    running: dict[int, str] = field(default_factory=dict)  # version -> digest
    healthy: set[int] = field(default_factory=set)
    interface: dict[int, dict] = field(default_factory=dict)
    journal_: list[Rec] = field(default_factory=list)
    log: list[tuple] = field(default_factory=list)
    fail_start: bool = False
    fail_gate_at: int | None = None
    kill_old_at: int | None = None  # the live version dies during this step's gate
    kill_cli_at: tuple[str, int] | None = None  # ("shift", step) or ("start", 0)
    start_ready_after_resume: bool = True

    # journal
    def begin(self, strategy, new, live, steps, promote=None):
        old = max(self.traffic, key=lambda v: self.traffic[v]) if live is not None else None
        r = Rec(len(self.journal_) + 1, strategy, new.package, new.version, list(steps), old, promote)
        self.journal_.insert(0, r)
        self.log.append(("begin", strategy, new.version))
        return r

    def journal(self, r, event=None, **changes):
        cur = next(x for x in self.journal_ if x.id == r.id)
        for k, v in changes.items():
            setattr(cur, k, v)
        if changes:
            self.log.append(("journal", dict(changes)))
        return replace(cur)

    def event(self, kind, message, rollout=None):
        self.log.append(("event", kind))

    def open_rollout(self):
        return next((replace(r) for r in self.journal_ if r.status == RUNNING), None)

    def version_of(self, r):
        return r.version

    def summary(self, r, action):
        return Outcome(deployment=self.name, action=action, rollout=None if r is None else r.id)

    def where(self):
        return f"on '{self.name}'"

    def status_hint(self):
        return f"llmserve status {self.name}"

    # red-black
    def live(self):
        if not self.traffic:
            return None
        v = max(self.traffic, key=lambda k: self.traffic[k])
        return LiveVersion(v, self.running[v], self.interface[v])

    def unchanged(self, live, new):
        return len(self.traffic) == 1 and live.digest == new.digest and live.version == new.version

    def steps(self, r):
        return [Step(p) for p in r.steps]

    def start_new(self, r, new):
        return self.start_version(r, new)

    def shift(self, r, index):
        if self.kill_cli_at == ("shift", index):
            raise Killed
        pct = r.steps[index]
        self.traffic = {r.version: pct, **({r.old: 100 - pct} if r.old is not None and pct < 100 else {})}
        self.log.append(("shift", index, pct))
        return index

    def gate(self, r, index, mark):
        assert mark == index
        if self.kill_old_at == index and r.old is not None:
            self.running.pop(r.old, None)
            self.healthy.discard(r.old)
        if self.fail_gate_at == index:
            return "v/health is not 200"
        if r.old is not None and r.steps[index] < 100 and r.old not in self.healthy:
            return f"old v{r.old} /health is not 200"
        return None

    def step_passed(self, r, index):
        self.log.append(("passed", index))

    def finish_record(self, r):
        return {}

    def finish(self, r):
        self.traffic = {r.version: 100}
        self.pinned.add(r.version)
        if r.old is not None and r.old != r.version:
            self.running.pop(r.old, None)
            self.healthy.discard(r.old)
            self.pinned.discard(r.old)
        self.log.append(("finish", r.version))

    def old_dead_new_healthy(self, r):
        return r.old is not None and r.old not in self.healthy and r.version in self.healthy

    def undo(self, r, reason):
        if r.strategy == RED_BLACK and r.old is not None:
            self.traffic = {r.old: 100}
        self.running.pop(r.version, None)
        self.healthy.discard(r.version)
        self.pinned.discard(r.version)
        self.log.append(("undo", r.version))

    # versioned
    def existing(self, new):
        return self.running.get(new.version) if new.version in self.pinned else None

    def overlap(self, new):
        others = sorted(v for v in self.pinned if v in self.running)
        return ([f"v{v}" for v in others], "each its own engine") if others else None

    def start_version(self, r, new):
        self.journal(r, phase="health-check", started_new=True)
        self.running[new.version] = new.digest
        self.interface[new.version] = new.interface
        if self.kill_cli_at == ("start", 0):
            raise Killed
        if self.fail_start:
            self.running.pop(new.version)
            raise HealthCheckFailedError(f"v{new.version} exited before passing its health check", hint="Read the log")
        self.healthy.add(new.version)
        self.log.append(("started", new.version))
        return 1.0

    def promote_by_default(self, r):
        return r.promote if r.promote is not None else not self.traffic

    def publish(self, r, promote):
        self.pinned.add(r.version)
        if promote:
            self.traffic = {r.version: 100}
        self.log.append(("publish", r.version, promote))

    def published_note(self, r):
        return f"v{r.version} serving"

    def retire_idle(self):
        self.log.append(("retire_idle",))

    def retire_version(self, last, drain):
        if self.pinned == {last.version}:
            raise DeployInputError("only serving version")
        r = Rec(len(self.journal_) + 1, RETIRE, last.package, last.version, [], None)
        self.journal_.insert(0, r)
        self.complete_retire(r)
        return r, last.version

    # recovery
    def adopt_new(self, r):
        return r, r.version in self.running

    def wait_new_ready(self, r):
        if not self.start_ready_after_resume:
            raise HealthCheckFailedError("not ready")
        self.healthy.add(r.version)

    def complete_retire(self, r):
        self.pinned.discard(r.version)
        self.running.pop(r.version, None)
        if self.traffic.get(r.version):
            self.traffic = {max(self.pinned): 100}
        self.log.append(("retired", r.version))

    def close_rolled_back(self, last, by):
        self.journal(last, status=ROLLED_BACK, message=f"rolled back by #{by.id}")


def new(version: int, digest: str | None = None, interface: dict | None = None) -> NewVersion:
    return NewVersion("m", version, digest or f"d{version}", f"/p/v{version}.llmpkg", interface or IFACE)


def serving(version: int = 1) -> Fake:
    t = Fake()
    Rollouts(t).red_black(new(version), [10, 25, 50, 100])
    t.log.clear()
    return t


def acts(t: Fake) -> list[tuple]:
    return [e for e in t.log if e[0] not in ("journal", "event")]


def test_first_version_takes_all_traffic_in_one_step():
    t = Fake()
    out = Rollouts(t).red_black(new(1), [10, 25, 50, 100])
    assert out.action == "deployed" and t.traffic == {1: 100}
    assert t.journal_[0].steps == [100] and t.journal_[0].status == DONE
    assert acts(t) == [("begin", RED_BLACK, 1), ("started", 1), ("shift", 0, 100), ("passed", 0), ("finish", 1)]


def test_red_black_walks_every_step_and_journals_each_before_acting():
    t = serving(1)
    out = Rollouts(t).red_black(new(2), [10, 50, 100])
    assert out.action == "deployed" and t.traffic == {2: 100} and 1 not in t.running
    shifts = [e for e in acts(t) if e[0] == "shift"]
    assert shifts == [("shift", 0, 10), ("shift", 1, 50), ("shift", 2, 100)]
    for k, e in enumerate(t.log):  # each step's intent is in the journal before its traffic moves
        if e[0] == "shift":
            assert ("journal", {"step_index": e[1]}) in t.log[:k]
    finish_at = t.log.index(("finish", 2))
    assert ("journal", {"phase": "finishing"}) in t.log[:finish_at]
    assert t.journal_[0].status == DONE and t.journal_[0].phase == "done"


def test_a_failed_gate_rolls_back_to_the_live_version():
    t = serving(1)
    t.fail_gate_at = 1
    with pytest.raises(RolloutFailedError, match="rolled back at step 2 \\(50%\\)") as err:
        Rollouts(t).red_black(new(2), [10, 50, 100])
    assert "llmserve status m" in (err.value.hint or "")
    assert t.traffic == {1: 100} and 2 not in t.running
    assert t.journal_[0].status == ROLLED_BACK and "failed its health gate" in (t.journal_[0].message or "")


def test_when_the_old_version_dies_the_rollout_rolls_forward():
    t = serving(1)
    t.kill_old_at = 0
    out = Rollouts(t).red_black(new(2), [10, 50, 100])
    assert out.action == "deployed" and out.rolled_forward is not None
    assert t.traffic == {2: 100} and t.journal_[0].status == DONE


def test_a_new_version_that_cannot_start_leaves_traffic_where_it_was():
    t = serving(1)
    t.fail_start = True
    with pytest.raises(RolloutFailedError, match="rolled back: v2 exited") as err:
        Rollouts(t).red_black(new(2), [10, 100])
    assert (err.value.hint or "").endswith("traffic stayed on the live version.")
    assert t.traffic == {1: 100} and t.journal_[0].status == ROLLED_BACK
    assert not [e for e in acts(t) if e[0] == "shift"]


def test_an_interface_change_is_refused_before_anything_starts():
    t = serving(1)
    with pytest.raises(InterfaceChangedError, match="io"):
        Rollouts(t).red_black(new(2, interface={"backend": "vllm", "io": "y"}), [10, 100])
    assert acts(t) == [] and len(t.journal_) == 1


def test_the_same_package_again_changes_nothing():
    t = serving(1)
    out = Rollouts(t).red_black(new(1), [10, 100])
    assert out.action == "unchanged" and acts(t) == [] and len(t.journal_) == 1


@pytest.mark.parametrize("step", [0, 1])
def test_a_killed_cli_is_resumed_at_its_step_by_the_same_package(step):
    t = serving(1)
    t.kill_cli_at = ("shift", step)
    with pytest.raises(Killed):
        Rollouts(t).red_black(new(2), [10, 50, 100])
    t.kill_cli_at = None
    t.healthy.discard(2)  # a new process must prove its health again
    t.log.clear()
    out = Rollouts(t).recover(new(2).package)
    assert out is not None and out.recovered == "resumed" and out.resumed is True
    assert t.traffic == {2: 100} and t.journal_[0].status == DONE
    resumed = [e for e in acts(t) if e[0] == "shift"]
    assert resumed == [("shift", k, p) for k, p in enumerate([10, 50, 100])][step:]


def test_a_killed_cli_is_undone_by_any_other_command():
    t = serving(1)
    t.kill_cli_at = ("shift", 1)
    with pytest.raises(Killed):
        Rollouts(t).red_black(new(2), [10, 50, 100])
    t.kill_cli_at = None
    out = Rollouts(t).recover(None)
    assert out == Recovery(rollout=2, recovered=ROLLED_BACK, resumed=False)
    assert t.traffic == {1: 100} and 2 not in t.running


def test_a_resumed_rollout_whose_new_version_is_not_ready_is_undone():
    t = serving(1)
    t.kill_cli_at = ("start", 0)
    with pytest.raises(Killed):
        Rollouts(t).red_black(new(2), [10, 100])
    t.kill_cli_at, t.start_ready_after_resume = None, False
    out = Rollouts(t).recover(new(2).package)
    assert out is not None and out.recovered == ROLLED_BACK and t.traffic == {1: 100}


def test_a_rollout_killed_while_finishing_is_completed():
    t = serving(1)
    t.kill_cli_at = ("shift", 2)
    with pytest.raises(Killed):
        Rollouts(t).red_black(new(2), [10, 50, 100])
    t.journal(t.journal_[0], phase="finishing")
    t.kill_cli_at = None
    out = Rollouts(t).recover(None)
    assert out == Recovery(rollout=2, recovered="completed", resumed=False)
    assert t.traffic == {2: 100} and t.journal_[0].status == DONE


def test_nothing_to_recover():
    assert Rollouts(serving(1)).recover("anything") is None


def test_versioned_publishes_beside_and_promotes_only_the_first():
    t = Fake()
    Rollouts(t).versioned(new(1), None)
    assert t.traffic == {1: 100} and t.pinned == {1}
    Rollouts(t).versioned(new(2), None)
    assert t.traffic == {1: 100} and t.pinned == {1, 2} and t.running.keys() == {1, 2}
    Rollouts(t).versioned(new(3), True)
    assert t.traffic == {3: 100}
    assert t.log.count(("retire_idle",)) == 3  # idle versions are looked at after every publish


def test_versioned_warns_of_the_versions_it_runs_beside():
    t = Fake()
    said: list[str] = []
    Rollouts(t, lambda msg, **kw: said.append(msg)).versioned(new(1), None)
    assert not any("runs beside" in m for m in said)
    Rollouts(t, lambda msg, **kw: said.append(msg)).versioned(new(2), None)
    assert any("warning: v2 runs beside 1 serving version(s) (v1); each its own engine" in m for m in said)


def test_versioned_same_version_same_digest_is_unchanged_other_digest_refused():
    t = Fake()
    Rollouts(t).versioned(new(1), None)
    assert Rollouts(t).versioned(new(1), None).action == "unchanged"
    with pytest.raises(DeployInputError, match="different package"):
        Rollouts(t).versioned(new(1, digest="other"), None)


def test_versioned_that_cannot_start_is_undone():
    t = Fake()
    Rollouts(t).versioned(new(1), None)
    t.fail_start = True
    with pytest.raises(RolloutFailedError):
        Rollouts(t).versioned(new(2), None)
    assert t.pinned == {1} and t.journal_[0].status == ROLLED_BACK


def test_versioned_killed_while_publishing_is_completed_with_its_journaled_promotion():
    t = Fake()
    Rollouts(t).versioned(new(1), None)
    r = t.begin(VERSIONED, new(2), None, [], True)
    t.start_version(t.journal(r), new(2))
    t.journal(r, phase="publishing")
    out = Rollouts(t).recover(None)
    assert out is not None and out.recovered == "completed"
    assert t.traffic == {2: 100} and t.journal_[0].status == DONE


def test_retire_takes_the_newest_version_out_and_closes_its_rollout():
    t = Fake()
    Rollouts(t).versioned(new(1), None)
    Rollouts(t).versioned(new(2), True)
    out = Rollouts(t).retire(t.journal_[0])
    assert out.retired_version == 2 and t.pinned == {1} and t.traffic == {1: 100}
    assert t.journal_[1].status == ROLLED_BACK and t.journal_[0].strategy == RETIRE
    with pytest.raises(DeployInputError, match="only serving version"):
        Rollouts(t).retire(t.journal_[2])
