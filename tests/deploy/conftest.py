"""Fixtures for rollouts on the local target: packages of the tiny model, the CLI in a state folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from deploy_helpers import MODEL, Cli, write_vllm_source


@pytest.fixture(scope="session")
def deploy_packages(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """v1, v2: same interface; v3: made to fail its health check (an engine argument vLLM refuses at start);
    v4, v5, v6: a changed chat template (another interface)."""
    from llmserve.packaging import build_package

    root = tmp_path_factory.mktemp("deploy-src")
    dist = tmp_path_factory.mktemp("deploy-dist")
    out = {}
    for key, version, extra, template in (
        ("v1", 1, "", None),
        ("v2", 2, "", None),
        ("bad", 3, "", None),
        ("v4", 4, "", "x"),
        ("v5", 5, "", "x"),
        ("v6", 6, "", "x"),
    ):
        src = write_vllm_source(root / key, tiny_model_dir, model_id=MODEL, version=version, extra=extra)
        if key == "bad":
            y = (
                (src / "llmserve.yaml")
                .read_text()
                .replace("enforce_eager: true", "enforce_eager: true\n  max_num_seqs: -1")
            )
            (src / "llmserve.yaml").write_text(y)
        if template:
            t = src / "model" / "chat_template.jinja"
            t.write_text("{# interface 2 #}" + t.read_text())
        out[key] = build_package(src, dist).path
    return out


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    c = Cli(tmp_path_factory.mktemp("deploy-state"))
    yield c
    # Tear down whatever the tests left, then make sure no process of ours survives.
    from llmserve.deploy import StateStore
    from llmserve.deploy.local_target import stop_recorded_processes

    store = StateStore(c.state_dir)
    for dep in store.deployments():
        subprocess.run(c.argv("deploy", "down", dep.name), capture_output=True, timeout=180)
    stop_recorded_processes(store)


@pytest.fixture()
def store(tmp_path):
    """A state folder of its own, for the tests that drive the state and the gateway without the CLI."""
    from llmserve.deploy.state import StateStore

    s = StateStore(tmp_path / "state")
    yield s
    s.close()
