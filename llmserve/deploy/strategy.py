"""The rollout strategies, written once for every target.

A strategy decides what happens and in which order; a target (llmserve.deploy.local_rollout: processes
behind the gateway; llmserve.deploy.kubernetes.rollout: Deployments behind a Service) only carries it
out. Every decision is journaled before the target acts on it, so the next command can finish or undo
a rollout whose CLI was killed.

red-black  The interface must be unchanged (callers cannot choose a side). Journal, start the new
           version beside the live one and wait for its health, then shift traffic step by step (the
           target says what a step is: gateway weights, or a replica ratio behind a Service), each step
           gated on health. Then finish (the old version out of every route, drained, stopped) or undo
           atomically to the last healthy state; when the version being replaced is the one that died
           and the new one is healthy, going back would route to a dead server, so it rolls forward.
versioned  Start the new version beside the others, publish it as routable by version (and as the
           default when asked, or when there is no other), then retire idle versions: never the newest,
           never the default.
retire     The rollback of a versioned rollout: that version out of every route, then stopped.
recovery   An open journal entry found by the next command: in phase finishing or publishing, it is
           completed; the same package asked again while the new version still runs, it is resumed at
           its journaled step once healthy; anything else is undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from llmserve.deploy import interface as iface
from llmserve.deploy.errors import DeployInputError, HealthCheckFailedError, InterfaceChangedError, RolloutFailedError
from llmserve.deploy.status import Outcome, Recovery

RED_BLACK, VERSIONED, RETIRE = "red-black", "versioned", "retire"
RUNNING, DONE, ROLLED_BACK = "running", "done", "rolled-back"  # journal statuses, the same on every target
ROLLED_FORWARD = "rolled-forward"
FINISHING, PUBLISHING = "finishing", "publishing"  # phases after which a rollout is completed, not undone
DEFAULT_STEPS = [10, 25, 50, 100]


class RolloutRecord(Protocol):
    """What the strategies read of a target's journal entry (targets keep more)."""

    @property
    def id(self) -> int: ...
    @property
    def strategy(self) -> str: ...
    @property
    def package(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def step_index(self) -> int: ...


R = TypeVar("R", bound=RolloutRecord)


@dataclass(frozen=True)
class NewVersion:
    """The package a rollout brings: what every target needs to know before it starts anything."""

    model_id: str
    version: int
    digest: str | None
    package: str  # as recorded: a path, or a model store reference as given
    interface: dict


@dataclass(frozen=True)
class LiveVersion:
    """The version that takes the traffic now, as a red-black rollout sees it."""

    version: int
    digest: str | None
    interface: dict


@dataclass(frozen=True)
class Step:
    """One red-black step as its target carries it out."""

    percent: int
    detail: str = ""  # how the target splits it, e.g. "(1 new / 1 old replica(s))"


class Target(Protocol[R]):
    """The mechanism a strategy runs on: a journal, and ways to start, route to and stop versions of one
    deployment. Methods that wait raise HealthCheckFailedError when what they wait for does not happen."""

    name: str  # the deployment

    # journal
    def begin(
        self, strategy: str, new: NewVersion, live: LiveVersion | None, steps: list[int], promote: bool | None = None
    ) -> R: ...
    def journal(self, r: R, event: str | None = None, **changes: Any) -> R: ...
    def event(self, kind: str, message: str, rollout: int | None = None) -> None: ...
    def open_rollout(self) -> R | None: ...
    def version_of(self, r: R) -> int: ...
    def summary(self, r: R | None, action: str) -> Outcome: ...  # the status now, `action`, r's record
    def where(self) -> str: ...  # "on 'name'", "on 'name' in namespace 'ns'": for messages
    def status_hint(self) -> str: ...  # the command that shows the deployment

    # red-black
    def live(self) -> LiveVersion | None: ...
    def unchanged(self, live: LiveVersion, new: NewVersion) -> bool: ...
    def steps(self, r: R) -> list[Step]: ...
    def start_new(self, r: R, new: NewVersion) -> float: ...
    def shift(self, r: R, index: int) -> Any: ...
    def gate(self, r: R, index: int, mark: Any) -> str | None: ...
    def step_passed(self, r: R, index: int) -> None: ...
    def finish_record(self, r: R) -> dict: ...
    def finish(self, r: R) -> None: ...
    def old_dead_new_healthy(self, r: R) -> bool: ...
    def undo(self, r: R, reason: str) -> None: ...

    # versioned
    def existing(self, new: NewVersion) -> str | None: ...  # digest of that version if it already serves
    def overlap(self, new: NewVersion) -> tuple[list[str], str] | None: ...  # serving versions, what each costs
    def start_version(self, r: R, new: NewVersion) -> float: ...
    def promote_by_default(self, r: R) -> bool: ...
    def publish(self, r: R, promote: bool) -> None: ...
    def published_note(self, r: R) -> str: ...
    def retire_idle(self) -> None: ...
    def retire_version(self, last: R, drain: bool) -> tuple[R, int]: ...

    # recovery
    def adopt_new(self, r: R) -> tuple[R, bool]: ...  # the record (to_instance found), whether the new runs
    def wait_new_ready(self, r: R) -> None: ...
    def complete_retire(self, r: R) -> None: ...
    def close_rolled_back(self, last: R, by: R) -> None: ...


class Rollouts(Generic[R]):
    """The strategies over one target. `report(msg, **fields)` shows progress."""

    def __init__(self, target: Target[R], report=None):
        self.t = target
        self.report = report or (lambda msg, **kw: None)

    # -- red-black ----------------------------------------------------------------------------
    def red_black(self, new: NewVersion, steps: list[int]) -> Outcome:
        t = self.t
        live = t.live()
        if live is not None:
            diff = iface.differences(live.interface, new.interface)
            if diff:
                raise InterfaceChangedError(
                    f"the interface of {new.model_id} v{new.version} differs from the live v{live.version} "
                    f"({', '.join(row[0] for row in diff)}): red-black would mix two interfaces behind one name",
                    details=[iface.difference_detail(diff)],
                )
            if t.unchanged(live, new):
                self.report(f"v{new.version} with this digest already serves '{t.name}': nothing to do")
                return t.summary(None, "unchanged")
        r = t.begin(RED_BLACK, new, live, steps if live is not None else [100])
        plan = t.steps(r)
        self.report(
            f"rollout #{r.id}: {new.model_id} v{new.version} red-black {t.where()} ("
            + (", ".join(f"{s.percent}%{s.detail}" for s in plan) if live is not None else "first version")
            + ")"
        )
        try:
            took = t.start_new(r, new)
        except HealthCheckFailedError as exc:
            self.undo(t.journal(r), f"health check failed: {exc.message.splitlines()[0]}")
            hint = (
                exc.hint + ("; traffic stayed on the live version." if live is not None else "") if exc.hint else None
            )
            raise RolloutFailedError(f"rollout #{r.id} rolled back: {exc.message}", hint=hint) from exc
        self.report(f"v{new.version} healthy after {took:.1f} s")
        return self.shift(t.journal(r), 0)

    def shift(self, r: R, start: int) -> Outcome:
        """Walk the steps from `start`; each: journal the intent, shift, pause and gate on health."""
        t = self.t
        plan = t.steps(r)
        version = t.version_of(r)
        r = t.journal(r, phase="shifting")
        for i in range(start, len(plan)):
            step = plan[i]
            r = t.journal(
                r, step_index=i, event=f"step {i + 1}/{len(plan)}: {step.percent}% to v{version}{step.detail}"
            )
            try:
                mark = t.shift(r, i)
                self.report(
                    f"step {i + 1}/{len(plan)}: {step.percent}% of traffic on v{version}{step.detail}",
                    step=i + 1,
                    percent=step.percent,
                )
                problem = t.gate(r, i, mark)
            except HealthCheckFailedError as exc:
                problem = exc.message.splitlines()[0]
            if problem:
                reason = f"step {i + 1} ({step.percent}%) failed its health gate: {problem}"
                if self.undo(t.journal(r), reason) == ROLLED_FORWARD:
                    out = t.summary(t.journal(r), "deployed")
                    out.rolled_forward = reason
                    return out
                raise RolloutFailedError(
                    f"rollout #{r.id} rolled back at step {i + 1} ({step.percent}%): {problem}",
                    hint=f"Traffic is back on the last healthy state; see `{t.status_hint()}`.",
                )
            t.step_passed(r, i)
        return self.finish(t.journal(r))

    def finish(self, r: R) -> Outcome:
        """The new version takes everything; the old one leaves every route, drains and stops."""
        t = self.t
        version = t.version_of(r)
        r = t.journal(r, phase=FINISHING, event=f"100% on v{version}; removing the old version", **t.finish_record(r))
        t.finish(r)
        r = t.journal(r, status=DONE, phase="done", event=f"rollout #{r.id} done: v{version} takes 100%")
        self.report(f"rollout #{r.id} done: v{version} takes 100% of '{t.name}'")
        return t.summary(r, "deployed")

    def undo(self, r: R, reason: str) -> str:
        """Back to the last healthy state, atomically; or forward, when the replaced version is the one that
        died and the new one is healthy. Returns ROLLED_BACK or ROLLED_FORWARD."""
        t = self.t
        if r.strategy == RED_BLACK and t.old_dead_new_healthy(r):
            version = t.version_of(r)
            r = t.journal(
                r,
                phase=FINISHING,
                event=f"{reason}; the version being replaced is not healthy and v{version} is: rolling forward",
            )
            self.report(f"{reason}; the old version is not healthy, v{version} is: rolling forward")
            self.finish(r)
            return ROLLED_FORWARD
        r = t.journal(r, phase="rolling-back", event=f"rolling back: {reason}")
        self.report(f"rolling back rollout #{r.id}: {reason}")
        t.undo(r, reason)
        t.journal(r, status=ROLLED_BACK, phase="rolled-back", message=reason, event=f"rollout #{r.id} rolled back")
        return ROLLED_BACK

    # -- versioned ----------------------------------------------------------------------------
    def versioned(self, new: NewVersion, promote: bool | None) -> Outcome:
        t = self.t
        existing = t.existing(new)
        if existing is not None:
            if existing == new.digest:
                self.report(f"v{new.version} is already serving {t.where()}: nothing to do")
                t.retire_idle()
                return t.summary(None, "unchanged")
            raise DeployInputError(
                f"v{new.version} of '{new.model_id}' already serves a different package (digest differs)",
                hint="Give the new package its own modelVersion, or replace this version with --strategy red-black.",
            )
        r = t.begin(VERSIONED, new, None, [], promote)
        self.report(f"rollout #{r.id}: {new.model_id} v{new.version} versioned {t.where()}")
        serving = t.overlap(new)
        if serving:
            versions, cost = serving
            self.report(
                f"warning: v{new.version} runs beside {len(versions)} serving version(s) ({', '.join(versions)}); "
                f"{cost}, so the overlap costs that much more until old versions are retired (--idle-timeout, "
                "`llmserve rollback`).",
                warning=True,
            )
        try:
            took = t.start_version(r, new)
        except HealthCheckFailedError as exc:
            self.undo(t.journal(r), f"health check failed: {exc.message.splitlines()[0]}")
            raise RolloutFailedError(f"rollout #{r.id} rolled back: {exc.message}", hint=exc.hint) from exc
        self.report(f"v{new.version} healthy after {took:.1f} s")
        return self.publish(t.journal(r), promote)

    def publish(self, r: R, promote: bool | None) -> Outcome:
        t = self.t
        version = t.version_of(r)
        if promote is None:
            promote = t.promote_by_default(r)
        r = t.journal(r, phase=PUBLISHING, event=f"v{version} routable" + (" and the default" if promote else ""))
        t.publish(r, promote)
        r = t.journal(r, status=DONE, phase="done", event=f"rollout #{r.id} done: v{version} serving")
        self.report(t.published_note(r))
        t.retire_idle()
        return t.summary(r, "deployed")

    def retire(self, last: R) -> Outcome:
        """Roll back a versioned rollout: its version out of every route, then drained and stopped."""
        t = self.t
        r, version = t.retire_version(last, drain=True)
        t.journal(r, status=DONE, phase="done", event=f"v{version} retired")
        t.close_rolled_back(last, r)
        out = t.summary(t.journal(r), "rolled-back")
        out.retired_version = version
        return out

    # -- recovery -----------------------------------------------------------------------------
    def recover(self, resume_package: str | None, promote: bool | None = None) -> Recovery | Outcome | None:
        """Finish or undo a rollout whose CLI died (the caller holds the deployment's lock, so its owner
        is gone). Returns what was done with it; an Outcome (the command's result) only where it was resumed,
        None where there was none."""
        t = self.t
        r = t.open_rollout()
        if r is None:
            return None
        where = f"in phase '{r.phase}' at step {r.step_index + 1}"
        t.event("interrupted", f"rollout #{r.id} ({r.strategy}) was interrupted {where}; recovering", r.id)
        self.report(f"found interrupted rollout #{r.id} ({r.strategy}, phase {r.phase}, step {r.step_index + 1})")
        if r.strategy == RETIRE:
            t.complete_retire(r)
            t.journal(r, status=DONE, phase="done", event=f"retire #{r.id} completed on recovery")
            return Recovery(rollout=r.id, recovered="completed", resumed=False)
        r, new_runs = t.adopt_new(r)
        if r.phase in (FINISHING, PUBLISHING):
            if r.strategy == RED_BLACK:
                self.finish(r)
            else:
                self.publish(r, promote)
            return Recovery(rollout=r.id, recovered="completed", resumed=False)
        if resume_package is not None and r.package == resume_package and new_runs:
            try:
                t.wait_new_ready(r)
            except HealthCheckFailedError as exc:
                outcome = self.undo(r, f"interrupted rollout not healthy: {exc.message.splitlines()[0]}")
                return Recovery(rollout=r.id, recovered=outcome, resumed=False)
            step = max(r.step_index, 0)
            self.report(f"resuming rollout #{r.id} at step {step + 1}")
            t.event("resumed", f"rollout #{r.id} resumed at step {step + 1}", r.id)
            out = self.publish(t.journal(r), promote) if r.strategy == VERSIONED else self.shift(t.journal(r), step)
            out.recovered, out.resumed = "resumed", True
            out.rollout = r.id  # named by its id, as Outcome.rollout documents for a resumed rollout
            return out
        outcome = self.undo(r, "interrupted rollout (its CLI stopped)")
        return Recovery(rollout=r.id, recovered=outcome, resumed=False)


def idle_versions(
    versions: set[int], idle_since: dict[int, float], defaults: set[int], idle_s: float, now: float
) -> list[int]:
    """The versions to retire for idleness: idle (superseded, or without a request) for idle_s or longer,
    never the newest, never one the default route sends traffic to. One rule for every target."""
    if not versions:
        return []
    newest = max(versions)
    return sorted(
        v for v in versions if v != newest and v not in defaults and v in idle_since and now - idle_since[v] >= idle_s
    )
