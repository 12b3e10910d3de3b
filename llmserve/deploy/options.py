"""What a `llmserve deploy` asks for, on any target."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmserve.deploy.errors import DeployInputError
from llmserve.deploy.local_keys import KeyRequest
from llmserve.deploy.source import is_reference
from llmserve.deploy.strategy import DEFAULT_STEPS, RED_BLACK

if TYPE_CHECKING:
    from llmserve.store import StoreOptions

LOCK_WAIT_S = 120.0  # how long a command waits for another change (a CLI or the idle reaper) to finish


@dataclass
class DeployOptions:
    package: Path | str  # a local package, or a model store reference s3://BUCKET/PREFIX/MODEL_ID:VERSION
    strategy: str = RED_BLACK
    name: str | None = None  # default: the package's modelId
    steps: list[int] = field(default_factory=lambda: list(DEFAULT_STEPS))
    pause_s: float = 5.0
    health_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0
    host: str = "127.0.0.1"
    port: int | None = None  # gateway port; default: chosen once, then kept
    grpc_port: int | None = None  # gateway KServe v2 gRPC port; default: chosen once, then kept
    idle_timeout_s: float | None = None  # versioned: stop idle non-newest versions after this
    promote: bool | None = None  # versioned: make the new version the default for unversioned requests
    max_step_errors: int = 0  # health gate: server errors (5xx, broken connections) allowed per step
    hold_timeout_s: float | None = None  # gateway: how long a request waits for a restarting server (kept)
    api_key: KeyRequest = field(default_factory=KeyRequest)  # --api-key-file / env, --no-api-key, --rotate
    serve_args: list[str] = field(default_factory=list)
    cache_dir: Path | None = None  # store references: the store cache (default: the deployment's, else the usual)
    store: StoreOptions | None = None  # store references: endpoint, profile, region (credentials: AWS config)
    digest_hint: str | None = None  # store references: the digest recorded for it (rollback finds it cached)
    serve_package: str | None = None  # set by deploy: what servers are started with (the source's serve_ref)


def parse_steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise DeployInputError(f"--steps '{text}': expected comma-separated percentages, e.g. 10,25,50,100") from None
    if not steps or steps[-1] != 100 or any(not 0 < s <= 100 for s in steps) or steps != sorted(set(steps)):
        raise DeployInputError(f"--steps '{text}': percentages must rise strictly, each in 1..100, ending at 100")
    return steps


def rollback_options(
    opts: DeployOptions, name: str | None = None, package: str | None = None, digest: str | None = None
) -> DeployOptions:
    """The red-black deploy a rollback makes of an earlier package: the rollout settings of `opts` (steps,
    pause, timeouts, server arguments, store), the earlier package (a path, or a store reference found by its
    recorded digest), nothing else of the command that asked."""
    ref = package is not None and is_reference(package)
    return DeployOptions(
        package=package if ref and package is not None else Path(package or "."),
        cache_dir=opts.cache_dir,
        store=opts.store,
        digest_hint=digest if ref else None,
        strategy=RED_BLACK,
        name=name,
        steps=opts.steps,
        pause_s=opts.pause_s,
        health_timeout_s=opts.health_timeout_s,
        drain_timeout_s=opts.drain_timeout_s,
        serve_args=opts.serve_args,
    )
