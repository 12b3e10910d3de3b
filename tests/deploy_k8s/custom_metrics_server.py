"""A small custom metrics API server (custom.metrics.k8s.io/v1beta1) that the test cluster's kube-apiserver
aggregates, standing where prometheus-adapter stands in a real cluster.

What is real: the HTTPS server the aggregator proxies to, the APIService `v1beta1.custom.metrics.k8s.io`
that registers it, the API server's availability check and proxying, and the HPA controller in
kube-controller-manager, which discovers the group and reads the metric through the API server as it would
from prometheus-adapter. What stands in: the metric values. Prometheus would scrape each pod's
`vllm:num_requests_waiting`; here the test sets the waiting requests each pod reports (`set_waiting`), and
the server answers them for the pods the API lists under the HPA's label selector, in the adapter's shape
(MetricValueList, one item per pod, metric name `vllm_num_requests_waiting` as the adapter rule in
templates/deploy/k8s/prometheus-adapter-rules.yaml renames it).

How the aggregator reaches a server on loopback (kube-aggregator, 1.20): without --enable-aggregator-routing
the API server resolves an APIService's Service by its type; a Service of type ExternalName resolves to
https://<externalName>:<APIService spec.service.port>, with no Endpoints involved (Endpoints refuse
loopback addresses). The APIService skips TLS verification of the self-signed certificate
(insecureSkipTLSVerify) as the adapter's own manifests do when no CA bundle is wired. The aggregator marks
the APIService Available once GET /apis/custom.metrics.k8s.io/v1beta1 answers 200, and only then proxies.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import subprocess
import tempfile
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

GROUP = "custom.metrics.k8s.io"
VERSION = "v1beta1"
APISERVICE = f"{VERSION}.{GROUP}"
SERVICE_NAMESPACE = "custom-metrics"
SERVICE_NAME = "test-custom-metrics"


class CustomMetricsServer:
    """Serves Pods metrics for `metric`: per (namespace, pod) values set by the test, else per namespace."""

    def __init__(self, api: client.ApiClient, metric: str):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.metric = metric
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, str | None], float] = {}
        self.requests: list[dict] = []  # what was asked: path, labelSelector, the proxied user (X-Remote-User)
        self.errors: list[str] = []
        self._dir = Path(tempfile.mkdtemp(prefix="custom-metrics-"))
        self._httpd: ThreadingHTTPServer | None = None

    # -- the values -----------------------------------------------------------------------------------
    def set_waiting(self, namespace: str, value: float | None, pod: str | None = None) -> None:
        """Waiting requests that `pod` (None: every pod of the namespace without its own value) reports;
        None: the pod (or namespace) reports nothing, as a pod Prometheus has not scraped."""
        with self._lock:
            if value is None:
                self._waiting.pop((namespace, pod), None)
            else:
                self._waiting[(namespace, pod)] = float(value)

    def _value(self, namespace: str, pod: str) -> float | None:
        with self._lock:
            return self._waiting.get((namespace, pod), self._waiting.get((namespace, None)))

    # -- HTTPS ----------------------------------------------------------------------------------------
    def start(self) -> CustomMetricsServer:
        cert, key = self._dir / "tls.crt", self._dir / "tls.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the aggregator keeps connections open

            def do_GET(self):
                try:
                    status, body = server._answer(self)
                except Exception as exc:  # reported as a 500 and kept for the test to show
                    server.errors.append(repr(exc))
                    status, body = 500, _status_body(500, repr(exc))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        threading.Thread(target=self._httpd.serve_forever, name="custom-metrics", daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return self._httpd.server_address[1]

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def _answer(self, req: BaseHTTPRequestHandler) -> tuple[int, dict]:
        url = urllib.parse.urlsplit(req.path)
        query = urllib.parse.parse_qs(url.query)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]  # the controller asks for pods/%2A
        with self._lock:
            self.requests.append(
                {"path": "/" + "/".join(parts), "labelSelector": (query.get("labelSelector") or [""])[0],
                 "user": req.headers.get("X-Remote-User")}
            )  # fmt: skip
        if parts == ["apis", GROUP, VERSION]:
            return 200, {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{GROUP}/{VERSION}",
                "resources": [
                    {"name": f"pods/{self.metric}", "singularName": "", "namespaced": True,
                     "kind": "MetricValueList", "verbs": ["get"]}
                ],
            }  # fmt: skip
        # /apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{name or *}/{metric}
        if (
            len(parts) == 8
            and parts[:3] == ["apis", GROUP, VERSION]
            and parts[3] == "namespaces"
            and parts[5] == "pods"
        ):
            ns, which, metric = parts[4], parts[6], parts[7]
            if metric != self.metric:
                return 404, _status_body(404, f'the server could not find the metric "{metric}" for pods')
            return 200, self._pods(ns, which, (query.get("labelSelector") or [""])[0])
        return 404, _status_body(404, f"no such path {url.path}")

    def _pods(self, ns: str, which: str, selector: str) -> dict:
        """One item per running pod (of those the selector lists) that has a value, as the adapter answers
        only for pods with a series."""
        if which == "*":
            pods = self.core.list_namespaced_pod(ns, label_selector=selector or None).items
        else:
            try:
                pods = [self.core.read_namespaced_pod(which, ns)]
            except ApiException as exc:
                if exc.status != 404:
                    raise
                pods = []
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        items = []
        for p in pods:
            value = self._value(ns, p.metadata.name)
            if value is None or p.metadata.deletion_timestamp is not None or p.status.phase != "Running":
                continue
            items.append(
                {"describedObject": {"kind": "Pod", "namespace": ns, "name": p.metadata.name, "apiVersion": "/v1"},
                 "metricName": self.metric, "timestamp": now, "value": _quantity(value)}
            )  # fmt: skip
        return {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{VERSION}", "metadata": {}, "items": items}

    # -- registration with the aggregation layer ------------------------------------------------------
    def register(self) -> None:
        """The Service (ExternalName localhost, in its own namespace) and the APIService that route
        custom.metrics.k8s.io/v1beta1 to this server. Replaces a registration left by an earlier session."""
        self.unregister()
        try:
            self.core.create_namespace({"metadata": {"name": SERVICE_NAMESPACE}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.core.create_namespaced_service(
            SERVICE_NAMESPACE,
            {
                "metadata": {"name": SERVICE_NAME},
                "spec": {"type": "ExternalName", "externalName": "localhost",
                         "ports": [{"name": "https", "port": self.port, "protocol": "TCP"}]},
            },
        )  # fmt: skip
        client.ApiregistrationV1Api(self.api).create_api_service(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "group": GROUP,
                    "version": VERSION,
                    "service": {"namespace": SERVICE_NAMESPACE, "name": SERVICE_NAME, "port": self.port},
                    "insecureSkipTLSVerify": True,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            }
        )

    def unregister(self) -> None:
        # _preload_content=False: this client cannot parse the Status a 1.20 API server answers a DELETE with
        for delete, args in (
            (client.ApiregistrationV1Api(self.api).delete_api_service, (APISERVICE,)),
            (self.core.delete_namespaced_service, (SERVICE_NAME, SERVICE_NAMESPACE)),
        ):
            try:
                delete(*args, _preload_content=False)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def available(self) -> bool:
        """The aggregator's own verdict: the APIService's Available condition."""
        status = client.ApiregistrationV1Api(self.api).read_api_service(APISERVICE).status
        return any(c.type == "Available" and c.status == "True" for c in (status and status.conditions) or [])


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def _status_body(code: int, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
