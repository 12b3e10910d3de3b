"""Build, tag and push a rendered context through the Docker Engine API (the `docker` SDK).

Any engine that speaks the API works: Docker, or `podman system service`. The engine is found the
way the docker CLI finds it: DOCKER_HOST (with DOCKER_TLS_VERIFY / DOCKER_CERT_PATH), else the
default socket. Every failure names its step: engine, base, a Dockerfile step (with its last log
lines), tag, push.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from llmserve.build.context import RenderedContext
from llmserve.build.errors import (
    DEFAULT_SOCKET,
    BuildStepError,
    EngineUnreachableError,
    PushRefusedError,
    UnknownBaseError,
)

# (kind, text): kind is "step" (a Dockerfile step starts), "log" (its output) or "push".
ProgressCallback = Callable[[str, str], None]
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?(STEP \d+/\d+: |Step \d+/\d+ : )(.*)$")
_BUILT = re.compile(r"^Successfully built ([0-9a-f]{12,64})\s*$")
TAIL_LINES = 25


def _docker() -> Any:
    # without the `build` extra this ModuleNotFoundError becomes MissingExtraError (llmserve.errors.MODULE_EXTRAS)
    import docker

    return docker


def engine_host() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def connect(timeout: float = 1800) -> Any:
    """A docker.DockerClient that answered a ping, or EngineUnreachableError naming where it looked."""
    docker = _docker()
    host = engine_host()
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' errors or OSError by transport
        raise EngineUnreachableError(
            f"no Docker Engine API answers at {host} (DOCKER_HOST{'' if 'DOCKER_HOST' in os.environ else ' unset'}): "
            f"{_one_line(exc)}"
        ) from exc
    return client


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "explanation", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:400]


def engine_version(client: Any) -> str:
    try:
        v = client.version()
    except Exception:
        return "unknown"
    components = {c.get("Name", ""): c.get("Version", "") for c in v.get("Components") or []}
    name = "Podman Engine" if "Podman Engine" in components else "Docker Engine"
    return f"{name} {components.get(name) or v.get('Version', '?')} (API {v.get('ApiVersion', '?')})"


def ensure_base(client: Any, base: str, progress: ProgressCallback | None = None) -> str:
    """The base image's id, from the engine or pulled; UnknownBaseError when neither works."""
    docker = _docker()
    try:
        return str(client.images.get(base).id)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        raise UnknownBaseError(
            f"base image {base}: the engine at {engine_host()} could not look it up: {_one_line(exc)}",
            hint="Check the reference (--base), or load the image into the engine first.",
        ) from exc
    if progress:
        progress("step", f"pull {base}")
    try:
        return str(client.images.pull(base).id)
    except Exception as exc:
        raise UnknownBaseError(
            f"base image {base}: not in the engine at {engine_host()}, and pulling it failed: {_one_line(exc)}",
            hint=(
                "Give a base the engine has or can pull with --base (a Python "
                "image for local-cpu, the Triton vLLM image for a Triton line), or load it first "
                "(`podman load -i base.tar`, `docker pull REF`)."
            ),
        ) from exc


@dataclass
class BuildResult:
    image_id: str
    tags: list[str]
    labels: dict[str, str]
    engine: str
    seconds: float
    pushed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "image": self.image_id,
            "tags": self.tags,
            "labels": self.labels,
            "engine": self.engine,
            "seconds": round(self.seconds, 1),
            "pushed": self.pushed,
        }


def _lines(chunk: dict) -> Iterable[str]:
    text = chunk.get("stream") or chunk.get("status") or ""
    for line in str(text).splitlines():
        if line.strip():
            yield line.rstrip()


