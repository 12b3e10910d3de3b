"""Engine tests that run their engine in a child process: a spawn-safe script writes its results as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_engine_script(script: Path, model_dir: Path, out: Path, timeout: float = 500) -> dict:
    """`python SCRIPT MODEL_DIR OUT` on an in-process CPU engine (the engine's default KV cache size); its results."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_USE_V2_MODEL_RUNNER="0")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    proc = subprocess.run(
        [sys.executable, str(script), str(model_dir), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())
