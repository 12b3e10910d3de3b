"""Fixtures for `llmserve build`: a real Docker Engine API (podman system service), a real registry
(Debian's docker-registry) on 127.0.0.1, a base image built here, and the wheels pip installs from.

scripts/build-test-env starts both servers for the session and stops them after; their storage lives
in the session's temporary folder. No public registry is reachable, so the base image is a Debian
root made by debootstrap (bookworm, python3 3.11 as the lock needs), cached under
~/.cache/llmserve-build and imported through the API. If any of it cannot start, the tests fail:
they are never skipped.

What the images built here carry (honestly): the "slim" lock below is the repository's own lock cut
down to llmserve's base dependencies (typer, rich, pydantic, jinja2, pyyaml and what they need), with
the locked versions and hashes. Its images hold llmserve and the package, run `llmserve` commands,
but carry no vLLM: they cannot serve yet (the full locked stack needs a ~1 GB wheelhouse and a
several-GB image; that is the next step of issue #15).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-test-env"
BASE_REF = "localhost/llmserve-test-base:bookworm-py3"


def build_cache() -> Path:
    return Path(os.environ.get("LLMSERVE_BUILD_CACHE") or Path.home() / ".cache" / "llmserve-build")


@pytest.fixture(scope="session")
def build_env(tmp_path_factory) -> dict[str, str]:
    """DOCKER_HOST and LLMSERVE_TEST_REGISTRY of the servers scripts/build-test-env started."""
    d = tmp_path_factory.mktemp("build-env")
    p = subprocess.run([str(SCRIPT), "start", str(d)], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        subprocess.run([str(SCRIPT), "stop", str(d)], capture_output=True, timeout=60)
        pytest.fail(
            f"podman system service / docker-registry did not start (scripts/build-test-env start):\n{p.stderr[-4000:]}",
            pytrace=False,
        )
    env = dict(line.split("=", 1) for line in (d / "env").read_text().splitlines() if "=" in line)
    try:
        yield env
    finally:
        subprocess.run([str(SCRIPT), "stop", str(d)], capture_output=True, timeout=120)
        # podman's vfs storage holds root-owned layer copies: remove them now, not at pytest's cleanup
        subprocess.run(["rm", "-rf", str(d / "storage")], capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def docker_client(build_env):
    import docker

    client = docker.DockerClient(base_url=build_env["DOCKER_HOST"], timeout=1800)
    assert client.ping()
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """A Debian bookworm root with python3 (debootstrap, cached), imported into the engine."""
    p = subprocess.run([str(SCRIPT), "base"], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        pytest.fail(f"the base image root could not be made (scripts/build-test-env base):\n{p.stderr[-4000:]}")
    tarball = p.stdout.strip().splitlines()[-1]
    out = docker_client.api.import_image(src=tarball)
    image_id = next(part for part in str(out).split('"') if part.startswith("sha256:"))
    docker_client.images.get(image_id).tag(*BASE_REF.split(":"))
    return BASE_REF


def _closure(names: list[str]) -> set[str]:
    """Distribution names (normalized) that installing `names` pulls in, by the installed metadata."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    from llmserve.formats.lock import normalize

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = normalize(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in md.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


@pytest.fixture(scope="session")
def slim_lock(tmp_path_factory) -> Path:
    """The repository's lock cut down to llmserve's base dependencies (versions and hashes as locked)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    from llmserve.formats.lock import Packages, dump_lock, load_lock, normalize, packages_digest

    lock = load_lock(REPO / "llmserve.lock")
    assert lock.packages is not None and lock.packages.hashes
    base = [Requirement(r).name for r in md.requires("llmserve") or [] if "extra ==" not in r]
    keep = _closure(base)
    reqs = [r for r in lock.packages.requirements if normalize(r.split("==")[0]) in keep]
    hashes = {n: h for n, h in lock.packages.hashes.items() if normalize(n) in keep}
    # every base dependency (and each of theirs) is pinned in the real lock
    assert {normalize(r.split("==")[0]) for r in reqs} == keep, keep
    slim = lock.model_copy(
        update={"packages": Packages(digest=packages_digest(reqs, hashes), requirements=reqs, hashes=hashes)}
    )
    path = tmp_path_factory.mktemp("slim-lock") / "llmserve.lock"
    path.write_text(dump_lock(slim), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def slim_wheelhouse(slim_lock) -> Path:
    """The slim lock's wheels (downloaded once with their locked hashes; cached by the set's digest)."""
    from llmserve.compat import export_requirements
    from llmserve.formats.lock import load_lock

    text = export_requirements(load_lock(slim_lock))
    d = build_cache() / "wheelhouse" / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not (d / ".complete").is_file():
        d.mkdir(parents=True, exist_ok=True)
        (d / "requirements.txt").write_text(text)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary", ":all:"]
        p = subprocess.run(
            [*pip, "-r", str(d / "requirements.txt"), "-d", str(d), "-q"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert p.returncode == 0, f"pip download of the slim lock's wheels failed:\n{p.stderr[-3000:]}"
        (d / ".complete").write_text("ok\n")
    return d


@pytest.fixture(scope="session")
def llmserve_wheel(tmp_path_factory) -> Path:
    """llmserve's wheel from this checkout, built once for the session (the default path builds it too)."""
    from llmserve.build.context import build_llmserve_wheel

    return build_llmserve_wheel(tmp_path_factory.mktemp("llmserve-wheel"))
