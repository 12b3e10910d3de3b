"""Autoscaling on Kubernetes by the engine's queue depth (waiting requests), not CPU.

    llmserve deploy dist/tiny-chat-2.llmpkg --target kubernetes --autoscale 2:10 --queue-target 4

An LLM server is busy long before its CPU says so (the GPU does the work) and a CPU figure says nothing of
the requests queued in the engine. vLLM counts them: the gauge `vllm:num_requests_waiting`, which every
llmserve pod's merged /metrics carries. The option renders a HorizontalPodAutoscaler `<name>` (autoscaling/
v2; v2beta2, with the same fields, where the cluster predates 1.23) with one Pods metric,
`vllm_num_requests_waiting`, whose per-pod average it keeps at --queue-target, between MIN and MAX replicas
(templates/deploy/k8s/hpa.yaml.j2).

What the cluster needs (the operator's part; llmserve does not install it): a custom metrics API
(custom.metrics.k8s.io/v1beta1, registered with the API server's aggregation layer as the APIService
v1beta1.custom.metrics.k8s.io) that serves `vllm_num_requests_waiting` for pods. With prometheus-adapter that
is the rule shipped in templates/deploy/k8s/prometheus-adapter-rules.yaml: the series vllm:num_requests_waiting,
summed per pod, with its namespace and pod labels mapped to those resources, renamed without the colon
(a metric name in that API is a path segment). Prometheus must scrape every llmserve pod's /metrics with
the deployment's API key (the rule file says how). Check it with
    kubectl get --raw "/apis/custom.metrics.k8s.io/v1beta1/namespaces/NS/pods/*/vllm_num_requests_waiting"
which must list one item per serving pod. Until it does, the HPA reports ScalingActive=False
(FailedGetPodsMetric) and only keeps the replicas within [MIN, MAX]; `llmserve status` shows that condition.
Scaling down waits for 5 minutes below target (the HPA's behavior.scaleDown), not the controller-manager's
--horizontal-pod-autoscaler-downscale-stabilization, which spec.behavior replaces.

One HPA per deployment, always on the serving Deployment, and out of the way of rollouts:
- red-black: it scales the color that takes the traffic. When a red-black rollout begins, the HPA is deleted
  (paused): the rollout moves replicas between the colors itself, and an HPA on either color would fight
  the ratio steps. When the rollout ends (done, rolled back, or recovered by the next command), the HPA is
  made again on the color that serves. The new color starts with the old one's replica count, so the
  capacity the HPA had reached carries over.
- versioned: it scales the default version's Deployment (the one the Service <name> selects), and follows
  the default when a version is promoted or retired.
The settings live in the deployment's state ConfigMap (config.autoscale), so any later command (a deploy
without the option, a rollback, a recovery after a killed CLI) keeps or restores the HPA; `--autoscale off`
removes it; `llmserve deploy down` deletes it. `status` shows the HPA with the per-pod value its controller
last read (status.currentMetrics).

What is verified here (tests/deploy_k8s/test_k8s_autoscale.py, a real kube-apiserver 1.20 with its HPA
controller): the HPA is accepted by the API server's validation, points at the serving color, is gone during
a rollout's steps, points at the new color after it and at the old one after a rollback; and the controller
scales on the metric, read through the aggregation layer from a custom metrics API server registered as
above: no value -> ScalingActive=False and no change; 9 waiting per pod against a target of 3 -> MAX (3);
0 -> back to MIN. The values there are set by the test, one number for every pod of the deployment (the test
pods run no engine and no Prometheus scrapes them), so the adapter rule itself is checked only for its names
(tests/unit/test_autoscale_settings.py), not run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from llmserve.deploy.errors import DeployInputError
from llmserve.deploy.kubernetes.cluster import L_COLOR, L_DEPLOYMENT, L_MANAGED, L_STRATEGY, L_VERSION, api_call
from llmserve.deploy.kubernetes.manifests import base_labels
from llmserve.deploy.status import AutoscalerCondition, AutoscalerStatus, AutoscalerUnreadable
from llmserve.deploy.strategy import RED_BLACK, VERSIONED
from llmserve.errors import LLMServeError
from llmserve.formats.safe_yaml import load_yaml
from llmserve.templating import render

if TYPE_CHECKING:
    from llmserve.deploy.kubernetes.cluster import Cluster
    from llmserve.deploy.kubernetes.rollout import KubernetesDeployer
    from llmserve.deploy.kubernetes.state import ClusterState

METRIC = "vllm_num_requests_waiting"  # vllm:num_requests_waiting, as prometheus-adapter-rules.yaml names it
A_QUEUE_TARGET = "llmserve.dev/queue-target"
API_VERSIONS = ("v2", "v2beta2")  # preferred first; both have Pods metrics and behavior with these fields
CONFIG_KEY = "autoscale"


@dataclass(frozen=True)
class Autoscale:
    """--autoscale MIN:MAX --queue-target N; off=True: --autoscale off (remove the HPA)."""

    min_replicas: int = 1
    max_replicas: int = 1
    queue_target: float = 4.0
    off: bool = False

    @classmethod
    def parse(cls, text: str, queue_target: float = 4.0) -> Autoscale:
        if text.strip().lower() == "off":
            return cls(off=True)
        lo, sep, hi = text.partition(":")
        try:
            mn, mx = int(lo), int(hi)
        except ValueError:
            mn = mx = -1
        if not sep or mn < 1 or mx < mn:
            raise DeployInputError(
                f"--autoscale '{text}': expected MIN:MAX replicas with 1 <= MIN <= MAX (e.g. 2:8), or off"
            )
        if not queue_target > 0:
            raise DeployInputError(f"--queue-target {queue_target:g}: expected waiting requests per pod above 0")
        return cls(mn, mx, float(queue_target))

    def to_config(self) -> dict:
        return {} if self.off else {k: v for k, v in asdict(self).items() if k != "off"}

    @classmethod
    def from_config(cls, data: Any) -> Autoscale | None:
        if not isinstance(data, dict) or not data:
            return None
        return cls(int(data["min_replicas"]), int(data["max_replicas"]), float(data["queue_target"]))


def quantity(value: float) -> str:
    """A Kubernetes quantity for a per-pod average: whole numbers as is, else milli-units (0.5 -> 500m)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def manifest(*, api_version: str, namespace: str, name: str, strategy: str, target: str, settings: Autoscale) -> dict:
    """The HorizontalPodAutoscaler <name> on Deployment `target` (templates/deploy/k8s/hpa.yaml.j2)."""
    text = render(
        "deploy/k8s/hpa.yaml.j2",
        api_version=f"autoscaling/{api_version}",
        object_name=name,
        namespace=namespace,
        labels=base_labels(name, strategy),
        annotations={A_QUEUE_TARGET: f"{settings.queue_target:g}"},
        target=target,
        min_replicas=settings.min_replicas,
        max_replicas=settings.max_replicas,
        metric=METRIC,
        queue_target=quantity(settings.queue_target),
    )
    return load_yaml(text, "deploy/k8s/hpa.yaml.j2 (rendered)")


