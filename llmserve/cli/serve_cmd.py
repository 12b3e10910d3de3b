"""`llmserve serve PKG_OR_DIR --openai`: serve a package on an embedded vLLM engine."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from llmserve.serve.options import API_KEY_ENV, DEFAULT_MAX_N


def serve(
    packages: list[str] = typer.Argument(
        ...,
        help="A .llmpkg, an unpacked package folder, a source folder with llmserve.yaml, or a model store "
        "reference s3://BUCKET/PREFIX/MODEL:VERSION (pulled once into --cache, then served from there); with "
        "--engine triton, several (one Triton hosts them all).",
        show_default=False,
    ),
    cache: Path = typer.Option(
        None,
        "--cache",
        help="The model store cache s3:// references are pulled into (default: $LLMSERVE_STORE_CACHE, else "
        "$LLMSERVE_CACHE/store). Endpoint and credentials: the usual AWS settings (AWS_ENDPOINT_URL, profiles).",
        show_default=False,
    ),
    engine: str = typer.Option(
        None,
        "--engine",
        help="vllm: the embedded vLLM engine (default for one vLLM-backend package); triton: a Triton Inference "
        "Server hosts the packages (default for Python-backend packages). Triton is found in "
        "$LLMSERVE_TRITONSERVER, /opt/tritonserver, PATH, or the nvidia-pytriton wheel in $LLMSERVE_TRITON_ENV.",
        show_default=False,
    ),
    openai: bool = typer.Option(
        False, "--openai", help="Serve the OpenAI-compatible HTTP API (/v1/chat/completions, ...)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind. Default: loopback only."),
    port: int = typer.Option(
        8000,
        "--port",
        help="HTTP port: OpenAI API and KServe v2 HTTP with --openai, KServe v2 HTTP alone without (0: any free port).",
    ),
    grpc_port: int = typer.Option(8001, "--grpc-port", help="KServe v2 gRPC port (0: any free port)."),
    triton_url: str = typer.Option(
        None,
        "--triton-url",
        help="Attach to a Triton that already runs (its gRPC HOST:PORT) instead of starting one: llmserve's "
        "frontends (--openai, KServe v2) serve the packages' models from it.",
        show_default=False,
    ),
    triton_http_url: str = typer.Option(
        None,
        "--triton-http-url",
        help="With --triton-url: that Triton's HTTP HOST:PORT, for the KServe v2 HTTP routes.",
    ),
    metrics_port: int = typer.Option(
        8002,
        "--metrics-port",
        help=(
            "Triton's metrics port with --engine triton in executionMode standalone (0: any free port); "
            "embedded, the merged /metrics is on --port and Triton's port is a free loopback one."
        ),
    ),
    metrics_timeout: float = typer.Option(
        2.0,
        "--metrics-timeout",
        min=0.05,
        help="Seconds a /metrics scrape waits for Triton's endpoint; past it the other sources are served "
        'and llmserve_metrics_source_up{source="triton"} is 0.',
    ),
    api_key: str = typer.Option(
        None,
        "--api-key",
        envvar=API_KEY_ENV,
        show_envvar=True,
        help="Require 'Authorization: Bearer KEY' on every route but /health. Prefer the environment "
        "variable or --api-key-file: a key given here shows in the process list.",
    ),
    api_key_file: Path = typer.Option(
        None,
        "--api-key-file",
        help="Read the API key from this file (one line; trailing newline stripped). Refused if other "
        "users can read it (chmod 600).",
    ),
    served_model_name: str = typer.Option(
        None, "--served-model-name", help="Model id clients send. Default: the manifest's modelId."
    ),
    kv_cache_gib: int = typer.Option(
        None,
        "--kv-cache-gib",
        min=1,
        help="CPU KV cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE, which vLLM reads as an integer). Default 1; "
        "for a smaller cache set the engine argument kv_cache_memory_bytes in the package.",
    ),
    max_num_seqs: int = typer.Option(None, "--max-num-seqs", help="Override: most sequences batched per engine step."),
    max_num_batched_tokens: int = typer.Option(
        None, "--max-num-batched-tokens", help="Override: most tokens per engine step."
    ),
    max_body_bytes: int = typer.Option(
        8 * 1024 * 1024, "--max-body-bytes", help="Largest request body accepted (413 above)."
    ),
    max_prompt_chars: int = typer.Option(
        200_000, "--max-prompt-chars", help="Longest prompt accepted, in characters (400 above)."
    ),
    drain_timeout: float = typer.Option(
        30.0, "--drain-timeout", help="Seconds in-flight requests get to finish on SIGTERM/SIGINT."
    ),
    engine_stall_timeout: float = typer.Option(
        None,
        "--engine-stall-timeout",
        help="Seconds the embedded engine may leave a ping unanswered before the server counts it hung: /health "
        "turns 503 and the process exits 7 so its supervisor restarts it. Default: $LLMSERVE_ENGINE_STALL_TIMEOUT_S, "
        "else 60. Refused with --engine triton (no hang watch there).",
    ),
    metrics_dir: Path = typer.Option(
        None, "--metrics-dir", help="PROMETHEUS_MULTIPROC_DIR to wipe and use. Default: under the llmserve cache."
    ),
    constraints: bool = typer.Option(
        True,
        "--constraints/--no-constraints",
        help="Load llmserve's constraint processor (per-request regex, choice or JSON Schema in "
        "OpenAI `vllm_xargs` or KServe `sampling_parameters`, enforced in the decode loop). "
        "On by default for generating models; without it a request carrying a constraint "
        "gets HTTP 400 / INVALID_ARGUMENT.",
    ),
    structured_outputs_backend: str = typer.Option(
        "llmserve",
        "--structured-outputs-backend",
        help="Who serves response_format and structured_outputs: llmserve (the constraint processor: answers "
        "end within max_tokens; a form it does not take, such as grammar, is HTTP 400), or one of vLLM's own "
        "backends for comparison: guidance, xgrammar, outlines, lm-format-enforcer, auto. Constraint keys "
        "(vllm_xargs, KServe constraint_*) are served by llmserve's processor either way.",
    ),
    trust_remote_code: bool = typer.Option(
        False,
        "--trust-remote-code",
        help="Serve a package whose engine arguments make vLLM load code (trust_remote_code, worker_cls, "
        "logits_processors, ...); such a package is refused without it (exit 4).",
    ),
    max_n: int = typer.Option(
        DEFAULT_MAX_N, "--max-n", min=1, help="Most choices (`n`) one request may ask for (HTTP 400 above)."
    ),
) -> None:
    """Serve a package: one process, one vLLM engine, OpenAI-compatible HTTP and KServe v2 HTTP/gRPC.

    The engine arguments come from the package's llmserve.yaml; the flags below override operational
    settings only. Startup steps are logged with their durations; /health answers 503 until the
    engine is ready, then 200. SIGTERM/SIGINT drain in-flight requests and exit 0.
    With --openai, --port serves the OpenAI API (/v1/...) and KServe v2 HTTP (/v2/...); without it,
    --port serves KServe v2 HTTP only. KServe v2 gRPC (tritonclient.grpc) is on --grpc-port.

    With --engine triton, a real Triton Inference Server hosts every package given (vLLM-backend packages
    run on llmserve's vLLM backend inside it, Python-backend packages on Triton's Python backend), in
    explicit model-control mode; readiness waits for every model to be READY, and a Triton that exits
    ends llmserve with exit code 7. Packages with `executionMode: standalone` are served by Triton's own
    KServe v2 HTTP (--port), gRPC (--grpc-port) and metrics (--metrics-port) endpoints.

    The API key comes from LLMSERVE_API_KEY or --api-key-file (a key on the command line is visible
    to every local user in the process list); it is never logged.

    Example:

        llmserve serve dist/tiny-chat-1.llmpkg --openai --port 8000 --api-key-file ~/.config/llmserve/key

        curl -H "Authorization: Bearer $(cat ~/.config/llmserve/key)" localhost:8000/v1/models

        LLMSERVE_TRITON_ENV=.venv-triton llmserve serve dist/tiny-chat-1.llmpkg dist/parcel-classifier-1.llmpkg --engine triton

        llmserve serve dist/tiny-chat-1.llmpkg --openai --triton-url triton.internal:8001

        AWS_ENDPOINT_URL=http://127.0.0.1:9000 llmserve serve s3://models/prod/tiny-chat:1 --openai --cache /fsx/llmserve
    """
    from llmserve.serve import ServeOptions
    from llmserve.serve import serve as run_server
    from llmserve.serve.constraint_keys import STRUCTURED_BACKENDS

    if structured_outputs_backend not in STRUCTURED_BACKENDS:
        raise typer.BadParameter(
            f"{structured_outputs_backend!r} is not one of {', '.join(STRUCTURED_BACKENDS)}",
            param_hint="--structured-outputs-backend",
        )

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s llmserve %(levelname)s %(message)s", "%H:%M:%S"))
    logger = logging.getLogger("llmserve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    options = ServeOptions(
        package=_package_argument(packages[0]),
        extra_packages=[_package_argument(p) for p in packages[1:]],
        store_cache=cache,
        engine=engine,
        metrics_port=metrics_port,
        metrics_timeout_s=metrics_timeout,
        triton_url=triton_url,
        triton_http_url=triton_http_url,
        openai=openai,
        host=host,
        port=port,
        grpc_port=grpc_port,
        api_key=api_key or None,
        api_key_file=api_key_file,
        served_model_name=served_model_name,
        kv_cache_gib=kv_cache_gib,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_body_bytes=max_body_bytes,
        max_prompt_chars=max_prompt_chars,
        drain_timeout_s=drain_timeout,
        engine_stall_timeout_s=engine_stall_timeout,
        metrics_dir=metrics_dir,
        constraints=constraints,
        structured_outputs_backend=structured_outputs_backend,
        trust_remote_code=trust_remote_code,
        max_n=max_n,
    )
    code = run_server(options)
    raise typer.Exit(code)


def _package_argument(text: str) -> Path | str:
    return text if text.startswith("s3://") else Path(text)  # Path() would fold the '//' of a reference


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
