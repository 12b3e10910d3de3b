"""A Triton-hosted package on the local target: `llmserve deploy` of a Python-backend LLM package (`backend:
python`, `python.frontend: llm-text`: `llmserve serve` hosts it in a real Triton 2.51, the one `make triton-env`
builds) comes up healthy behind the gateway, serves the OpenAI API and KServe v2 HTTP through it with the
deployment's key, and `deploy down` leaves no process of it (server, tritonserver, Python-backend stub) running.

One deployment for the module (Triton with one Python model starts in ~20 s here). A missing Triton environment
fails the module: it is never skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from deploy_helpers import Cli
from support.cli import run_cli_json
from support.models import llm_text_manifest

from llmserve.serve.triton import PYTHON_ENV_ENV, locate_tritonserver

REPO = Path(__file__).resolve().parents[2]
TRITON_ENV = Path(os.environ.get(PYTHON_ENV_ENV) or REPO / ".venv-triton")
MODEL = "tiny-py-llm"
KEY = "triton-deploy-test-key-0123456789"
MANIFEST = llm_text_manifest(MODEL)

pytestmark = pytest.mark.timeout(600)


def tagged_processes(state_dir: Path) -> list[str]:
    """Command lines of live processes that carry this state folder's deploy tag (llmserve.deploy.doctor): the
    servers, gateways and watchdogs, and every child they spawned (tritonserver, its Python-backend stubs)."""
    return [cmdline for _, cmdline in tagged_pids(state_dir)]


def tagged_pids(state_dir: Path) -> list[tuple[int, str]]:
    from llmserve.deploy import doctor

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        tags = [e.split(b"=", 1)[1].decode(errors="replace") for e in environ if e.startswith(doctor.TAG_ENV.encode())]
        if state != "Z" and any(t.startswith(f"{state_dir}::") for t in tags):
            found.append((int(entry.name), cmdline))
    return found


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, tiny_model_dir):
    try:
        locate_tritonserver(TRITON_ENV)
    except Exception as exc:  # the Triton environment is part of the test stack (`make triton-env`)
        pytest.fail(f"no Triton to host the package ({TRITON_ENV}): {exc}", pytrace=False)
    from llmserve.packaging import build_package

    tmp = tmp_path_factory.mktemp("triton-deploy")
    shutil.copytree(tiny_model_dir, tmp / "src" / "model")
    (tmp / "src" / "llmserve.yaml").write_text(MANIFEST)
    package = build_package(tmp / "src", tmp / "dist").path
    cli = Cli(tmp / "state")
    env = {PYTHON_ENV_ENV: str(TRITON_ENV), "LLMSERVE_API_KEY": KEY}
    rc, out, text = run_cli_json(
        *cli.args("deploy", str(package), "--pause", "0", "--drain-timeout", "2", "--health-timeout", "300"),
        env=env,
        timeout=400,
    )
    try:
        assert rc == 0, text
        yield cli, out
    finally:
        run_cli_json(*cli.args("deploy", "down", MODEL, "--drain-timeout", "2"), timeout=180)
        from llmserve.deploy import StateStore
        from llmserve.deploy.local_target import stop_recorded_processes

        stop_recorded_processes(StateStore(cli.state_dir))


def _gateway(cli: Cli) -> str:
    rc, st, text = cli.run("status", MODEL, "--no-metrics")
    assert rc == 0, text
    assert [(i["version"], i["status"], i["weight"]) for i in st["instances"]] == [(1, "serving", 100)], st
    return st["gateway"]["url"]


def test_the_triton_hosted_package_serves_openai_and_kserve_through_the_gateway(deployed):
    cli, _ = deployed
    gateway = _gateway(cli)
    # the server behind the gateway is Triton's host, and its health reflects Triton's readiness
    (log,) = (cli.state_dir / "logs").glob(f"{MODEL}-i*-v1.log")
    assert f"Triton hosts {MODEL} (executionMode embedded)" in log.read_text()
    assert httpx.get(f"{gateway}/health", timeout=10).status_code == 200

    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key=KEY, max_retries=0)
    assert MODEL in [m.id for m in client.models.list().data]
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{gateway}/v1", api_key="wrong", max_retries=0).models.list()

    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{gateway}/v2/models/{MODEL}/ready", headers=headers, timeout=10).status_code == 200
    meta = httpx.get(f"{gateway}/v2/models/{MODEL}", headers=headers, timeout=10).json()
    assert meta["platform"] == "python" and meta["versions"] == ["1"]
    body = {
        "inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1], "data": [json.dumps({"max_tokens": 3})]},
        ]
    }
    r = httpx.post(f"{gateway}/v2/models/{MODEL}/infer", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["name"] == "text_output" and out["data"][0]
    assert httpx.post(f"{gateway}/v2/models/{MODEL}/infer", json=body, timeout=60).status_code == 401


def test_a_killed_server_takes_its_triton_with_it_and_comes_back(deployed):
    cli, _ = deployed
    rc, st, text = cli.run("status", MODEL, "--no-metrics")
    assert rc == 0, text
    (inst,) = st["instances"]
    tritons = [pid for pid, c in tagged_pids(cli.state_dir) if "tritonserver" in c]
    assert tritons, "the server's Triton runs"
    os.kill(inst["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the gateway's supervisor: out of rotation, session stopped, restarted
        rc, st, _ = cli.run("status", MODEL, "--no-metrics")
        (now,) = st["instances"]
        if now["pid"] != inst["pid"] and now["status"] == "serving" and rc == 0:
            break
        time.sleep(2)
    else:
        pytest.fail(f"not restarted: {st}")
    alive = {pid for pid, _ in tagged_pids(cli.state_dir)}
    assert not alive & set(tritons), "the killed server's Triton was stopped with it (same session)"
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{_gateway(cli)}/v2/models/{MODEL}/ready", headers=headers, timeout=10).status_code == 200


def test_deploy_down_leaves_nothing_of_triton_running(deployed):
    cli, _ = deployed
    assert any("tritonserver" in c for c in tagged_processes(cli.state_dir))  # what down must stop
    t0 = time.monotonic()
    rc, _, text = cli.run("deploy", "down", MODEL, "--drain-timeout", "2", timeout=180)
    assert rc == 0, text
    print(f"deploy down took {time.monotonic() - t0:.1f} s")
    (log,) = (cli.state_dir / "logs").glob(f"{MODEL}-i*-v1.log")
    assert "shutdown: done" in log.read_text(), log.read_text()[-2000:]  # stopped Triton itself, not killed
    assert tagged_processes(cli.state_dir) == []


def test_a_standalone_package_is_refused_before_anything_starts(tmp_path, tiny_model_dir):
    # the local target's servers need llmserve's frontends (/health, the key): Triton's own endpoints have neither
    from llmserve.packaging import build_package

    shutil.copytree(tiny_model_dir, tmp_path / "src" / "model")
    (tmp_path / "src" / "llmserve.yaml").write_text(MANIFEST + "executionMode: standalone\n")
    package = build_package(tmp_path / "src", tmp_path / "dist").path
    cli = Cli(tmp_path / "state")
    rc, _, text = cli.run("deploy", str(package), "--pause", "0", timeout=120)
    assert rc == 3 and "executionMode standalone" in text and "--target kubernetes" in text, text
    assert tagged_processes(cli.state_dir) == []
