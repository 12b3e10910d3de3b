"""The queue-depth autoscaler's settings and manifest (llmserve.deploy.kubernetes.autoscale), without a cluster;
tests/deploy_k8s/test_k8s_autoscale.py has it on a real API server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmserve.deploy.errors import DeployInputError
from llmserve.deploy.kubernetes import autoscale

REPO = Path(__file__).resolve().parents[2]


def test_autoscale_option_parses_bounds_and_off():
    a = autoscale.Autoscale.parse("2:8", 3)
    assert (a.min_replicas, a.max_replicas, a.queue_target, a.off) == (2, 8, 3.0, False)
    assert autoscale.Autoscale.from_config(a.to_config()) == a
    off = autoscale.Autoscale.parse("off")
    assert off.off and off.to_config() == {} and autoscale.Autoscale.from_config({}) is None
    for bad in ("8", "0:2", "3:2", "a:b", "2:"):
        with pytest.raises(DeployInputError, match="MIN:MAX"):
            autoscale.Autoscale.parse(bad)
    with pytest.raises(DeployInputError, match="queue-target"):
        autoscale.Autoscale.parse("1:2", 0)


def test_quantities_of_the_per_pod_target():
    assert [autoscale.quantity(v) for v in (4, 4.0, 0.5, 2.25)] == ["4", "4", "500m", "2250m"]


@pytest.mark.parametrize("version", ["v2", "v2beta2"])
def test_the_hpa_scales_the_serving_deployment_on_waiting_requests(version):
    body = autoscale.manifest(
        api_version=version,
        namespace="ns",
        name="tiny-chat",
        strategy="red-black",
        target="tiny-chat-black",
        settings=autoscale.Autoscale(2, 6, 1.5),
    )
    assert body["apiVersion"] == f"autoscaling/{version}" and body["kind"] == "HorizontalPodAutoscaler"
    assert body["metadata"]["name"] == "tiny-chat"
    assert body["metadata"]["labels"]["llmserve.dev/deployment"] == "tiny-chat"
    spec = body["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tiny-chat-black"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    # queue depth, not CPU: the only metric is the per-pod average of vLLM's waiting requests
    assert spec["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "1500m"},
            },
        }
    ]


def test_the_adapter_rule_serves_the_metric_the_hpa_reads():
    rules = yaml.safe_load((REPO / "templates/deploy/k8s/prometheus-adapter-rules.yaml").read_text())["rules"]
    (rule,) = rules
    assert rule["seriesQuery"].startswith("vllm:num_requests_waiting{")
    assert rule["name"]["as"] == autoscale.METRIC
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    from llmserve.metrics.headline import WAITING

    assert WAITING == "vllm:num_requests_waiting"  # the series llmserve's /metrics carries


def test_the_current_queue_value_comes_from_the_hpa_status():
    hpa = {
        "status": {
            "currentMetrics": [
                {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 50}}},
                {"type": "Pods", "pods": {"metric": {"name": "other"}, "current": {"averageValue": "7"}}},
                {"type": "Pods", "pods": {"metric": {"name": autoscale.METRIC}, "current": {"averageValue": "1500m"}}},
            ]
        }
    }
    assert autoscale.current_value(hpa) == "1500m"
    # not read yet (no custom metrics API, or no pod reporting): currentMetrics absent or without the metric
    assert autoscale.current_value({"status": {"currentMetrics": None}}) is None
    assert autoscale.current_value({"status": {"currentMetrics": hpa["status"]["currentMetrics"][:2]}}) is None
    assert autoscale.current_value({}) is None
