"""Deployment state, routes, the rollout journal and history, in one SQLite database.

The database is the truth every command and the gateway read; processes (servers, the gateway)
are described by rows, never by what one CLI remembers. Layout (`--state-dir`, default
`$LLMSERVE_STATE_DIR` or `$XDG_DATA_HOME/llmserve/deploy` or `~/.local/share/llmserve/deploy`):

    state.db            this database (WAL mode: the gateway reads while a CLI writes)
    locks/<name>.lock   flock held by the one command changing a deployment (released by the kernel
                        when that process dies: a free lock plus a `running` rollout means "interrupted")
    run/<name>-<id>.pid pid files written by the launcher (so a process spawned just before a crash
                        is still found), logs/<name>-<id>.log server and gateway logs

Tables:
    deployments  one row per deployment (name, modelId, gateway address and process)
    instances    one row per server process (version, package, interface, port, pid, status)
    routes       the gateway's routing table per deployment, with a generation number
    rollouts     the journal: intent is written before each action (step, last good routes)
    events       the history: one line per thing that happened
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmserve.deploy.errors import (
    DeployInputError,
    DeploymentBusyError,
    DeploymentNotFoundError,
    StateUnreadableError,
)

STATE_ENV = "LLMSERVE_STATE_DIR"

SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (
    name TEXT PRIMARY KEY,
    model_id TEXT NOT NULL,
    gateway_host TEXT NOT NULL,
    gateway_port INTEGER NOT NULL,
    gateway_pid INTEGER,
    gateway_start TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS instances (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment TEXT NOT NULL,
    model_version INTEGER NOT NULL,
    package TEXT NOT NULL,
    digest TEXT,
    interface TEXT NOT NULL DEFAULT '{}',
    strategy TEXT NOT NULL,
    port INTEGER NOT NULL,
    pid INTEGER,
    pid_start TEXT,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    ready_at REAL,
    stopped_at REAL,
    last_request REAL,
    log TEXT
);
CREATE TABLE IF NOT EXISTS routes (
    deployment TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    body TEXT NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment TEXT NOT NULL,
    strategy TEXT NOT NULL,
    from_instance INTEGER,
    to_instance INTEGER,
    package TEXT NOT NULL,
    steps TEXT NOT NULL DEFAULT '[]',
    step_index INTEGER NOT NULL DEFAULT -1,
    phase TEXT NOT NULL,
    status TEXT NOT NULL,
    message TEXT,
    last_good TEXT NOT NULL,
    cli_pid INTEGER,
    started REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    deployment TEXT NOT NULL,
    rollout INTEGER,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS instances_by_deployment ON instances(deployment, status);
CREATE INDEX IF NOT EXISTS events_by_deployment ON events(deployment, id);
"""

# Columns added after the first release: (table, column, declaration). Added in place on open, so a
# state folder written by an older llmserve keeps working.
ADDED_COLUMNS = (
    ("instances", "session", "INTEGER"),  # the daemon's session id: finds its children after it died
    ("instances", "argv", "TEXT"),  # JSON: how it was started, so the supervisor can start it again
    ("instances", "restarts", "INTEGER NOT NULL DEFAULT 0"),
    ("instances", "down_since", "REAL"),  # set while the supervisor restarts it; NULL when it serves
    ("instances", "last_exit", "TEXT"),  # why it last went down
    ("deployments", "gateway_session", "INTEGER"),
    ("instances", "grpc_port", "INTEGER"),  # the server's loopback KServe v2 gRPC port (the gateway proxies to it)
)

# Instance lifecycle. Only `serving` instances may appear in routes.
STARTING, SERVING, DRAINING, STOPPED, FAILED = "starting", "serving", "draining", "stopped", "failed"
LIVE_STATUSES = (STARTING, SERVING, DRAINING)

# Rollout journal status.
RUNNING, DONE, ROLLED_BACK = "running", "done", "rolled-back"


def default_state_dir() -> Path:
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llmserve" / "deploy"


@dataclass
class Member:
    """One backend in a route: an instance, its version, its URL and (in the default pool) its weight."""

    instance: int
    version: int
    url: str
    weight: int = 0

    def to_dict(self) -> dict:
        return {"instance": self.instance, "version": self.version, "url": self.url, "weight": self.weight}


