"""Manifests rendered from templates/deploy/k8s/ (Jinja2 -> YAML -> dicts the client sends as is)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llmserve.deploy.hosting import HostChoice
from llmserve.deploy.kubernetes.cluster import L_COLOR, L_DEPLOYMENT, L_MANAGED, L_STRATEGY, L_VERSION, LABEL_PREFIX
from llmserve.formats.safe_yaml import load_yaml
from llmserve.templating import render

A_PACKAGE = f"{LABEL_PREFIX}/package"
A_PACKAGE_URI = f"{LABEL_PREFIX}/package-uri"
A_DIGEST = f"{LABEL_PREFIX}/digest"
A_INTERFACE = f"{LABEL_PREFIX}/interface"
A_ROLLOUT = f"{LABEL_PREFIX}/rollout"
A_MODEL_ID = f"{LABEL_PREFIX}/model-id"
A_SUPERSEDED = f"{LABEL_PREFIX}/superseded-at"
A_API_KEY = f"{LABEL_PREFIX}/api-key-secret"  # where the pods' key comes from (SECRET:KEY), never the key itself
A_HOST = f"{LABEL_PREFIX}/engine-host"  # vllm, triton (embedded) or triton-standalone: what serves in the pods

CACHE_MOUNT = "/models-cache"  # the pods' store cache: the init container pulls into it, the server starts from it
SERVER_PORT = 8000
GRPC_PORT = 8001  # KServe v2 gRPC (tritonclient.grpc), Triton's default
METRICS_PORT = 8002  # Triton's own metrics endpoint, on its own port in executionMode standalone (Triton's default)

# The user `llmserve build` images run as (llmserve.build.context.UID; build sits above deploy in the
# layers, so the number is repeated here). Numeric, so the kubelet can check runAsNonRoot without the image.
RUN_AS = 10001
API_KEY_ENV = "LLMSERVE_API_KEY"  # what `llmserve serve` reads (llmserve.serve.API_KEY_ENV)
# The root file system is read-only: everything the server writes goes to these emptyDir volumes. HOME
# holds llmserve's cache (unpacked packages, constraint disk cache, metrics files) and the engine's
# (vLLM, torch inductor, HF), all of which default to folders under it; TMPDIR is /tmp.
HOME = "/home/llmserve"
SCRATCH_ENV = {
    "HOME": HOME,
    "XDG_CACHE_HOME": f"{HOME}/.cache",
    "LLMSERVE_CACHE": f"{HOME}/.cache/llmserve",
    "TMPDIR": "/tmp",
}


@dataclass(frozen=True)
class Hosting(HostChoice):
    """What serves a package in its pods (the choice: llmserve.deploy.hosting), and what that means there:

    - vllm: llmserve's frontends on the embedded engine; /health on the HTTP port, /metrics there too.
      A package that generates text gets the OpenAI API on the HTTP port beside KServe v2 (vllm and embedded).
    - triton, embedded: a Triton in the pod on loopback, llmserve's frontends (HTTP, gRPC) in front of it;
      /health answers 503 until every model is READY in Triton and the server exits when Triton or a model
      stops serving; /metrics on the HTTP port merges Triton's.
    - triton, standalone: Triton's own endpoints are the pod's: KServe v2 HTTP, gRPC and metrics on their own
      port; the probes are Triton's (/v2/health/ready, strict: every model READY; /v2/health/live). Triton's
      endpoints take no API key.
    Triton's Python-backend stubs exchange tensors through shared memory in /dev/shm: Triton-hosted pods get a
    memory-backed /dev/shm (the runtime's default is 64 MiB)."""

    @classmethod
    def parse(cls, text: str | None, openai: bool = True) -> Hosting:
        """From the A_HOST annotation or the journal (absent before they held it: the embedded vLLM engine)."""
        engine, _, mode = (text or "vllm").partition("-")
        return cls(engine, mode or "embedded", openai)

    def serve_args(self) -> list[str]:
        args = ["--openai"] if self.openai and not self.standalone else []  # standalone: Triton's endpoints only
        if not self.triton:
            return args
        return [*args, "--engine", "triton", *(["--metrics-port", str(METRICS_PORT)] if self.standalone else [])]

    def probes(self) -> dict[str, str]:
        """The HTTP paths of the readiness (and startup) and liveness probes."""
        if self.standalone:
            return {"ready": "/v2/health/ready", "live": "/v2/health/live"}
        return {"ready": "/health", "live": "/health"}


@dataclass
class PodSpec:
    """What every pod of a deployment gets: image, package location, resources."""

    image: str = "llmserve:latest"
    package_uri: str | None = None  # where the image (or the models volume) sees the package; default /models/<file>
    models_pvc: str | None = None  # a PersistentVolumeClaim mounted read-only at /models
    store_secret: str | None = None  # store references: Secret -> the pull init container's environment
    cache_pvc: str | None = None  # store references: a PVC shared as the store cache (default: emptyDir)
    cpu: str = "1"
    memory: str = "4Gi"
    # Limits default to the requests (Guaranteed QoS when every container is so): a pod never uses memory
    # its node did not set aside for it, so it is OOM-killed by its own limit, not by a neighbour's growth.
    cpu_limit: str | None = None
    memory_limit: str | None = None
    scratch_size: str = "8Gi"  # sizeLimit of each writable emptyDir (HOME with the caches, /tmp)
    gpus: int = 0
    service_type: str = "ClusterIP"
    service_port: int = 80
    serve_args: list[str] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def base_labels(name: str, strategy: str) -> dict[str, str]:
    return {L_DEPLOYMENT: name, L_STRATEGY: strategy, L_MANAGED: "llmserve", "app.kubernetes.io/name": name}


def deployment(
    *,
    namespace: str,
    object_name: str,
    name: str,
    strategy: str,
    version: int,
    color: str | None,
    replicas: int,
    spec: PodSpec,
    package: str,
    digest: str | None,
    interface: dict,
    model_id: str,
    rollout: int,
    drain_timeout_s: float,
    health_timeout_s: float,
    store_ref: str | None = None,
    api_key_secret: tuple[str, str] | None = None,
    host: Hosting | None = None,
) -> dict:
    """One Deployment. `store_ref` (a model store reference pinned by digest, s3://.../sha256:DIGEST): an
    init container runs `llmserve pull` into the store cache volume (an emptyDir, or --cache-pvc shared by
    the pods), with the store's endpoint, region and credentials from the Secret `spec.store_secret`
    (envFrom, never inlined); the server then starts from that cache without contacting the store.
    `api_key_secret` (SECRET, KEY): the server's API key, from that Secret's key (secretKeyRef).
    `host`: what serves the package in the pods (Hosting: ports, probes, /dev/shm); default the embedded vLLM engine.

    Every container runs hardened (the restricted Pod Security Standard and more): non-root as RUN_AS,
    read-only root file system with emptyDir scratch volumes (SCRATCH_ENV), no privilege escalation, no
    capabilities, the runtime's default seccomp profile, no service-account token, requests and limits."""
    host = host or Hosting()
    labels = base_labels(name, strategy) | {L_VERSION: str(version)}
    if color:
        labels[L_COLOR] = color
    selector = {L_DEPLOYMENT: name, L_STRATEGY: strategy, L_VERSION: str(version)} | ({L_COLOR: color} if color else {})
    if store_ref:
        package_uri = store_ref
        cache_args = ["--cache", CACHE_MOUNT]
    else:
        package_uri = spec.package_uri or f"/models/{package.rsplit('/', 1)[-1]}"
        cache_args = []
    args = [
        "serve",
        package_uri,
        *cache_args,
        "--host",
        "0.0.0.0",
        "--port",
        str(SERVER_PORT),
        "--grpc-port",
        str(GRPC_PORT),
        "--drain-timeout",
        f"{drain_timeout_s:g}",
        *host.serve_args(),
        *spec.serve_args,
    ]
    requests = {"cpu": spec.cpu, "memory": spec.memory}
    limits = {"cpu": spec.cpu_limit or spec.cpu, "memory": spec.memory_limit or spec.memory}
    if spec.gpus:
        requests["nvidia.com/gpu"] = str(spec.gpus)
        limits["nvidia.com/gpu"] = str(spec.gpus)  # extended resources need limit == request
    annotations = {
        A_PACKAGE: package,
        A_PACKAGE_URI: package_uri,
        A_DIGEST: digest or "",
        A_INTERFACE: json.dumps(interface, sort_keys=True),
        A_ROLLOUT: str(rollout),
        A_MODEL_ID: model_id,
        A_HOST: str(host),
    }
    if api_key_secret:
        annotations[A_API_KEY] = ":".join(api_key_secret)
    env: list[dict] = [
        {"name": "LLMSERVE_DEPLOYMENT", "value": name},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        *({"name": k, "value": v} for k, v in SCRATCH_ENV.items()),
    ]
    server_env = list(env)
    if api_key_secret:
        secret, key = api_key_secret
        server_env.append(
            {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": False}}}
        )
    text = render(
        "deploy/k8s/deployment.yaml.j2",
        object_name=object_name,
        namespace=namespace,
        labels=labels,
        annotations=annotations,
        selector=selector,
        replicas=int(replicas),
        pod_annotations={A_DIGEST: digest or ""},
        termination_grace_s=int(drain_timeout_s) + 15,
        service_account=spec.service_account,
        node_selector=spec.node_selector,
        gpus=spec.gpus,
        image=spec.image,
        args=args,
        env=env,
        server_env=server_env,
        run_as=RUN_AS,
        home=HOME,
        scratch_size=spec.scratch_size,
        port=SERVER_PORT,
        grpc_port=GRPC_PORT,
        metrics_port=METRICS_PORT if host.standalone else None,
        probes=host.probes(),
        dshm=bool(spec.gpus) or host.triton,
        probe_period_s=5,
        startup_failures=max(1, int(health_timeout_s // 5)),
        requests=requests,
        limits=limits,
        # the pull needs no GPU; a pod's effective request is the larger of its init and main containers'
        init_requests={"cpu": spec.cpu, "memory": spec.memory},
        init_limits={k: v for k, v in limits.items() if k != "nvidia.com/gpu"},
        models_pvc=spec.models_pvc,
        store_pull=(
            {
                "args": ["pull", store_ref, "--cache", CACHE_MOUNT],
                "secret": spec.store_secret,
                "cache_pvc": spec.cache_pvc,
                "mount": CACHE_MOUNT,
            }
            if store_ref
            else None
        ),
    )
    return load_yaml(text, "deploy/k8s/deployment.yaml.j2 (rendered)")


def service(
    *,
    namespace: str,
    object_name: str,
    name: str,
    strategy: str,
    selector: dict[str, str],
    spec: PodSpec,
    version: int | None = None,
) -> dict:
    labels = base_labels(name, strategy) | ({L_VERSION: str(version)} if version is not None else {})
    text = render(
        "deploy/k8s/service.yaml.j2",
        object_name=object_name,
        namespace=namespace,
        labels=labels,
        annotations={},
        selector=selector,
        service_type=spec.service_type,
        service_port=spec.service_port,
    )
    return load_yaml(text, "deploy/k8s/service.yaml.j2 (rendered)")