def run_build(client: Any, ctx: RenderedContext, progress: ProgressCallback | None = None) -> BuildResult:
    """Build ctx through the engine, tag it <modelId>:<modelVersion> and <modelId>:<digest12>."""
    engine = engine_version(client)
    ensure_base(client, ctx.base, progress)
    started = time.monotonic()
    step = "(before the first step)"
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    image_id = None
    stream = client.api.build(
        path=str(ctx.path), tag=ctx.tags[0], rm=True, forcerm=True, decode=True, pull=False, nocache=False
    )
    try:
        for chunk in stream:
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("errorDetail") or {}
                message = str(chunk.get("error") or detail.get("message") or "unknown error").strip()
                # podman repeats the whole step in its message: the step is named once, below
                message = re.sub(r'^building at STEP ".*": ', "", message, flags=re.S)
                raise BuildStepError(
                    f"build step {step} failed: {message}\nlast lines of its output:\n" + "\n".join(tail),
                    hint=_step_hint(step),
                )
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("ID"):
                image_id = str(aux["ID"])
            for line in _lines(chunk):
                m = _STEP.match(line)
                if m:
                    step = f"'{m.group(2)}'"
                    tail.clear()
                    if progress:
                        progress("step", line)
                    continue
                built = _BUILT.match(line)
                if built:
                    image_id = image_id or built.group(1)
                tail.append(line)
                if progress:
                    progress("log", line)
    except BuildStepError:
        raise
    except Exception as exc:  # the connection dropped or the engine answered an error status
        raise BuildStepError(
            f"build step {step}: the engine at {engine_host()} failed: {_one_line(exc)}\nlast lines:\n"
            + "\n".join(tail)
        ) from exc
    if image_id is None:
        raise BuildStepError("the engine finished the build without naming an image\nlast lines:\n" + "\n".join(tail))
    image = client.images.get(image_id)
    for ref in ctx.tags[1:]:
        repo, tag = ref.rsplit(":", 1)
        image.tag(repo, tag)
    image.reload()
    return BuildResult(
        image_id=str(image.id),
        tags=list(ctx.tags),
        labels=dict(image.labels or {}),
        engine=engine,
        seconds=time.monotonic() - started,
    )


def _step_hint(step: str) -> str:
    if "pip install" in step and "--no-index" in step:
        return (
            "A wheel pip needs is not in --wheelhouse (or its hash differs from the lock): add it, e.g. "
            "`pip download --no-deps --require-hashes -r CONTEXT/requirements.txt -d WHEELHOUSE`, then build again."
        )
    if "sys.version_info" in step:
        return "Use a base image with the lock's Python (--base), or relock for this Python."
    return "Read the lines above; `llmserve build PKG --dry-run --context DIR` writes the Dockerfile to inspect."


def push(
    client: Any, image_id: str, ctx: RenderedContext, registry: str, progress: ProgressCallback | None = None
) -> list[str]:
    """Tag the image under REGISTRY/<modelId> with both tags and push them; the pushed references."""
    registry = registry.rstrip("/")
    image = client.images.get(image_id)
    pushed = []
    for ref in ctx.tags:
        repo, tag = ref.rsplit(":", 1)
        target = f"{registry}/{repo}"
        image.tag(target, tag)
        if progress:
            progress("push", f"push {target}:{tag}")
        try:
            for chunk in client.api.push(target, tag=tag, stream=True, decode=True):
                if "error" in chunk or "errorDetail" in chunk:
                    detail = chunk.get("errorDetail") or {}
                    raise PushRefusedError(
                        f"push {target}:{tag}: the registry refused it: "
                        + " ".join(str(chunk.get("error") or detail.get("message")).split()),
                        hint=f"Check that {registry} is reachable and accepts pushes (credentials: `docker login {registry}`).",
                    )
                for line in _lines(chunk):
                    if progress:
                        progress("log", line)
        except PushRefusedError:
            raise
        except Exception as exc:
            raise PushRefusedError(
                f"push {target}:{tag}: {_one_line(exc)}",
                hint=f"Check that {registry} is reachable and accepts pushes (credentials: `docker login {registry}`).",
            ) from exc
        pushed.append(f"{target}:{tag}")
    return pushed


__all__ = [
    "BuildResult",
    "ProgressCallback",
    "connect",
    "engine_host",
    "engine_version",
    "ensure_base",
    "push",
    "run_build",
]