@dataclass
class Routes:
    """The gateway's table. `default` takes requests that name no version (weighted: red-black shifts these
    weights); `pinned` takes requests naming a version (every serving version is reachable by its number)."""

    model_id: str
    default: list[Member] = field(default_factory=list)
    pinned: dict[int, list[Member]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "model_id": self.model_id,
            "default": [m.to_dict() for m in self.default],
            "pinned": {str(v): [m.to_dict() for m in ms] for v, ms in sorted(self.pinned.items())},
        }

    @classmethod
    def from_dict(cls, data: dict) -> Routes:
        return cls(
            data["model_id"],
            [Member(**m) for m in data.get("default", [])],
            {int(v): [Member(**m) for m in ms] for v, ms in data.get("pinned", {}).items()},
        )

    def instances(self) -> set[int]:
        return {m.instance for m in self.default} | {m.instance for ms in self.pinned.values() for m in ms}

    def weights(self) -> dict[int, int]:
        return {m.instance: m.weight for m in self.default}


@dataclass
class Instance:
    id: int
    deployment: str
    model_version: int
    package: str
    digest: str | None
    interface: dict
    strategy: str
    port: int
    pid: int | None
    pid_start: str | None
    status: str
    created: float
    ready_at: float | None
    stopped_at: float | None
    last_request: float | None
    log: str | None
    session: int | None = None
    argv: list[str] | None = None
    restarts: int = 0
    down_since: float | None = None
    last_exit: str | None = None
    grpc_port: int | None = None  # None: started by an llmserve that did not record it (not reachable over gRPC)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def member(self, weight: int = 0) -> Member:
        return Member(self.id, self.model_version, self.url, weight)


@dataclass
class Rollout:
    id: int
    deployment: str
    strategy: str
    from_instance: int | None
    to_instance: int | None
    package: str
    steps: list[int]
    step_index: int
    phase: str
    status: str
    message: str | None
    last_good: dict
    cli_pid: int | None
    started: float
    updated: float


@dataclass
class Deployment:
    name: str
    model_id: str
    gateway_host: str
    gateway_port: int
    gateway_pid: int | None
    gateway_start: str | None
    config: dict
    created: float
    updated: float
    gateway_session: int | None = None

    @property
    def gateway_url(self) -> str:
        return f"http://{self._host_in_url}:{self.gateway_port}"

    @property
    def _host_in_url(self) -> str:
        """An IPv6 literal (`::1`, `::`) in brackets: without them the URL or address is invalid."""
        return f"[{self.gateway_host}]" if ":" in self.gateway_host else self.gateway_host

    @property
    def grpc_port(self) -> int | None:
        """The gateway's KServe v2 gRPC port (config `grpc_port`); None for a deployment made before it existed."""
        port = self.config.get("grpc_port")
        return int(port) if port else None

    @property
    def grpc_address(self) -> str | None:
        return f"{self._host_in_url}:{self.grpc_port}" if self.grpc_port else None


def _row_instance(row: sqlite3.Row) -> Instance:
    d = dict(row)
    d["interface"] = json.loads(d["interface"] or "{}")
    d["argv"] = json.loads(d["argv"]) if d.get("argv") else None
    return Instance(**d)


def _row_rollout(row: sqlite3.Row) -> Rollout:
    d = dict(row)
    d["steps"] = json.loads(d["steps"])
    d["last_good"] = json.loads(d["last_good"])
    return Rollout(**d)


def _row_deployment(row: sqlite3.Row) -> Deployment:
    d = dict(row)
    d["config"] = json.loads(d["config"] or "{}")
    return Deployment(**d)


def _row_id(cur: sqlite3.Cursor) -> int:
    """The id SQLite gave the row an INSERT just wrote (never None after a successful INSERT)."""
    if cur.lastrowid is None:
        raise RuntimeError("INSERT returned no row id")
    return cur.lastrowid


