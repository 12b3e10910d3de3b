"""Fixtures for the `kubernetes` deploy target: a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler from scripts/k8s-test-cluster), a node agent standing in for
the kubelet, a namespace per test, packages of the tiny model, and the CLI as a subprocess.

The control plane is started here unless $LLMSERVE_TEST_KUBECONFIG names one already running (CI may
start it first with `scripts/k8s-test-cluster start DIR`). If it cannot start, the session fails: these
tests are never skipped.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from store.store_helpers import start_moto, stop
from support.cli import popen_cli, run_cli, run_cli_json
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
def restricted_api(tmp_path_factory):
    """A second kube-apiserver (the same binary, its own etcd) that enforces the restricted Pod Security
    Standard through its built-in admission. Kubernetes 1.20 (what the test cluster builds) predates the
    PodSecurity admission plugin (1.22+), so the standard is written as a PodSecurityPolicy, the 1.20
    apiserver's own enforcing admission: the policy below allows exactly what `restricted` allows.
    PSP also *defaults* fields a pod leaves unset; tests check that an admitted pod came back unchanged
    (it met the policy as written) and that pods breaking a rule are refused. Only an apiserver is
    started: server-side dry-run (dryRun=All) runs the whole admission chain without storing the pod."""
    from kubernetes import client

    built = subprocess.run([str(SCRIPT), "build"], capture_output=True, text=True, timeout=3600)
    if built.returncode != 0:
        pytest.fail(f"scripts/k8s-test-cluster build failed:\n{built.stderr[-4000:]}", pytrace=False)
    bindir = Path(built.stdout.split()[-1])
    d = tmp_path_factory.mktemp("psp-apiserver")
    token = uuid.uuid4().hex
    (d / "tokens.csv").write_text(f"{token},llmserve-admin,llmserve-admin,system:masters\n")
    for args in (
        ["genrsa", "-out", str(d / "sa.key"), "2048"],
        ["rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
    ):
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    etcd_port, peer_port, api_port = _free_ports(3)
    procs = [
        subprocess.Popen(
            ["etcd", "--name", "psp", "--data-dir", str(d / "etcd"), "--unsafe-no-fsync",
             "--listen-client-urls", f"http://127.0.0.1:{etcd_port}", "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-cluster", f"psp=http://127.0.0.1:{peer_port}"],
            stdout=(d / "etcd.log").open("wb"), stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [str(bindir / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
             "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(api_port),
             "--insecure-port", "0", "--cert-dir", str(d / "certs"), "--token-auth-file", str(d / "tokens.csv"),
             "--anonymous-auth=false", "--authorization-mode", "RBAC",
             "--service-account-key-file", str(d / "sa.pub"), "--service-account-signing-key-file", str(d / "sa.key"),
             "--service-account-issuer", "https://kubernetes.default.svc", "--service-cluster-ip-range", "10.96.0.0/16",
             "--disable-admission-plugins", "ServiceAccount", "--enable-admission-plugins", "PodSecurityPolicy",
             "--enable-priority-and-fairness=false"],
            stdout=(d / "kube-apiserver.log").open("wb"), stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    try:
        cfg = client.Configuration()
        cfg.host = f"https://127.0.0.1:{api_port}"
        cfg.api_key = {"authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 120
        while True:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                pytest.fail(f"the restricted kube-apiserver did not start; logs in {d}", pytrace=False)
            cert = d / "certs" / "apiserver.crt"
            try:
                r = httpx.get(
                    f"{cfg.host}/readyz",
                    headers={"Authorization": f"Bearer {token}"},
                    verify=ssl.create_default_context(cafile=str(cert)),
                )
                if r.status_code == 200:
                    cfg.ssl_ca_cert = str(cert)
                    break
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.5)
        api = client.ApiClient(cfg)
        from kubernetes.dynamic import DynamicClient

        DynamicClient(api).resources.get(api_version="policy/v1beta1", kind="PodSecurityPolicy").create(
            body=RESTRICTED_PSP
        )
        yield api
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# The restricted Pod Security Standard (kubernetes.io/docs/concepts/security/pod-security-standards)
# as a PodSecurityPolicy, plus a read-only root file system, which llmserve's pods keep too.
RESTRICTED_PSP = {
    "apiVersion": "policy/v1beta1",
    "kind": "PodSecurityPolicy",
    "metadata": {
        "name": "restricted",
        "annotations": {"seccomp.security.alpha.kubernetes.io/allowedProfileNames": "runtime/default,localhost/*"},
    },
    "spec": {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "requiredDropCapabilities": ["ALL"],
        "allowedCapabilities": ["NET_BIND_SERVICE"],
        "volumes": [
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "persistentVolumeClaim",
            "projected",
            "secret",
        ],
        "hostNetwork": False,
        "hostIPC": False,
        "hostPID": False,
        "readOnlyRootFilesystem": True,
        "runAsUser": {"rule": "MustRunAsNonRoot"},
        "seLinux": {"rule": "RunAsAny"},
        "supplementalGroups": {"rule": "RunAsAny"},
        "fsGroup": {"rule": "RunAsAny"},
    },
}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


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


STORE_SECRET = "testing-secret-key-for-k8s"


@pytest.fixture(scope="module")
def store(tmp_path_factory, k8s_packages) -> dict:
    """A moto server, a bucket with tiny-chat v1 pushed, and the settings a client needs (per test module)."""
    proc, url = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    home = tmp_path_factory.mktemp("aws")
    env = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing-key-id",
        "AWS_SECRET_ACCESS_KEY": STORE_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
    }
    bucket = f"models-{uuid.uuid4().hex[:12]}"
    import boto3

    boto3.client(
        "s3", endpoint_url=url, aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1"
    ).create_bucket(Bucket=bucket)
    p = run_cli("push", k8s_packages["v1"], f"s3://{bucket}/prod", "-o", "json", env=env)
    assert p.returncode == 0, p.stderr
    yield {"env": env, "ref": f"s3://{bucket}/prod/{MODEL}:1", "digest": json.loads(p.stdout)["digest"]}
    stop(proc)


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


@pytest.fixture(scope="session")
def custom_metrics(kube_api):
    """A custom metrics API (custom.metrics.k8s.io/v1beta1) registered with the API server's aggregation
    layer, serving the queue metric the HPA reads, with values the test sets (custom_metrics_server.py).
    Unregistered before the control plane stops: an APIService left pointing at a stopped server makes
    discovery fail, and with it the namespace controller's deletions."""
    from custom_metrics_server import CustomMetricsServer

    from llmserve.deploy.kubernetes.autoscale import METRIC

    server = CustomMetricsServer(kube_api, METRIC).start()
    try:
        server.register()
        try:
            wait_available = time.monotonic() + 120
            while not server.available():
                if time.monotonic() > wait_available:
                    pytest.fail("the API server never marked APIService v1beta1.custom.metrics.k8s.io Available")
                time.sleep(0.5)
            yield server
        finally:
            server.unregister()
    finally:
        server.stop()
