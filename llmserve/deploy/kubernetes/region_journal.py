"""The cross-region journal of region-by-region rollouts (llmserve.deploy.kubernetes.regions).

One record per regional rollout: its id, the package (reference, digest, version), the contexts in order and,
per region, what that region served before this rollout reached it (its before-state) and how far the rollout
got there (its phase):

    pending -> rolling -> moved -> gated              the region's own deploy ran, then its gate passed
                       \\-> failed                     its deploy or its gate failed
    (rolling | moved | gated | failed) -> rolled-back | rollback-failed

The before-state is written before the region changes (phase rolling) and never rewritten afterwards, so a
re-run or a `rollback --contexts` after the CLI died still knows what the region served before *this*
rollout, even though the region itself already serves the package by then.

Where it lives: a ConfigMap `<name>-llmserve-regions` in the namespace of the coordinating (first) context,
beside the first region's own journal (`<name>-llmserve`, llmserve.deploy.kubernetes.state). A cluster-side
record, not the local state folder, because a regional rollout is a team's: whoever re-runs or rolls it back,
from any machine with the kubeconfig, finds it where the first region is. One record in one place is written
by one atomic ConfigMap replace with its resourceVersion (optimistic concurrency: a conflict re-reads and
applies the change again), so a `kill -9` at any point leaves either the step before or the step after, never
half of one. Copies in every region would need writes to several API servers that cannot be made atomic
together. Readers look in every context they are given (one GET each), so a `rollback --contexts` that names
the regions in another order still finds it. A Lease `<name>-regions-llmserve-lock` beside it keeps two CLIs
from driving the same regional rollout at once; each region's own Lease still guards that region.

A record is open while its status is `running` (a CLI is driving it, or died doing so) or `failed` (a region
failed and some rollback did not finish): a deploy of the same package over the same contexts continues it,
`llmserve rollback NAME --contexts ...` undoes it, anything else is refused (RegionalRolloutOpenError).
The newest records are kept (RECORDS_MAX) as history. A record no rollback can close (a region's deployment
deleted by hand) is dropped with `kubectl delete configmap <name>-llmserve-regions`: the regions' own journals
do not depend on it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from llmserve.deploy.errors import DeploymentBusyError

PENDING, ROLLING, MOVED, GATED, FAILED = "pending", "rolling", "moved", "gated", "failed"
ROLLED_BACK, ROLLBACK_FAILED = "rolled-back", "rollback-failed"
# a record's status
RUNNING, DONE = "running", "done"
OPEN = (RUNNING, FAILED)
RECORDS_MAX = 10
L_REGIONAL = "llmserve.dev/regional-rollout"
L_MANAGED = "app.kubernetes.io/managed-by"


def journal_name(name: str) -> str:
    return f"{name}-llmserve-regions"


@dataclass
class ServedVersion:
    """One Deployment a region ran (with replicas) when the regional rollout reached it."""

    object: str
    version: int
    digest: str | None
    package: str | None
    replicas: int


@dataclass
class BeforeState:
    """What a region served before the regional rollout changed it."""

    last_rollout: int = 0  # the newest id in the region's own journal then (0: it had none)
    serving: list[ServedVersion] = field(default_factory=list)  # empty: nothing was deployed there

    def key(self) -> set[tuple[int, str | None]]:
        return {(s.version, s.digest) for s in self.serving}

    def describe(self) -> str:
        if not self.serving:
            return "nothing"
        return ", ".join(
            f"v{s.version} ({(s.digest or '?')[:19]})" for s in sorted(self.serving, key=lambda s: s.version)
        )


@dataclass
class RegionEntry:
    context: str
    namespace: str | None
    phase: str = PENDING
    before: BeforeState | None = None  # set once, just before the region changes
    changed: bool | None = None  # whether its deploy moved it off its before-state (None: not known yet)
    rollout: int | None = None  # the region's own rollout id, where its deploy reported one
    error: str | None = None
    started: float | None = None
    updated: float | None = None

    @property
    def maybe_moved(self) -> bool:
        """This rollout may have changed the region: a rollback must look at it (and finds out from its state)."""
        return self.phase in (ROLLING, MOVED, GATED, FAILED, ROLLBACK_FAILED) and self.changed is not False


@dataclass
class RegionalRecord:
    id: int
    deployment: str
    package: str  # the reference deployed (a resolved path, or a store reference)
    digest: str | None  # None only for an unpacked source folder
    version: int
    strategy: str
    regions: list[RegionEntry]
    status: str = RUNNING
    message: str | None = None
    cli: str | None = None  # host:pid of the command that wrote it last
    started: float = 0.0
    updated: float = 0.0

    @property
    def contexts(self) -> list[str]:
        return [r.context for r in self.regions]

    @property
    def is_open(self) -> bool:
        return self.status in OPEN

    def region(self, context: str) -> RegionEntry:
        return next(r for r in self.regions if r.context == context)

    def set_phase(self, context: str, phase: str, **changes: Any) -> RegionEntry:
        entry = self.region(context)
        now = time.time()
        entry.phase = phase
        for key, value in changes.items():
            if not hasattr(entry, key):
                raise TypeError(f"not a field of a region entry: {key}")
            setattr(entry, key, value)
        entry.started = entry.started or now
        entry.updated = now
        return entry

    def summary(self) -> str:
        return ", ".join(f"{r.context} {r.phase}" for r in self.regions)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegionalRecord:
        regions = []
        for r in data.get("regions", []):
            before = r.get("before")
            regions.append(
                RegionEntry(
                    **{k: v for k, v in r.items() if k in _ENTRY_FIELDS and k != "before"},
                    before=None
                    if before is None
                    else BeforeState(
                        last_rollout=before.get("last_rollout", 0),
                        serving=[ServedVersion(**s) for s in before.get("serving", [])],
                    ),
                )
            )
        return cls(**{k: v for k, v in data.items() if k in _RECORD_FIELDS and k != "regions"}, regions=regions)


_ENTRY_FIELDS = set(RegionEntry.__dataclass_fields__)
_RECORD_FIELDS = set(RegionalRecord.__dataclass_fields__)

T = TypeVar("T")


class JournalStore(Protocol):
    """Where one context keeps the records of a deployment's regional rollouts, newest first."""

    def load(self, name: str) -> list[RegionalRecord]: ...

    def update(self, name: str, mutate: Callable[[list[RegionalRecord]], T]) -> T:
        """mutate(records) in place (newest first), written back atomically; its return value is returned."""
        ...

    def lock(self, name: str) -> Any:
        """A context manager held while a CLI drives (or undoes) the deployment's regional rollout."""
        ...