class StateStore:
    """Typed access to the state database. Every write is one transaction."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_state_dir()
        for sub in ("locks", "run", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.path = self.root / "state.db"
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute("PRAGMA busy_timeout=30000")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
            self._add_columns()
            # Damage past the header shows only when a page is read: check before trusting it.
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(check)
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise StateUnreadableError(
                f"the deployment state database {self.path} cannot be read: {exc}",
                hint=f"`llmserve deploy doctor --state-dir {self.root}` shows what still runs for it; "
                "with --fix it moves the database aside and stops those processes, then deploy again.",
            ) from exc

    def _add_columns(self) -> None:
        for table, column, decl in ADDED_COLUMNS:
            have = {r["name"] for r in self.db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                try:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
                except sqlite3.OperationalError as exc:  # another process added it first
                    if "duplicate column" not in str(exc):
                        raise

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")

    # -- paths ---------------------------------------------------------------------------------
    def pid_file(self, deployment: str, what: str) -> Path:
        return self.root / "run" / f"{check_name(deployment)}-{what}.pid"

    def log_file(self, deployment: str, what: str) -> Path:
        return self.root / "logs" / f"{check_name(deployment)}-{what}.log"

    # -- deployments ---------------------------------------------------------------------------
    def deployment(self, name: str) -> Deployment | None:
        row = self.db.execute("SELECT * FROM deployments WHERE name=?", (name,)).fetchone()
        return _row_deployment(row) if row else None

    def require(self, name: str) -> Deployment:
        dep = self.deployment(name)
        if dep is None:
            raise DeploymentNotFoundError(f"no deployment named '{name}' in {self.root}")
        return dep

    def deployments(self) -> list[Deployment]:
        return [_row_deployment(r) for r in self.db.execute("SELECT * FROM deployments ORDER BY name")]

    def create_deployment(self, name: str, model_id: str, host: str, port: int, config: dict) -> Deployment:
        check_name(name)
        now = time.time()
        with self.tx() as db:
            db.execute(
                "INSERT INTO deployments(name, model_id, gateway_host, gateway_port, config, created, updated) "
                "VALUES (?,?,?,?,?,?,?)",
                (name, model_id, host, port, json.dumps(config), now, now),
            )
            db.execute(
                "INSERT INTO routes(deployment, generation, body, updated) VALUES (?,?,?,?)",
                (name, 0, json.dumps(Routes(model_id).to_dict()), now),
            )
            self._event(db, name, None, "created", f"deployment '{name}' for model '{model_id}', gateway {host}:{port}")
        return self.require(name)

    def update_deployment_config(self, name: str, config: dict) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE deployments SET config=?, updated=? WHERE name=?", (json.dumps(config), time.time(), name)
            )

    def set_gateway_process(self, name: str, pid: int | None, start: str | None, session: int | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE deployments SET gateway_pid=?, gateway_start=?, gateway_session=?, updated=? WHERE name=?",
                (pid, start, session, time.time(), name),
            )

    def delete_deployment(self, name: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM deployments WHERE name=?", (name,))
            db.execute("DELETE FROM routes WHERE deployment=?", (name,))
            self._event(db, name, None, "removed", f"deployment '{name}' torn down")

    # -- instances -----------------------------------------------------------------------------
    def add_instance(
        self,
        deployment: str,
        version: int,
        package: str,
        digest: str | None,
        interface: dict,
        strategy: str,
        port: int,
        grpc_port: int | None = None,
    ) -> Instance:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO instances(deployment, model_version, package, digest, interface, strategy, port, status, "
                "created, grpc_port) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    deployment,
                    version,
                    package,
                    digest,
                    json.dumps(interface),
                    strategy,
                    port,
                    STARTING,
                    time.time(),
                    grpc_port,
                ),
            )
            iid = _row_id(cur)
            log = str(self.log_file(deployment, f"i{iid}-v{version}"))
            db.execute("UPDATE instances SET log=? WHERE id=?", (log, iid))
        return self.instance(iid)

    def instance(self, iid: int) -> Instance:
        return _row_instance(self.db.execute("SELECT * FROM instances WHERE id=?", (iid,)).fetchone())

    def grpc_ports(self, deployment: str) -> dict[int, int]:
        """{instance id: loopback gRPC port} of the deployment's live servers that have one recorded."""
        marks = ",".join("?" * len(LIVE_STATUSES))
        rows = self.db.execute(
            f"SELECT id, grpc_port FROM instances WHERE deployment=? AND grpc_port IS NOT NULL AND status IN ({marks})",
            (deployment, *LIVE_STATUSES),
        )
        return {int(r["id"]): int(r["grpc_port"]) for r in rows}

    def new_instance_of(self, rollout: Rollout) -> Instance:
        """The server a rollout started; every rollout past its first journal entry has one."""
        if rollout.to_instance is None:
            raise RuntimeError(f"rollout #{rollout.id} has no new instance recorded")
        return self.instance(rollout.to_instance)

    def instances(self, deployment: str, statuses: tuple[str, ...] | None = LIVE_STATUSES) -> list[Instance]:
        if statuses is None:
            rows = self.db.execute("SELECT * FROM instances WHERE deployment=? ORDER BY id", (deployment,))
        else:
            marks = ",".join("?" * len(statuses))
            rows = self.db.execute(
                f"SELECT * FROM instances WHERE deployment=? AND status IN ({marks}) ORDER BY id",
                (deployment, *statuses),
            )
        return [_row_instance(r) for r in rows]

    def set_instance_process(
        self, iid: int, pid: int, start: str | None, session: int | None = None, argv: list[str] | None = None
    ) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE instances SET pid=?, pid_start=?, session=COALESCE(?, session), argv=COALESCE(?, argv) "
                "WHERE id=?",
                (pid, start, session, json.dumps(argv) if argv else None, iid),
            )

    # The supervisor (in the gateway process) restarts serving instances while a CLI may be stopping
    # them: each step is a compare-and-set on (status, pid), so whichever acts second sees the change.
    def mark_down(self, iid: int, pid: int | None, why: str) -> bool:
        """A serving instance's process is gone: record it (once). False if the row moved on meanwhile."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE instances SET down_since=?, last_exit=? "
                "WHERE id=? AND status=? AND pid IS ? AND down_since IS NULL",
                (time.time(), why, iid, SERVING, pid),
            )
            if cur.rowcount:
                dep = db.execute("SELECT deployment FROM instances WHERE id=?", (iid,)).fetchone()[0]
                self._event(db, dep, None, "instance-down", why)
            return cur.rowcount == 1

    def claim_restart(self, iid: int, pid: int | None) -> bool:
        """Take a down, still-serving instance for a restart: its pid is cleared until the new one runs."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE instances SET pid=NULL, pid_start=NULL, session=NULL, restarts=restarts+1 "
                "WHERE id=? AND status=? AND pid IS ? AND down_since IS NOT NULL",
                (iid, SERVING, pid),
            )
            return cur.rowcount == 1

    def restarted(self, iid: int, pid: int, start: str | None, session: int) -> bool:
        """Record the restarted process; False if a CLI stopped the instance meanwhile (kill what we started)."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE instances SET pid=?, pid_start=?, session=? WHERE id=? AND status=? AND pid IS NULL",
                (pid, start, session, iid, SERVING),
            )
            return cur.rowcount == 1

    def mark_up(self, iid: int, message: str) -> None:
        with self.tx() as db:
            cur = db.execute("UPDATE instances SET down_since=NULL WHERE id=? AND down_since IS NOT NULL", (iid,))
            if cur.rowcount:
                dep = db.execute("SELECT deployment FROM instances WHERE id=?", (iid,)).fetchone()[0]
                self._event(db, dep, None, "instance-recovered", message)

    def instances_to_reap(self, deployment: str, limit: int = 50) -> list[Instance]:
        """Recently stopped or failed instances that still have a pid recorded (a leak check)."""
        rows = self.db.execute(
            "SELECT * FROM instances WHERE deployment=? AND status IN (?, ?) AND pid IS NOT NULL "
            "ORDER BY id DESC LIMIT ?",
            (deployment, STOPPED, FAILED, limit),
        )
        return [_row_instance(r) for r in rows]

    def set_instance_status(self, iid: int, status: str, message: str | None = None) -> None:
        now = time.time()
        with self.tx() as db:
            if status == SERVING:
                db.execute(
                    "UPDATE instances SET status=?, ready_at=COALESCE(ready_at, ?) WHERE id=?", (status, now, iid)
                )
            elif status in (STOPPED, FAILED):
                db.execute("UPDATE instances SET status=?, stopped_at=? WHERE id=?", (status, now, iid))
            else:
                db.execute("UPDATE instances SET status=? WHERE id=?", (status, iid))
            if message:
                dep = db.execute("SELECT deployment FROM instances WHERE id=?", (iid,)).fetchone()[0]
                self._event(db, dep, None, f"instance-{status}", message)

    def touch_instances(self, last_request: dict[int, float]) -> None:
        if not last_request:
            return
        with self.tx() as db:
            for iid, ts in last_request.items():
                db.execute("UPDATE instances SET last_request=MAX(COALESCE(last_request, 0), ?) WHERE id=?", (ts, iid))

    # -- routes --------------------------------------------------------------------------------
    def routes(self, deployment: str) -> tuple[int, Routes]:
        row = self.db.execute("SELECT generation, body FROM routes WHERE deployment=?", (deployment,)).fetchone()
        if row is None:
            raise DeploymentNotFoundError(f"no routes for deployment '{deployment}'")
        return row["generation"], Routes.from_dict(json.loads(row["body"]))

    def set_routes(self, deployment: str, routes: Routes, *, rollout: int | None = None, why: str = "") -> int:
        with self.tx() as db:
            gen = db.execute("SELECT generation FROM routes WHERE deployment=?", (deployment,)).fetchone()[0] + 1
            db.execute(
                "UPDATE routes SET generation=?, body=?, updated=? WHERE deployment=?",
                (gen, json.dumps(routes.to_dict()), time.time(), deployment),
            )
            weights = ", ".join(f"v{m.version}#{m.instance}={m.weight}%" for m in routes.default) or "none"
            self._event(
                db,
                deployment,
                rollout,
                "routes",
                f"generation {gen}: default {weights}; "
                f"pinned versions {sorted(routes.pinned) or 'none'}" + (f" ({why})" if why else ""),
            )
        return gen

    # -- rollouts (the journal) ----------------------------------------------------------------
    def begin_rollout(
        self,
        deployment: str,
        strategy: str,
        package: str,
        from_instance: int | None,
        steps: list[int],
        last_good: Routes,
    ) -> Rollout:
        now = time.time()
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO rollouts(deployment, strategy, from_instance, package, steps, phase, status, last_good, "
                "cli_pid, started, updated) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    deployment,
                    strategy,
                    from_instance,
                    package,
                    json.dumps(steps),
                    "starting",
                    RUNNING,
                    json.dumps(last_good.to_dict()),
                    os.getpid(),
                    now,
                    now,
                ),
            )
            rid = _row_id(cur)
            self._event(db, deployment, rid, "rollout-begin", f"{strategy} rollout #{rid} of {package}")
        return self.rollout(rid)

    def rollout(self, rid: int) -> Rollout:
        return _row_rollout(self.db.execute("SELECT * FROM rollouts WHERE id=?", (rid,)).fetchone())

    def open_rollout(self, deployment: str) -> Rollout | None:
        row = self.db.execute(
            "SELECT * FROM rollouts WHERE deployment=? AND status=? ORDER BY id DESC LIMIT 1", (deployment, RUNNING)
        ).fetchone()
        return _row_rollout(row) if row else None

    def rollouts(self, deployment: str, limit: int = 20) -> list[Rollout]:
        rows = self.db.execute(
            "SELECT * FROM rollouts WHERE deployment=? ORDER BY id DESC LIMIT ?", (deployment, limit)
        )
        return [_row_rollout(r) for r in rows]

    def journal(
        self,
        rid: int,
        *,
        phase: str | None = None,
        step_index: int | None = None,
        to_instance: int | None = None,
        last_good: Routes | None = None,
        status: str | None = None,
        message: str | None = None,
        event: str | None = None,
    ) -> None:
        sets: list[str] = ["updated=?", "cli_pid=?"]
        args: list[object] = [time.time(), os.getpid()]
        for col, val in (
            ("phase", phase),
            ("step_index", step_index),
            ("to_instance", to_instance),
            ("status", status),
            ("message", message),
        ):
            if val is not None:
                sets.append(f"{col}=?")
                args.append(val)
        if last_good is not None:
            sets.append("last_good=?")
            args.append(json.dumps(last_good.to_dict()))
        with self.tx() as db:
            db.execute(f"UPDATE rollouts SET {', '.join(sets)} WHERE id=?", (*args, rid))
            if event:
                dep = db.execute("SELECT deployment FROM rollouts WHERE id=?", (rid,)).fetchone()[0]
                self._event(db, dep, rid, phase or status or "rollout", event)

    # -- history -------------------------------------------------------------------------------
    def _event(self, db: sqlite3.Connection, deployment: str, rollout: int | None, kind: str, message: str) -> None:
        db.execute(
            "INSERT INTO events(ts, deployment, rollout, kind, message) VALUES (?,?,?,?,?)",
            (time.time(), deployment, rollout, kind, message),
        )

    def event(self, deployment: str, kind: str, message: str, rollout: int | None = None) -> None:
        with self.tx() as db:
            self._event(db, deployment, rollout, kind, message)

    def events(self, deployment: str, limit: int = 30) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM events WHERE deployment=? ORDER BY id DESC LIMIT ?", (deployment, limit))
        return [dict(r) for r in rows][::-1]


# Names become file names under the state folder (locks, pid files, logs): no separators, no dot-dot.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        raise DeployInputError(
            f"'{name}' is not a valid deployment name",
            hint="Use letters, digits, '.', '_' or '-' (at most 63, starting and ending with a letter or digit).",
        )
    return name


class DeploymentLock:
    """An exclusive flock per deployment. The kernel drops it when the holder dies, so a `running`
    rollout whose lock is free was interrupted."""

    def __init__(self, store: StateStore, name: str, wait_s: float = 0.0):
        self.path = store.root / "locks" / f"{check_name(name)}.lock"
        self.name = name
        self.wait_s = wait_s  # commands wait (e.g. for the gateway retiring an idle version), then give up
        self.fd: int | None = None

    def acquire(self, wait_s: float = 0.0) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.1)

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> DeploymentLock:
        if not self.acquire(self.wait_s):
            raise DeploymentBusyError(
                f"deployment '{self.name}' is being changed by another command (waited {self.wait_s:g} s for its lock)"
            )
        return self

    def __exit__(self, *exc) -> None:
        self.release()
