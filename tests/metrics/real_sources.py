"""Real metrics sources for tests/metrics: a tritonserver with a model that bridges `vllm:*` series the way Triton's
vLLM backend does, worker processes writing a Prometheus multiprocess folder (mp_writer.py), a hung and a dead
address, and the page parser. Imported by name (this folder is on sys.path while its tests run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "triton"))
from triton_models import ECHO_MODEL, write_model  # tests/triton is not a package: on the path above

from llmserve.serve.triton import PYTHON_ENV_ENV, TritonServer, locate_tritonserver

REPO = Path(__file__).resolve().parents[2]
TRITON_ENV = Path(os.environ.get(PYTHON_ENV_ENV) or REPO / ".venv-triton")
WRITER = Path(__file__).with_name("mp_writer.py")

# What Triton's vLLM backend does: pb_utils.MetricFamily with vLLM's names, labelled by model and version.
# vllm:prompt_tokens_total is on both paths (the multiprocess writers have it too); vllm:num_requests_waiting is
# Triton's alone.
BRIDGE_MODEL = ECHO_MODEL.replace(
    "class TritonPythonModel:\n",
    """class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": "bridge", "version": "1"}
        # the families must outlive their metrics: Triton refuses updates to a metric whose family is gone
        self.prompt_family = pb_utils.MetricFamily(
            name="vllm:prompt_tokens_total", description="bridge prompt tokens", kind=pb_utils.MetricFamily.COUNTER
        )
        self.prompt = self.prompt_family.Metric(labels=labels)
        self.prompt.increment(3)
        self.waiting_family = pb_utils.MetricFamily(
            name="vllm:num_requests_waiting", description="bridge waiting", kind=pb_utils.MetricFamily.GAUGE
        )
        self.waiting = self.waiting_family.Metric(labels=labels)
        self.waiting.set(4)
""",
)


def start_triton(root: Path) -> TritonServer:
    repo = root / "repository"
    write_model(repo, "echo", ECHO_MODEL)
    write_model(repo, "bridge", BRIDGE_MODEL)
    return TritonServer(repo, ["echo", "bridge"], install=locate_tritonserver(TRITON_ENV), stop_timeout=20).start()


class Writers:
    """Worker processes writing one multiprocess folder; held ones stay alive until released."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.held: list[subprocess.Popen[str]] = []

    def run(self, engine: str, hold: bool = False) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(self.folder), engine, *(["--hold"] if hold else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        if hold:
            self.held.append(proc)
        else:
            proc.wait(30)
        return proc

    def release(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)

    def close(self) -> None:
        for proc in self.held:
            if proc.poll() is None:
                self.release(proc)


def families(body: bytes) -> dict:
    """Parsed Prometheus text page, by family name (the parser fails on an invalid page)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(body.decode())}


# A Python-backend model that records vLLM-named series with prometheus_client, as vLLM does when it runs inside
# Triton's Python stub: with PROMETHEUS_MULTIPROC_DIR in tritonserver's environment they land in the folder.
IN_STUB_MODEL = ECHO_MODEL.replace(
    "class TritonPythonModel:\n",
    """class TritonPythonModel:
    def initialize(self, args):
        from prometheus_client import Counter, Gauge

        labels = ["model_name"]
        Counter("vllm:prompt_tokens", "Prefill tokens", labels).labels("in-stub").inc(11)
        Gauge("vllm:num_requests_running", "Running", labels, multiprocess_mode="livesum").labels("in-stub").set(1)
""",
)