# -- the API (the generated client of this `kubernetes` release has no autoscaling/v2beta2 classes) ------------
def _request(c: Cluster, what: str, method: str, path: str, body: Any = None, content_type: str = "application/json"):
    def call():
        from kubernetes.client.exceptions import ApiException

        api = c.core.api_client
        headers = {"Accept": "application/json"} | ({"Content-Type": content_type} if body is not None else {})
        m, url, hdrs, data, _ = api.param_serialize(
            method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        resp = api.call_api(m, url, hdrs, data)
        resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(http_resp=resp)
        return json.loads(resp.data or b"null")

    return api_call(what, call, not_found_ok=True)


def api_version(c: Cluster) -> str | None:
    """The HPA API version this cluster serves (v2, else v2beta2), or None."""
    group = _request(c, "discover the autoscaling API", "GET", "/apis/autoscaling") or {}
    served = {v.get("version") for v in group.get("versions", [])}
    return next((v for v in API_VERSIONS if v in served), None)


def _path(version: str, namespace: str, name: str | None = None) -> str:
    return f"/apis/autoscaling/{version}/namespaces/{namespace}/horizontalpodautoscalers" + (f"/{name}" if name else "")


def read(c: Cluster, name: str, version: str | None = None) -> dict | None:
    """The deployment's HPA (as JSON), when llmserve made it."""
    version = version or api_version(c)
    if version is None:
        return None
    hpa = _request(c, f"read HorizontalPodAutoscaler {name}", "GET", _path(version, c.namespace, name))
    labels = ((hpa or {}).get("metadata") or {}).get("labels") or {}
    return hpa if labels.get(L_MANAGED) == "llmserve" and labels.get(L_DEPLOYMENT) == name else None


def remove(c: Cluster, name: str) -> bool:
    version = api_version(c)
    if version is None or read(c, name, version) is None:
        return False
    _request(c, f"delete HorizontalPodAutoscaler {name}", "DELETE", _path(version, c.namespace, name))
    return True


# -- what the rollouts call ---------------------------------------------------------------------------
def configure(k: KubernetesDeployer, state: ClusterState, settings: Autoscale | None) -> None:
    """Record this command's --autoscale in the deployment's state (None: keep what is recorded). Refused
    before anything moves when the cluster serves no HPA API with Pods metrics."""
    if settings is None:
        return
    if not settings.off and api_version(k.c) is None:
        raise DeployInputError(
            f"the cluster at {k.c.server} serves neither autoscaling/v2 nor autoscaling/v2beta2 "
            "(HorizontalPodAutoscalers on custom metrics)",
            hint="Deploy without --autoscale, or on Kubernetes 1.12 or later.",
        )
    state.set_config(**{CONFIG_KEY: settings.to_config()})


def settings_of(state: ClusterState) -> Autoscale | None:
    return Autoscale.from_config(state.load()["deployment"].get("config", {}).get(CONFIG_KEY))


def pause(k: KubernetesDeployer, name: str) -> None:
    """Before a red-black rollout's steps: the HPA out of the way (deleted; follow() makes it again)."""
    try:
        if remove(k.c, name):
            k.report(f"autoscaler {name} paused for the rollout (it comes back on the serving color after it)")
    except LLMServeError as exc:
        k.report(f"autoscaler {name} could not be paused: {exc.message}", warning=True)


def serving_object(k: KubernetesDeployer, name: str, state: ClusterState) -> tuple[str, str] | None:
    """(Deployment, strategy) that takes the traffic now: the red-black color with the most replicas, or the
    default version's Deployment."""
    deps = k._deployments(name)
    rb = [d for d in deps if d.metadata.labels.get(L_STRATEGY) == RED_BLACK and d.metadata.labels.get(L_COLOR)]
    if rb:
        main = max(rb, key=lambda d: (d.spec.replicas or 0, d.metadata.creation_timestamp))
        return main.metadata.name, RED_BLACK
    default = state.load()["deployment"].get("default_version")
    for d in deps:
        if d.metadata.labels.get(L_STRATEGY) == VERSIONED and d.metadata.labels.get(L_VERSION) == str(default):
            return d.metadata.name, VERSIONED
    return None


def follow(k: KubernetesDeployer, name: str) -> dict | None:
    """After a command changed the deployment: the HPA as its recorded settings say, on the serving
    Deployment (made, re-pointed, or removed). Best effort: a failure is reported, never raised over the
    rollout's own outcome. Returns the HPA's JSON, or None."""
    from llmserve.deploy.kubernetes.state import ClusterState

    try:
        state = ClusterState(k.c, name)
        if not state.exists():
            return None
        settings = settings_of(state)
        version = api_version(k.c)
        if version is None:
            return None
        current = read(k.c, name, version)
        serving = serving_object(k, name, state) if settings is not None else None
        if settings is None or serving is None:
            if current is not None:
                _request(k.c, f"delete HorizontalPodAutoscaler {name}", "DELETE", _path(version, k.ns, name))
                k.report(f"autoscaler {name} removed")
            return None
        target, strategy = serving
        body = manifest(
            api_version=version, namespace=k.ns, name=name, strategy=strategy, target=target, settings=settings
        )
        if current is None:
            out = _request(k.c, f"create HorizontalPodAutoscaler {name}", "POST", _path(version, k.ns), body)
            k.report(
                f"autoscaler {name}: {target} between {settings.min_replicas} and {settings.max_replicas} replicas, "
                f"{settings.queue_target:g} waiting request(s) per pod"
            )
            return out
        if _spec_key(current) == _spec_key(body) and current["metadata"].get("labels") == body["metadata"]["labels"]:
            return current
        patch = {"metadata": {"labels": body["metadata"]["labels"], "annotations": body["metadata"]["annotations"]}}
        out = _request(
            k.c,
            f"point HorizontalPodAutoscaler {name} at {target}",
            "PATCH",
            _path(version, k.ns, name),
            patch | {"spec": body["spec"]},
            "application/merge-patch+json",
        )
        k.report(f"autoscaler {name} now on {target}")
        return out
    except LLMServeError as exc:
        k.report(f"autoscaler {name} not updated: {exc.message}", warning=True)
        return None


def _spec_key(hpa: dict) -> tuple:
    s = hpa.get("spec") or {}
    metric = ((s.get("metrics") or [{}])[0].get("pods") or {}) if s.get("metrics") else {}
    return (
        (s.get("scaleTargetRef") or {}).get("name"),
        s.get("minReplicas"),
        s.get("maxReplicas"),
        (metric.get("metric") or {}).get("name"),
        str((metric.get("target") or {}).get("averageValue")),
    )


def current_value(hpa: dict) -> str | None:
    """The per-pod average of the queue metric that the HPA controller last read (status.currentMetrics, the
    same shape in v2 and v2beta2), as the quantity it wrote; None before it has read one."""
    for m in (hpa.get("status") or {}).get("currentMetrics") or []:
        pods = m.get("pods") or {}
        if m.get("type") == "Pods" and (pods.get("metric") or {}).get("name") == METRIC:
            value = (pods.get("current") or {}).get("averageValue")
            return None if value is None else str(value)
    return None


def describe(k: KubernetesDeployer, name: str) -> AutoscalerStatus | AutoscalerUnreadable | None:
    """For `status`: the HPA's target, bounds, metric target, and what its controller last said."""
    try:
        hpa = read(k.c, name)
    except LLMServeError as exc:
        return AutoscalerUnreadable(error=exc.message)
    if hpa is None:
        return None
    s, st = hpa.get("spec") or {}, hpa.get("status") or {}
    return AutoscalerStatus(
        object=name,
        target=(s.get("scaleTargetRef") or {}).get("name"),
        min_replicas=s.get("minReplicas"),
        max_replicas=s.get("maxReplicas"),
        metric=METRIC,
        queue_target=(hpa["metadata"].get("annotations") or {}).get(A_QUEUE_TARGET),
        current_value=current_value(hpa),
        current_replicas=st.get("currentReplicas"),
        desired_replicas=st.get("desiredReplicas"),
        conditions=[
            AutoscalerCondition(
                type=c.get("type"), status=c.get("status"), reason=c.get("reason"), message=c.get("message")
            )
            for c in st.get("conditions") or []
        ],
    )
