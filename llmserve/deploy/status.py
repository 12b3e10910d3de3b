"""Typed records of what `llmserve status`, `deploy` and `rollback` report, for both targets.

LocalStatus (a deployment behind the local gateway) and ClusterStatus (a deployment in a Kubernetes namespace)
are what each target's status returns; Outcome wraps one of them with what a deploy or rollback did.
`to_json()` gives the documented JSON of `--output json` (scripts and tests read those keys): a record's
field names are its keys, except where a field's metadata says otherwise (`key`: another name; `omit_none`:
left out when None, for keys that only some results carry).

Dataclasses rather than pydantic models: values pass through exactly as the state holds them (an int stays an
int in the JSON), like the state records they are built from (llmserve.deploy.state,
llmserve.deploy.kubernetes.state).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

_OMIT_NONE = {"omit_none": True}


def json_value(value: Any) -> Any:
    """A record, or a list or dict of them, as its JSON form (anything else as it is)."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    return value


@dataclass(kw_only=True)
class Record:
    """Base of the status records: to_json() by fields (see the module's doc)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.metadata.get("key", f.name)] = json_value(value)
        return out


@dataclass(kw_only=True)
class HistoryEvent(Record):
    ts: float
    kind: str
    rollout: int | None
    message: str

    @classmethod
    def of(cls, e: dict[str, Any]) -> HistoryEvent:
        """One history line as either journal holds it (SQLite row, ConfigMap entry)."""
        return cls(ts=e["ts"], kind=e["kind"], rollout=e["rollout"], message=e["message"])


# -- local target ---------------------------------------------------------------------------------


@dataclass(kw_only=True)
class RolloutRecord(Record):
    """A local rollout as status shows it (llmserve.deploy.state.Rollout; `step` counts from 1)."""

    id: int
    strategy: str
    status: str
    phase: str
    package: str
    steps: list[int]
    step: int
    from_instance: int | None
    to_instance: int | None
    message: str | None
    started: float
    updated: float
    # True on the open rollout when no CLI holds the deployment's lock (the next deploy resumes it)
    interrupted: bool | None = field(default=None, metadata=_OMIT_NONE)
    seconds: float | None = field(default=None, metadata=_OMIT_NONE)  # a deploy's own rollout: how long it took


@dataclass(kw_only=True)
class GatewayStatus(Record):
    url: str
    grpc: str | None
    pid: int | None
    alive: bool
    generation_applied: int | None  # the routes generation the gateway says it serves (None: it did not answer)
    log: str


@dataclass(kw_only=True)
class RoutesStatus(Record):
    """The journaled routing table and its generation; JSON: {"generation", "model_id", "default", "pinned"}."""

    generation: int
    table: dict[str, Any]  # llmserve.deploy.state.Routes.to_dict()

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, **self.table}


@dataclass(kw_only=True)
class InstanceStatus(Record):
    """One `llmserve serve` process, checked now."""

    instance: int
    version: int
    status: str
    strategy: str
    url: str
    pid: int | None
    alive: bool
    health: int | None  # the status of /health; None: not asked (dead) or no answer
    restarts: int
    down_since: float | None
    last_exit: str | None
    memory_bytes: int
    weight: int
    routable_by_version: bool
    inflight: int
    last_request: float | None
    package: str
    digest: str | None
    log: str | None
    metrics: dict[str, Any] | None = field(default=None, metadata=_OMIT_NONE)  # status's figures, when scraped


@dataclass(kw_only=True)
class LocalStatus(Record):
    """One deployment on the local target (llmserve.deploy.rollout.status_of)."""

    target: ClassVar[str] = "local"  # not in the JSON: the local status never carried the key

    deployment: str
    degraded: list[str]
    model_id: str
    state_dir: str
    gateway: GatewayStatus
    routes: RoutesStatus
    config: dict[str, Any]
    auth: Literal["open", "api-key"]
    instances: list[InstanceStatus]
    open_rollout: RolloutRecord | None
    rollouts: list[RolloutRecord]
    history: list[HistoryEvent]


# -- Kubernetes target ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class ClusterRolloutRecord(Record):
    """A Kubernetes rollout as status shows it (llmserve.deploy.kubernetes.state.ClusterRollout)."""

    id: int
    strategy: str
    status: str
    phase: str
    package: str
    version: int
    steps: list[int]
    plan: list[dict[str, Any]]
    replicas: int
    message: str | None
    started: float
    updated: float
    step: int
    from_: str | None = field(metadata={"key": "from"})  # the replaced Deployment object
    to: str | None
    seconds: float | None = field(default=None, metadata=_OMIT_NONE)


@dataclass(kw_only=True)
class OpenClusterRollout(ClusterRolloutRecord):
    interrupted: bool  # no live holder of the deployment's Lease
    holder: str | None  # host:pid of the Lease's holder


@dataclass(kw_only=True)
class ClusterDeploymentStatus(Record):
    """One Kubernetes Deployment object of an llmserve deployment."""

    object: str
    strategy: str | None
    color: str | None
    version: int
    replicas: int
    ready: int
    digest: str | None
    package: str | None
    package_uri: str | None
    rollout: str | None
    superseded_at: float | None
    pods: list[PodFigures] | None = field(default=None, metadata=_OMIT_NONE)  # status's figures, when scraped


@dataclass(kw_only=True)
class PodFigures(Record):
    """One pod of a Deployment object with the figures `status` scraped from it
    (llmserve.deploy.kubernetes.figures)."""

    pod: str
    ip: str | None
    url: str | None  # None before the pod has an IP
    ready: bool
    # llmserve.metrics.snapshot's figures, the form `llmserve metrics tail` prints (None figures and an `error`
    # where the pod could not be scraped)
    metrics: dict[str, Any]


@dataclass(kw_only=True)
class ServiceStatus(Record):
    service: str
    selector: dict[str, str] | None
    cluster_ip: str | None
    ready_endpoints_by_version: dict[str, int]
    not_ready_endpoints: int


@dataclass(kw_only=True)
class AutoscalerCondition(Record):
    type: str | None
    status: str | None
    reason: str | None
    message: str | None


@dataclass(kw_only=True)
class AutoscalerStatus(Record):
    """The HorizontalPodAutoscaler on the queue (llmserve.deploy.kubernetes.autoscale.describe)."""

    object: str
    target: str | None
    min_replicas: int | None
    max_replicas: int | None
    metric: str
    queue_target: str | None
    # the per-pod average of the metric the HPA controller last read (a quantity, e.g. "9" or "1500m"); None
    # until it has read one (no custom metrics API, or no pod reporting the metric)
    current_value: str | None = None
    current_replicas: int | None
    desired_replicas: int | None
    conditions: list[AutoscalerCondition]


@dataclass(kw_only=True)
class AutoscalerUnreadable(Record):
    """The autoscaler could not be read (JSON: {"error": ...})."""

    error: str


@dataclass(kw_only=True)
class ClusterStatus(Record):
    """One deployment in a Kubernetes namespace (llmserve.deploy.kubernetes.rollout.KubernetesDeployer.status)."""

    target: Literal["kubernetes"] = "kubernetes"
    deployment: str
    namespace: str
    context: str | None
    server: str
    model_id: str | None
    strategy: str | None
    default_version: int | None
    config: dict[str, Any]
    deployments: list[ClusterDeploymentStatus]
    services: list[ServiceStatus]
    open_rollout: OpenClusterRollout | None
    rollouts: list[ClusterRolloutRecord]
    history: list[HistoryEvent]
    autoscaler: AutoscalerStatus | AutoscalerUnreadable | None


Status = LocalStatus | ClusterStatus


# -- results of deploy and rollback ---------------------------------------------------------------


@dataclass(kw_only=True)
class Recovery(Record):
    """What a command did with a rollout whose CLI had died (llmserve.deploy.strategy.Rollouts.recover), where
    it did not resume it."""

    rollout: int
    recovered: str  # completed, resumed, rolled-back, rolled-forward
    resumed: bool


@dataclass(kw_only=True)
class Outcome(Record):
    """What a deploy or rollback did, with the deployment's status after it.

    JSON: the status's keys, then `action` and those of the keys below that this outcome has. Where the
    command only undid an interrupted rollout (no status), {"deployment", "action", "rollout", "recovered",
    "resumed"}."""

    deployment: str
    action: str  # deployed, unchanged, rolled-back, undid-interrupted-rollout
    status: Status | None = None
    # the rollout this command ran; an int (its id) where the command resumed an interrupted rollout
    rollout: RolloutRecord | ClusterRolloutRecord | int | None = None
    rolled_forward: str | None = None  # why a failed gate moved forward rather than back
    retired_version: int | None = None
    # a string where this command's own outcome is the recovery; a Recovery where a deploy recovered first
    recovered: str | Recovery | None = None
    resumed: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = self.status.to_json() if self.status is not None else {"deployment": self.deployment}
        out["action"] = self.action
        for key in ("rollout", "rolled_forward", "retired_version", "recovered", "resumed"):
            value = getattr(self, key)
            if value is not None:
                out[key] = json_value(value)
        return out

    @classmethod
    def undid(cls, deployment: str, recovery: Recovery) -> Outcome:
        """A rollback that only undid (or completed) an interrupted rollout: no rollout of its own, no status."""
        return cls(
            deployment=deployment,
            action="undid-interrupted-rollout",
            rollout=recovery.rollout,
            recovered=recovery.recovered,
            resumed=recovery.resumed,
        )


# -- results of deploy down -----------------------------------------------------------------------


@dataclass(kw_only=True)
class LocalTeardown(Record):
    """What `deploy down` did on the local target (llmserve.deploy.rollout.Deployer.down)."""

    deployment: str
    action: Literal["removed"] = "removed"
    stopped_instances: list[int]  # the servers stopped, by instance id


@dataclass(kw_only=True)
class ClusterTeardown(Record):
    """What `deploy down` did in a Kubernetes namespace (KubernetesDeployer.down, llmserve.deploy.kubernetes)."""

    deployment: str
    action: Literal["removed"] = "removed"
    removed: list[str]  # the objects deleted: Deployment names, then "service/NAME", "secret/NAME", ...
    namespace: str


Teardown = LocalTeardown | ClusterTeardown


# -- results of region-by-region rollouts (llmserve.deploy.kubernetes.regions) --------------------


@dataclass(kw_only=True)
class RegionGate(Record):
    """What the gate between regions saw of one region (llmserve.deploy.kubernetes.regions.region_gate)."""

    pause_s: float
    pods: int  # the new version's pods
    failed: str | None  # why the gate failed; None: it passed
    restarts: int  # restarts of the new version's pods during the pause
    errors: int | None  # server errors of the new pods during the pause; None: their /metrics unread
    figures: str  # how many pods were scraped, or why none could be


@dataclass(kw_only=True)
class RegionDeploymentSummary(Record):
    """One Deployment object of a region after its rollout (a short ClusterDeploymentStatus)."""

    object: str
    version: int
    color: str | None
    replicas: int
    ready: int
    digest: str | None


@dataclass(kw_only=True)
class RegionUndo(Record):
    """What undoing a moved region did. JSON: {"action"}, with "version" where it rolled back and "error" where
    that failed. nothing-to-undo: the region served its before-state already (journaled rollouts only)."""

    action: Literal["rolled-back", "removed", "rollback-failed", "nothing-to-undo"]
    version: int | None = None  # rolled-back: the version the region serves now
    error: str | None = None  # rollback-failed: why

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action}
        if self.action in ("rolled-back", "nothing-to-undo"):
            out["version"] = self.version  # present even when unknown (None), as it always was
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(kw_only=True)
class RegionDeploy(Record):
    """One region of a regional deploy, filled in as the rollout reaches it. JSON: context, namespace, server,
    result; then, for a region whose deploy failed, error and exit_code; for a region deployed, deployment,
    version, deployments, rollout (if any), gate, and error (a failed gate) and rollback (undone) where they
    apply. A region not reached has the first four only."""

    context: str
    namespace: str | None
    server: str
    result: str  # not-started, failed, deployed, unchanged, gate-failed
    deployment: str | None = None  # set once the region's deploy returned
    version: int | None = None
    deployments: list[RegionDeploymentSummary] = field(default_factory=list)
    # the region's rollout; its id where that deploy resumed an interrupted rollout
    rollout: ClusterRolloutRecord | int | None = None
    gate: RegionGate | None = None
    error: str | None = None  # why the region's deploy or its gate failed
    exit_code: int | None = None  # the failed deploy's exit code
    rollback: RegionUndo | None = None

    def to_json(self) -> dict[str, Any]:
        out = _region_head(self)
        if self.deployment is None:  # not started, or its deploy failed: nothing else was learnt of it
            keys: tuple[str, ...] = ("error", "exit_code")
        else:
            out["deployment"] = self.deployment
            out["version"] = self.version  # present even when unknown (None)
            out["deployments"] = json_value(self.deployments)
            keys = ("rollout", "gate", "error", "exit_code", "rollback")
        for key in keys:
            value = getattr(self, key)
            if value is not None:
                out[key] = json_value(value)
        return out


@dataclass(kw_only=True)
class RegionRollback(Record):
    """One region of a regional rollback. JSON: context, namespace, server, result, then version (the region's
    rollback returned) or error (it failed)."""

    context: str
    namespace: str | None
    server: str
    # the region's rollback action (rolled-back, undid-interrupted-rollout; journaled: removed, nothing-to-undo, or
    # untouched: the open regional rollout never moved it), or failed
    result: str
    version: int | None = None  # the version served after the rollback, where known
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = _region_head(self)
        if self.result == "failed":
            out["error"] = self.error
        else:
            out["version"] = self.version  # present even when unknown (None)
        return out


@dataclass(kw_only=True)
class RegionalOutcome(Record):
    """What a regional deploy or rollback did, region by region (llmserve.deploy.kubernetes.regions)."""

    target: Literal["kubernetes"] = "kubernetes"
    deployment: str | None  # None only where no region got as far as naming it
    action: str  # deployed, unchanged, rolled-back
    regions: list[RegionDeploy] | list[RegionRollback]


def _region_head(r: RegionDeploy | RegionRollback) -> dict[str, Any]:
    """The keys every region's JSON starts with, in their order."""
    return {"context": r.context, "namespace": r.namespace, "server": r.server, "result": r.result}
