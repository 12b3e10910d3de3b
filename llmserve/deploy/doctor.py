"""`llmserve deploy doctor`: what runs for a state folder when its database cannot say.

Every daemon a local deployment starts (watchdog, gateway, servers, and what they spawn: vLLM's engine
core) carries the environment variable LLMSERVE_DEPLOYMENT=<state folder>::<name>, which children
inherit. So the processes of a state folder are found from /proc alone, even when its database was
deleted or corrupted. The doctor compares them with the database: processes the database does not
record (orphans) are reported, and with `--fix` stopped (their whole sessions); a database SQLite
cannot read is moved aside (never deleted) so the next command starts a fresh one. Adopting orphans
back into a fresh database is not attempted: their routes and rollout journal are gone with the old
database, so the safe repair is to stop them and deploy again.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmserve.deploy import procs

TAG_ENV = "LLMSERVE_DEPLOYMENT"


def tag(root: Path, name: str) -> str:
    return f"{Path(root).resolve()}::{name}"


@dataclass
class Found:
    pid: int
    start: str | None
    session: int | None
    deployment: str
    role: str  # watchdog, gateway, server, other (an engine core, a resource tracker...)


@dataclass
class Diagnosis:
    state_dir: str
    database: str  # ok, missing, or "unreadable: <why>"
    processes: list[Found] = field(default_factory=list)
    orphans: list[Found] = field(default_factory=list)  # running for this folder, unknown to its database
    actions: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.database in ("ok", "missing") and not self.orphans

    def to_dict(self) -> dict:
        return {**asdict(self), "healthy": self.healthy}


def scan(root: Path) -> list[Found]:
    """Processes of this user tagged with this state folder."""
    prefix = f"{Path(root).resolve()}::"
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone, or another user's
        value = next((e[len(TAG_ENV) + 1 :] for e in environ if e.startswith(TAG_ENV.encode() + b"=")), None)
        if value is None or not value.decode(errors="replace").startswith(prefix):
            continue
        start = procs.start_time(pid)
        if start is None:
            continue
        found.append(Found(pid, start, procs.session_of(pid), value.decode()[len(prefix) :], _role(cmdline)))
    return found


def _role(cmdline: str) -> str:
    for module, role in (
        ("llmserve.deploy.watchdog", "watchdog"),
        ("llmserve.deploy.gateway", "gateway"),
        ("llmserve.cli.app serve", "server"),
    ):
        if module in cmdline:
            return role
    return "other"


def diagnose(root: Path) -> Diagnosis:
    root = Path(root)
    db = root / "state.db"
    diagnosis = Diagnosis(str(root), "missing" if not db.exists() else "ok", scan(root))
    recorded_sessions: set[int] = set()
    if db.exists():
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            try:
                check = conn.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise sqlite3.DatabaseError(check)
                for (session,) in conn.execute("SELECT session FROM instances WHERE session IS NOT NULL"):
                    recorded_sessions.add(session)
                for (session,) in conn.execute(
                    "SELECT gateway_session FROM deployments WHERE gateway_session IS NOT NULL"
                ):
                    recorded_sessions.add(session)
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            diagnosis.database = f"unreadable: {exc}"
    diagnosis.orphans = [p for p in diagnosis.processes if p.session not in recorded_sessions]
    return diagnosis


def repair(root: Path) -> Diagnosis:
    """Move an unreadable database aside and stop the orphans (each with its whole session)."""
    root = Path(root)
    diagnosis = diagnose(root)
    if diagnosis.database.startswith("unreadable"):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for suffix in ("", "-wal", "-shm"):
            path = root / f"state.db{suffix}"
            if path.exists():
                aside = root / f"state.db{suffix}.unreadable-{stamp}"
                path.rename(aside)
                diagnosis.actions.append(f"moved {path.name} aside to {aside.name}")
    for session in sorted({p.session for p in diagnosis.orphans if p.session}):
        members = [p for p in diagnosis.orphans if p.session == session]
        stopped = procs.kill_session(session, grace=10.0)
        diagnosis.actions.append(
            f"stopped {stopped} process(es) of deployment '{members[0].deployment}' "
            f"({', '.join(sorted({p.role for p in members}))}) that no database recorded"
        )
    return diagnosis
