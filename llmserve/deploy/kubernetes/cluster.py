"""Connection to a Kubernetes API (official `kubernetes` client), resolved from the usual places.

kubeconfig: --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the in-cluster service account.
context: --context, else the kubeconfig's current context. namespace: --namespace, else the context's
namespace, else the in-cluster namespace, else "default".
API errors become the tool's typed errors (one line of what, one line of what next).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmserve.deploy.errors import DeployInputError, GatewayError

LABEL_PREFIX = "llmserve.dev"
L_DEPLOYMENT = f"{LABEL_PREFIX}/deployment"
L_STRATEGY = f"{LABEL_PREFIX}/strategy"
L_COLOR = f"{LABEL_PREFIX}/color"
L_VERSION = f"{LABEL_PREFIX}/model-version"
L_MANAGED = "app.kubernetes.io/managed-by"

_DNS = re.compile(r"[^a-z0-9-]+")


def dns_name(text: str, max_len: int = 40) -> str:
    """A DNS-1123 label from a deployment name (room left for '-black', '-v123', '-llmserve')."""
    out = _DNS.sub("-", text.lower()).strip("-")[:max_len].strip("-")
    if not out or not out[0].isalpha():
        out = ("d-" + out)[:max_len].strip("-")
    return out


class KubernetesAPIError(GatewayError):
    code = "kubernetes-api"
    default_hint = "Check the cluster with `kubectl get --raw /readyz` and your kubeconfig/context/namespace."


@dataclass
class Cluster:
    """The API clients and the namespace a command works in."""

    # kubernetes' generated API clients (CoreV1Api, AppsV1Api, CoordinationV1Api); the library is untyped.
    core: Any
    apps: Any
    coord: Any
    namespace: str
    context: str | None
    server: str


def connect(namespace: str | None = None, context: str | None = None, kubeconfig: str | None = None) -> Cluster:
    try:
        from kubernetes import client, config
    except ImportError as exc:  # pragma: no cover - the lock pins it
        raise DeployInputError(
            "the `kubernetes` Python client is not installed", hint="Install the pinned stack: `make setup`."
        ) from exc
    cfg = client.Configuration()
    ctx_name = None
    ns = namespace
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    try:
        if Path(path).is_file():
            contexts, active = config.list_kube_config_contexts(config_file=path)
            chosen = active
            if context:
                chosen = next((c for c in contexts if c["name"] == context), None)
                if chosen is None:
                    raise DeployInputError(
                        f"no context '{context}' in {path}",
                        hint=f"Known contexts: {', '.join(c['name'] for c in contexts)}.",
                    )
            ctx_name = chosen["name"] if chosen else None
            ns = ns or (chosen or {}).get("context", {}).get("namespace")
            config.load_kube_config(config_file=path, context=ctx_name, client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            if not ns and sa_ns.is_file():
                ns = sa_ns.read_text().strip()
        else:
            raise DeployInputError(
                f"no kubeconfig at {path} and not running inside a cluster", hint="Set KUBECONFIG or pass --kubeconfig."
            )
    except config.ConfigException as exc:
        raise DeployInputError(
            f"cannot load the kubeconfig {path}: {exc}", hint="Check it with `kubectl config view`."
        ) from exc
    api = client.ApiClient(cfg)
    return Cluster(
        core=client.CoreV1Api(api),
        apps=client.AppsV1Api(api),
        coord=client.CoordinationV1Api(api),
        namespace=ns or "default",
        context=ctx_name,
        server=cfg.host,
    )


def api_call(what: str, fn, *args, not_found_ok: bool = False, **kwargs):
    """Call the API; 404 gives None when not_found_ok; other failures raise KubernetesAPIError."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404 and not_found_ok:
            return None
        reason = exc.reason
        try:
            import json

            reason = json.loads(exc.body or "{}").get("message") or reason
        except ValueError:
            pass
        hint = None
        if exc.status in (401, 403):
            hint = "Your credentials may not allow this: check `kubectl auth can-i` for deployments, services, configmaps, leases."
        elif exc.status == 404 and "namespaces" in str(reason):
            hint = "Create the namespace (`kubectl create namespace NAME`) or pass another --namespace."
        raise KubernetesAPIError(f"Kubernetes API: {what} failed ({exc.status}): {reason}", hint=hint) from exc
    except (Urllib3Error, OSError) as exc:
        raise KubernetesAPIError(f"Kubernetes API unreachable while trying to {what}: {exc}") from exc
