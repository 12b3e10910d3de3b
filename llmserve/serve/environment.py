"""Process environment for an embedded vLLM engine, set before vLLM or prometheus_client is imported.

Defaults measured on the CPU build of vLLM: engine-core threads pinned to one OpenMP
thread, a bounded CPU KV cache, caches redirected under the llmserve cache, hub access off.
A variable the operator already set is left alone, except the KV cache size when `--kv-cache-gib`
says otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmserve.packaging.opened import cache_root
from llmserve.serve.errors import StartupError

CPU_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core runs the model itself, no extra worker process
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# V1 custom logits processors (the `vllm.logits_processors` plugin group) need the V1 model runner.
RUNNER_DEFAULTS = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
CACHE_VARS = {
    "VLLM_CACHE_ROOT": "vllm",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "VLLM_RPC_BASE_PATH": "rpc",
    "HF_HOME": "hf",
}


def prepare_engine_environment(kv_cache_gib: float | None) -> dict[str, str]:
    """Set the environment the engine reads at import time; return what was set (for the log)."""
    if "vllm" in sys.modules:
        raise StartupError(
            "vLLM was imported before the serving environment was prepared",
            hint="This is a bug in the caller: call prepare_engine_environment first.",
        )
    applied: dict[str, str] = {}
    for key, value in {**CPU_DEFAULTS, **RUNNER_DEFAULTS}.items():
        if key not in os.environ:
            os.environ[key] = applied[key] = value
    if kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = applied["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
    base = cache_root()
    for key, sub in CACHE_VARS.items():
        if key not in os.environ:
            os.environ[key] = applied[key] = str(base / sub)
        Path(os.environ[key]).mkdir(parents=True, exist_ok=True)
    return applied


def prepare_metrics_dir(requested: Path | None, port: int) -> Path:
    """Wipe and set PROMETHEUS_MULTIPROC_DIR; must run before prometheus_client is imported.

    Stale `.db` files from an earlier run would otherwise be summed into this run's counters.
    Only prometheus_client's own files are removed, never anything else in the folder.
    """
    if "prometheus_client" in sys.modules and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        raise StartupError(
            "prometheus_client was imported before its multiprocess folder was set",
            hint="This is a bug in the caller: call prepare_metrics_dir first.",
        )
    if requested is not None:
        folder = Path(requested)
    elif os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        folder = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    else:
        folder = cache_root() / "run" / f"metrics-{port}"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    return folder
