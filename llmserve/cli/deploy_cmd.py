"""`llmserve deploy PKG`: roll a package out on the local target (red-black or versioned);
`llmserve deploy down NAME`: tear a deployment down."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer
from typer.core import TyperGroup

from llmserve.cli.deploy_common import (
    ContextOpt,
    KubeconfigOpt,
    NamespaceOpt,
    OutputOpt,
    StateDirOpt,
    StoreCacheOpt,
    Target,
    TargetOpt,
    kube_deployer,
    package_argument,
    render_result,
    render_teardown,
    reporter,
    store_options,
)
from llmserve.cli.deploy_regions import (
    ContextsOpt,
    RegionMaxErrorsOpt,
    RegionPauseOpt,
    check_contexts,
    regional,
    render_regions,
)
from llmserve.cli.render import OutputFormat, console, print_json
from llmserve.cli.store_cmd import EndpointOpt, ProfileOpt, RegionOpt


class Strategy(str, Enum):
    red_black = "red-black"
    versioned = "versioned"


class _DefaultUp(TyperGroup):
    """`llmserve deploy PKG ...` means `llmserve deploy up PKG ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["up", *args]
        return super().parse_args(ctx, args)


deploy_app = typer.Typer(
    cls=_DefaultUp,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="""Deploy packages with zero downtime: `deploy PKG` (= `deploy up PKG`) and `deploy down NAME`; `deploy doctor` checks a local state folder against the processes running for it.

--target local (default): every version runs as its own `llmserve serve` process; one gateway per deployment (a daemon that outlives this command) routes the OpenAI API (/v1/...) and KServe v2 HTTP (/v2/...) on --port, and KServe v2 gRPC (unary and ModelStreamInfer) on --grpc-port, by version the same way. State and history live in SQLite under --state-dir; `llmserve status` and `llmserve rollback` read it.

--target kubernetes: red-black scales two Deployments (colors) in ratio behind one Service; versioned keeps a Deployment and a Service per version. State and history live in a ConfigMap in the namespace; a Lease guards changes.

Exit codes: 0 done, 3 bad input, 5 unknown deployment, 6 interface changed (red-black refused), 7 rollout failed and rolled back, 8 deployment busy or gateway unavailable.

Examples:

    llmserve deploy dist/tiny-chat-1.llmpkg --port 8080

    llmserve deploy dist/tiny-chat-2.llmpkg --steps 10,50,100 --pause 10

    llmserve deploy dist/tiny-chat-3.llmpkg --strategy versioned --idle-timeout 3600

    AWS_ENDPOINT_URL=http://127.0.0.1:9000 llmserve deploy s3://models/prod/tiny-chat:2 --cache /fsx/llmserve

    llmserve deploy s3://models/prod/tiny-chat:2 --target kubernetes --store-secret model-store

    llmserve deploy down tiny-chat

    llmserve deploy dist/tiny-chat-2.llmpkg --target kubernetes --replicas 4 --image registry/llmserve:0.1 --gpus 1

    llmserve deploy dist/tiny-chat-2.llmpkg --target kubernetes --contexts eu-1,us-1,ap-1 --region-pause 60
""",
)


@deploy_app.command("up")
def up(
    package: str = typer.Argument(
        ...,
        help="The .llmpkg (or package folder) to roll out, or a model store reference "
        "s3://BUCKET/PREFIX/MODEL_ID:VERSION (pulled once into --cache; the servers start from there).",
    ),
    strategy: Strategy = typer.Option(
        Strategy.red_black,
        "--strategy",
        "-s",
        help="red-black: shift traffic in steps to the new version, same interface only. "
        "versioned: run it beside the others; callers pick the version.",
    ),
    name: str = typer.Option(None, "--name", help="Deployment name. Default: the package's modelId."),
    steps: str = typer.Option(
        "10,25,50,100", "--steps", help="red-black: percent of traffic on the new version at each step."
    ),
    pause: float = typer.Option(5.0, "--pause", help="red-black: seconds at each step before its health gate."),
    max_step_errors: int = typer.Option(
        0, "--max-step-errors", help="red-black gate: server errors (5xx) from the new version allowed per step."
    ),
    health_timeout: float = typer.Option(
        300.0, "--health-timeout", help="Seconds a new server gets to answer /health 200."
    ),
    drain_timeout: float = typer.Option(
        30.0, "--drain-timeout", help="Seconds in-flight requests get before an old server is stopped."
    ),
    port: int = typer.Option(
        None, "--port", help="Gateway port on a new deployment (kept afterwards). Default: a free port."
    ),
    grpc_port: int = typer.Option(
        None,
        "--grpc-port",
        help="local: the gateway's KServe v2 gRPC port on a new deployment (kept afterwards), routed by version "
        "like HTTP (metadata x-model-version or the request's model_version). Default: a free port (see `status`).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Gateway address on a new deployment. Default: loopback only."
    ),
    idle_timeout: float = typer.Option(
        None,
        "--idle-timeout",
        help="versioned: stop a version idle this many seconds "
        "(never the newest, never the default). Kept for later deploys.",
    ),
    promote: bool = typer.Option(
        None,
        "--promote/--no-promote",
        help="versioned: also send requests that name no version to this version. Default: only for the first version.",
    ),
    kv_cache_gib: int = typer.Option(
        None, "--kv-cache-gib", min=1, help="Passed to each `llmserve serve` (whole GiB of CPU KV cache)."
    ),
    cache: StoreCacheOpt = None,
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    region: RegionOpt = None,
    state_dir: StateDirOpt = None,
    target: TargetOpt = Target.local,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    contexts: ContextsOpt = None,
    region_pause: RegionPauseOpt = 30.0,
    region_max_errors: RegionMaxErrorsOpt = 0,
    kubeconfig: KubeconfigOpt = None,
    replicas: int = typer.Option(
        None,
        "--replicas",
        min=1,
        help="kubernetes: pods per version. Default: the live version's count (red-black), else 1.",
    ),
    image: str = typer.Option("llmserve:latest", "--image", help="kubernetes: server image (see `llmserve build`)."),
    package_uri: str = typer.Option(
        None, "--package-uri", help="kubernetes: where the pods find the package. Default: /models/<package file name>."
    ),
    models_pvc: str = typer.Option(
        None, "--models-pvc", help="kubernetes: PersistentVolumeClaim mounted read-only at /models."
    ),
    store_secret: str = typer.Option(
        None,
        "--store-secret",
        help="kubernetes, store references: Secret whose keys (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY...) become the environment of the init container that pulls the package.",
    ),
    cache_pvc: str = typer.Option(
        None,
        "--cache-pvc",
        help="kubernetes, store references: PersistentVolumeClaim shared as the pods' store cache "
        "(pulled once for all pods on it). Default: an emptyDir per pod.",
    ),
    cpu: str = typer.Option("1", "--cpu", help="kubernetes: CPU request per pod."),
    memory: str = typer.Option("4Gi", "--memory", help="kubernetes: memory request per pod."),
    gpus: int = typer.Option(0, "--gpus", min=0, help="kubernetes: nvidia.com/gpu per pod (request = limit)."),
    service_type: str = typer.Option(
        "ClusterIP", "--service-type", help="kubernetes: ClusterIP, NodePort or LoadBalancer."
    ),
    # -- kubernetes: pod limits and the API key (llmserve.deploy.kubernetes.api_key) --
    cpu_limit: str = typer.Option(
        None, "--cpu-limit", help="kubernetes: CPU limit per pod. Default: the --cpu request."
    ),
    memory_limit: str = typer.Option(
        None,
        "--memory-limit",
        help="kubernetes: memory limit per pod. Default: the --memory request (a pod is OOM-killed at its own "
        "limit, never for a neighbour's growth).",
    ),
    api_key_secret: str = typer.Option(
        None,
        "--api-key-secret",
        help="kubernetes: an existing Secret NAME[:KEY] (KEY default: api-key) the pods read their API key from. "
        "With no key option a new deployment gets a generated key in a Secret, a live one keeps its key.",
    ),
    api_key_file: Path = typer.Option(
        None,
        "--api-key-file",
        help="A file (chmod 600) holding the deployment's API key, else LLMSERVE_API_KEY if set. Local: the "
        "gateway wants it on every route but /health (file under the state folder); kubernetes: put in a Secret "
        "llmserve creates. With neither, a new deployment gets a generated key, a live one keeps its key.",
    ),
    rotate_api_key: bool = typer.Option(
        False, "--rotate-api-key", help="Confirm that this rollout changes the deployment's API key."
    ),
    no_api_key: bool = typer.Option(
        False,
        "--no-api-key",
        help="Take requests without an API key (auth is done in front). Changing a keyed deployment to open needs "
        "--rotate-api-key.",
    ),
    autoscale: str = typer.Option(
        None,
        "--autoscale",
        help="kubernetes: MIN:MAX replicas for a HorizontalPodAutoscaler on the serving Deployment, driven by the "
        "engine's queue (vLLM's waiting requests per pod, through prometheus-adapter: templates/deploy/k8s/"
        "prometheus-adapter-rules.yaml), not CPU; paused during red-black steps. Kept for later deploys; off removes it.",
    ),
    queue_target: float = typer.Option(
        4.0, "--queue-target", help="kubernetes, --autoscale: waiting requests per pod the autoscaler aims at."
    ),
    hold_timeout: float = typer.Option(
        None,
        "--hold-timeout",
        help="local: seconds a request waits at the gateway for a server being restarted. Default: --health-timeout "
        "(as long as a restart may take). Kept.",
    ),
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Roll out PKG. red-black (default): start it beside the live version, wait for /health, shift traffic
    in --steps with a pause and a health gate at each, roll back atomically if a step fails, then drain
    and stop the old version; refused when the interface changes. versioned: one server per
    (modelId, modelVersion), routable only once healthy; callers choose a version with
    `"model": "<modelId>:<version>"`, header `X-Model-Version: <version>` or KServe v2
    `/v2/models/<modelId>/versions/<version>/...`; requests naming no version go to the default.

    A rollout interrupted (CLI killed) is resumed when the same package is deployed again, rolled back otherwise.
    A region-by-region rollout (--contexts) is journaled in the first context: the same deploy continues it,
    `llmserve rollback NAME --target kubernetes --contexts ...` undoes the regions it moved, and another
    package is refused (exit 8) while it is open.

    Examples:

        llmserve deploy dist/tiny-chat-2.llmpkg --steps 10,25,50,100 --pause 5

        llmserve deploy dist/tiny-chat-3.llmpkg --strategy versioned -o json

        llmserve deploy s3://models/prod/tiny-chat:3 --cache /fsx/llmserve
    """
    from llmserve.deploy import Deployer, DeployOptions, StateStore, parse_steps

    regions = check_contexts(contexts, context, target)
    serve_args = ["--kv-cache-gib", str(kv_cache_gib)] if kv_cache_gib is not None else []
    opts = DeployOptions(
        package=package_argument(package),
        cache_dir=cache,
        store=store_options(endpoint_url, profile, region),
        strategy=strategy.value,
        name=name,
        steps=parse_steps(steps),
        pause_s=pause,
        health_timeout_s=health_timeout,
        drain_timeout_s=drain_timeout,
        host=host,
        port=port,
        grpc_port=grpc_port,
        idle_timeout_s=idle_timeout,
        promote=promote,
        max_step_errors=max_step_errors,
        serve_args=serve_args,
    )
    if target is Target.kubernetes:
        from llmserve.deploy.errors import DeployInputError
        from llmserve.deploy.kubernetes import PodSpec

        if grpc_port is not None:
            raise DeployInputError(
                "--grpc-port is the local gateway's: on Kubernetes, clients reach each pod's gRPC port through the Service"
            )

        spec = PodSpec(
            image=image,
            package_uri=package_uri,
            models_pvc=models_pvc,
            store_secret=store_secret,
            cache_pvc=cache_pvc,
            cpu=cpu,
            memory=memory,
            gpus=gpus,
            service_type=service_type,
            serve_args=serve_args,
            cpu_limit=cpu_limit,
            memory_limit=memory_limit,
        )
        from llmserve.deploy.kubernetes import ApiKeyOptions
        from llmserve.deploy.kubernetes.autoscale import Autoscale

        keys = ApiKeyOptions(api_key_secret, *given_api_key(api_key_file), no_api_key, rotate_api_key)
        scaling = Autoscale.parse(autoscale, queue_target) if autoscale is not None else None

        def setup(k):
            k.autoscale = scaling
            return k.use_api_key(keys)

        if regions:
            rollout = regional(
                regions, reporter(output), namespace, kubeconfig, region_pause, region_max_errors, spec, replicas,
                setup=setup,
            )  # fmt: skip
            render_regions(rollout.deploy(opts), output)
            return
        result = setup(kube_deployer(reporter(output), namespace, context, kubeconfig, spec, replicas)).deploy(opts)
    else:
        from llmserve.deploy.errors import DeployInputError
        from llmserve.deploy.local_keys import KeyRequest

        if autoscale is not None:
            raise DeployInputError("--autoscale is for --target kubernetes (a HorizontalPodAutoscaler)")
        if api_key_secret is not None:
            raise DeployInputError(
                "--api-key-secret names a Kubernetes Secret: the local target takes --api-key-file or LLMSERVE_API_KEY"
            )
        opts.api_key = KeyRequest(*given_api_key(api_key_file), no_api_key, rotate_api_key)
        opts.hold_timeout_s = hold_timeout
        result = Deployer(StateStore(state_dir), reporter(output)).deploy(opts)
    render_result(result, output)


def given_api_key(key_file: Path | None) -> tuple[str | None, str]:
    """The key a deploy brings and where it came from; only from a file or the environment, never argv."""
    import os

    from llmserve.serve.options import API_KEY_ENV, ApiKeyError, read_api_key_file

    env_key = os.environ.get(API_KEY_ENV) or None
    if key_file is not None and env_key is not None:
        raise ApiKeyError(f"the API key is given twice: --api-key-file and {API_KEY_ENV}")
    if key_file is not None:
        return read_api_key_file(key_file), f"--api-key-file {key_file}"
    return env_key, API_KEY_ENV if env_key else ""


@deploy_app.command("down")
def down(
    name: str = typer.Argument(..., help="Deployment to tear down."),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", help="Seconds in-flight requests get."),
    state_dir: StateDirOpt = None,
    target: TargetOpt = Target.local,
    namespace: NamespaceOpt = None,
    context: ContextOpt = None,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Stop routing, drain and stop every server of NAME and its gateway; the history stays in the state.

    Example:

        llmserve deploy down tiny-chat
    """
    from llmserve.deploy import Deployer, StateStore

    if target is Target.kubernetes:
        result = kube_deployer(reporter(output), namespace, context, kubeconfig).down(name, drain_timeout)
    else:
        result = Deployer(StateStore(state_dir), reporter(output)).down(name, drain_timeout)
    render_teardown(result, output)


@deploy_app.command("doctor")
def doctor(
    state_dir: StateDirOpt = None,
    fix: bool = typer.Option(
        False, "--fix", help="Move an unreadable database aside and stop the processes no database records."
    ),
    output: OutputOpt = OutputFormat.text,
) -> None:
    """Check a local state folder against the processes that run for it: every server, gateway and watchdog
    a deployment starts is tagged with its state folder, so they are found even when the database was
    deleted or damaged. Exits 7 while something is wrong (an unreadable database, processes it does not
    record); --fix moves the database aside (never deletes it) and stops those processes, whole process
    trees included. Then deploy again.

    Examples:

        llmserve deploy doctor

        llmserve deploy doctor --fix --state-dir /srv/llmserve/state -o json
    """
    from llmserve.deploy import doctor as doc
    from llmserve.deploy.state import default_state_dir
    from llmserve.errors import ExitCode

    root = state_dir or default_state_dir()
    result = doc.repair(root) if fix else doc.diagnose(root)
    if output is OutputFormat.json:
        print_json(result.to_dict())
    else:
        console.print(f"state folder {root}: database {result.database}", highlight=False)
        for p in result.processes:
            flag = " [red]not in the database[/]" if p in result.orphans else ""
            console.print(f"  pid {p.pid} {p.role} of '{p.deployment}'{flag}", highlight=False)
        for action in result.actions:
            console.print(f"[green]done:[/] {action}", highlight=False)
        if not result.healthy and not fix:
            console.print("hint: `llmserve deploy doctor --fix` repairs it; then deploy again.", highlight=False)
    if not result.healthy and not fix:
        raise typer.Exit(ExitCode.ENGINE)


def register(app: typer.Typer) -> None:
    app.add_typer(deploy_app, name="deploy")
