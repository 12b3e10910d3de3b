"""The `kubernetes` target of `llmserve deploy`: the same strategies on a Kubernetes API.

Public surface: KubernetesDeployer (deploy, rollback, down, status), PodSpec, ApiKeyOptions, connect,
replica_plan.
The `kubernetes` client is imported only when a command targets Kubernetes (`--help` stays fast).
"""

from llmserve.deploy.kubernetes.api_key import ApiKeyOptions
from llmserve.deploy.kubernetes.cluster import Cluster, connect
from llmserve.deploy.kubernetes.manifests import PodSpec
from llmserve.deploy.kubernetes.rollout import KubernetesDeployer, replica_plan

__all__ = ["ApiKeyOptions", "Cluster", "KubernetesDeployer", "PodSpec", "connect", "replica_plan"]
