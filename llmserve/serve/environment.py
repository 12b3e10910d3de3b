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
KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
# Set when VLLM_CPU_KVCACHE_SPACE is llmserve's own default (not the operator's, not --kv-cache-gib), so that a
# process that later learns the engine arguments (this one, or a Triton stub that inherits the environment) may
# drop it for the package's kv_cache_memory_bytes.
KV_SPACE_DEFAULTED = "LLMSERVE_KV_CACHE_SPACE_DEFAULTED"
CACHE_VARS = {
    "VLLM_CACHE_ROOT": "vllm",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "VLLM_RPC_BASE_PATH": "rpc",
    "HF_HOME": "hf",
}


def prepare_engine_environment(kv_cache_gib: int | None) -> dict[str, str]:
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
        os.environ[KV_SPACE] = applied[KV_SPACE] = str(kv_cache_gib)
        os.environ.pop(KV_SPACE_DEFAULTED, None)
    elif KV_SPACE in applied:
        os.environ[KV_SPACE_DEFAULTED] = "1"
    base = cache_root()
    for key, sub in CACHE_VARS.items():
        if key not in os.environ:
            os.environ[key] = applied[key] = str(base / sub)
        Path(os.environ[key]).mkdir(parents=True, exist_ok=True)
    return applied


def settle_kv_cache_size(engine_args: dict) -> str | None:
    """vLLM's CPU platform lets VLLM_CPU_KVCACHE_SPACE replace the engine argument kv_cache_memory_bytes, so the
    two cannot both be honoured. The engine argument wins over llmserve's own 1 GiB default (the variable is
    removed: returns a line for the log); against a size the operator chose (--kv-cache-gib or the variable) it
    is refused, naming both. Call before the engine starts."""
    if engine_args.get("kv_cache_memory_bytes") is None or KV_SPACE not in os.environ:
        return None
    if os.environ.get(KV_SPACE_DEFAULTED) == "1":
        del os.environ[KV_SPACE]
        return f"KV cache: kv_cache_memory_bytes={engine_args['kv_cache_memory_bytes']} (not llmserve's 1 GiB default)"
    raise StartupError(
        f"the KV cache size is given twice: the engine argument kv_cache_memory_bytes="
        f"{engine_args['kv_cache_memory_bytes']} and {KV_SPACE}={os.environ[KV_SPACE]} GiB (--kv-cache-gib or the "
        "environment); vLLM's CPU build would use the second and drop the first",
        hint="Give one of them: drop --kv-cache-gib (or unset VLLM_CPU_KVCACHE_SPACE), or the engine's "
        "kv_cache_memory_bytes (the package's engine section or --engine-arg).",
    )


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