class MemoryJournal:
    """A JournalStore in this process only (tests; a regional rollout with nowhere durable to write)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def load(self, name: str) -> list[RegionalRecord]:
        return [RegionalRecord.from_dict(r) for r in json.loads(self.data.get(name, "[]"))]

    def update(self, name: str, mutate: Callable[[list[RegionalRecord]], T]) -> T:
        records = self.load(name)
        out = mutate(records)
        self.data[name] = json.dumps([r.to_dict() for r in records[:RECORDS_MAX]])
        return out

    def lock(self, name: str) -> Any:
        return nullcontext()


class ConfigMapJournal:
    """The records in ConfigMap <name>-llmserve-regions of one context's namespace (data.records: JSON)."""

    def __init__(self, cluster: Any):
        self.c = cluster

    def _get(self, name: str) -> Any:
        from llmserve.deploy.kubernetes.cluster import api_call

        cm_name = journal_name(name)
        return api_call(
            f"read ConfigMap {cm_name}",
            self.c.core.read_namespaced_config_map,
            cm_name,
            self.c.namespace,
            not_found_ok=True,
        )

    def load(self, name: str) -> list[RegionalRecord]:
        cm = self._get(name)
        return _decode(cm) if cm is not None else []

    def update(self, name: str, mutate: Callable[[list[RegionalRecord]], T]) -> T:
        from kubernetes.client.exceptions import ApiException

        from llmserve.deploy.kubernetes.cluster import KubernetesAPIError, api_call
        from llmserve.deploy.kubernetes.state import raise_

        cm_name = journal_name(name)
        for _ in range(10):
            cm = self._get(name)
            records = _decode(cm) if cm is not None else []
            out = mutate(records)
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": cm_name,
                    "namespace": self.c.namespace,
                    "labels": {L_REGIONAL: name, L_MANAGED: "llmserve"},
                },
                "data": {"records": json.dumps([r.to_dict() for r in records[:RECORDS_MAX]])},
            }
            try:
                if cm is None:
                    self.c.core.create_namespaced_config_map(self.c.namespace, body)
                else:
                    body["metadata"]["resourceVersion"] = cm.metadata.resource_version
                    self.c.core.replace_namespaced_config_map(cm_name, self.c.namespace, body)
                return out
            except ApiException as exc:
                if exc.status != 409:  # 409: another writer came first (or created it): read again
                    api_call(f"write ConfigMap {cm_name}", raise_, exc)
            time.sleep(0.05)
        raise KubernetesAPIError(f"could not write ConfigMap {cm_name}: conflicting writers")

    @contextmanager
    def lock(self, name: str) -> Iterator[None]:
        from llmserve.deploy.kubernetes.state import LeaseLock

        with LeaseLock(self.c, f"{name}-regions", wait_s=5.0):
            yield


def _decode(cm: Any) -> list[RegionalRecord]:
    return [RegionalRecord.from_dict(r) for r in json.loads((cm.data or {}).get("records", "[]"))]


class RegionalRolloutOpenError(DeploymentBusyError):
    """A regional rollout of the deployment is still open: only its own package may continue it."""

    code = "regional-rollout-open"


def refuse_open(rec: RegionalRecord, where: str, why: str) -> RegionalRolloutOpenError:
    """The error for a command that would cross `rec`, an open regional rollout journaled in context `where`."""
    ctx = ",".join(rec.contexts)
    return RegionalRolloutOpenError(
        f"regional rollout #{rec.id} of '{rec.deployment}' is still {rec.status} ({rec.summary()}; journal in "
        f"context '{where}'): {why}",
        hint=f"Finish it with `llmserve deploy {rec.package} --target kubernetes --contexts {ctx}`, or undo the "
        f"regions it moved with `llmserve rollback {rec.deployment} --target kubernetes --contexts {ctx}`.",
    )
