"""Fixtures for the `kubernetes` deploy target: a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler from scripts/k8s-test-cluster), a node agent standing in for
the kubelet, a namespace per test, packages of the tiny model, and the CLI as a subprocess.

The control plane is started here unless $LLMSERVE_TEST_KUBECONFIG names one already running (CI may
start it first with `scripts/k8s-test-cluster start DIR`). If it cannot start, the session fails: these
tests are never skipped.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cli import popen_cli, run_cli_json
from support.models import write_vllm_source

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s-test-cluster"
MODEL = "tiny-chat"


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory) -> str:
    given = os.environ.get("LLMSERVE_TEST_KUBECONFIG")
    if given:
        yield given
        return
    d = tmp_path_factory.mktemp("k8s-control-plane")
    # First run on a fresh machine builds the binaries (cached afterwards): allow an hour.
    p = subprocess.run([str(SCRIPT), "start", str(d)], capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        subprocess.run([str(SCRIPT), "stop", str(d)], capture_output=True, timeout=60)
        pytest.fail(
            f"the test Kubernetes control plane did not start (scripts/k8s-test-cluster start):\n{p.stderr[-4000:]}",
            pytrace=False,
        )
    try:
        yield str(d / "kubeconfig")
    finally:
        subprocess.run([str(SCRIPT), "stop", str(d)], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def kube_api(kubeconfig):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(cfg)


@pytest.fixture(scope="session")
def node_agent(kube_api):
    from node_agent import NodeAgent

    agent = NodeAgent(kube_api).start()
    yield agent
    agent.stop()


@pytest.fixture
def namespace(kube_api, node_agent):
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    node_agent.unready.clear()
    node_agent.max_ready.clear()
    yield ns
    node_agent.unready.clear()
    node_agent.max_ready.clear()
    core.delete_namespace(ns)


@pytest.fixture(scope="session")
def k8s_packages(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """v1, v2, v3: same interface; v4: a changed chat template (another interface)."""
    from llmserve.packaging import build_package

    root = tmp_path_factory.mktemp("k8s-src")
    dist = tmp_path_factory.mktemp("k8s-dist")
    out = {}
    for key, version, template in (("v1", 1, None), ("v2", 2, None), ("v3", 3, None), ("v4", 4, "x")):
        src = write_vllm_source(root / key, tiny_model_dir, model_id=MODEL, version=version)
        if template:
            t = src / "model" / "chat_template.jinja"
            t.write_text("{# interface 2 #}" + t.read_text())
        out[key] = build_package(src, dist).path
    return out


@dataclass
class KubeCli:
    """The shared CLI runner (support.cli) against the test cluster: `--target kubernetes` in a namespace."""

    kubeconfig: str
    namespace: str

    def args(self, *args: str) -> tuple[str, ...]:
        return (*args, "--target", "kubernetes", "--namespace", self.namespace)

    def env(self) -> dict:
        return {"KUBECONFIG": self.kubeconfig, "PYTHONWARNINGS": "ignore"}

    def run(self, *args: str, timeout: float = 300) -> tuple[int, dict | None, str]:
        return run_cli_json(*self.args(*args), env=self.env(), timeout=timeout)

    def popen(self, *args: str, log: Path) -> subprocess.Popen:
        return popen_cli(*self.args(*args), log=log, env=self.env())

    def status(self, name: str = MODEL) -> dict:
        # the rollout state only: the servers' metrics (a scrape interval per call) are tests/metrics' subject
        rc, data, text = self.run("status", name, "--no-metrics")
        assert rc == 0, text
        return data


@pytest.fixture
def kcli(kubeconfig, namespace) -> KubeCli:
    return KubeCli(kubeconfig, namespace)
