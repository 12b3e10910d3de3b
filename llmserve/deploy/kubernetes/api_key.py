"""The API key of a Kubernetes deployment: which Secret the pods read it from, and when that may change.

A deployment is authenticated by default. Its pods read `LLMSERVE_API_KEY` from a Secret (secretKeyRef),
so the key is never in a manifest or a process argument. The Secret is either the operator's
(`--api-key-secret NAME[:KEY]`) or one llmserve creates from a key it is given (`--api-key-file`,
`LLMSERVE_API_KEY`) or generates on the first deploy. Each Deployment records the Secret it reads in an
annotation (its name, never the key); a rollout whose key differs from the live version's is refused
unless `--rotate-api-key` confirms it, so a rollout from a shell that lacks the key keeps the live one.
Created Secrets are immutable and named per key, so pods of an old version started during a rollback
still get the old version's key.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass, field

from llmserve.deploy.errors import DeployInputError
from llmserve.deploy.kubernetes.cluster import L_DEPLOYMENT, L_MANAGED, Cluster, api_call

DEFAULT_KEY = "api-key"
L_API_KEY = "llmserve.dev/api-key"  # label of the Secrets llmserve created (removed by `deploy down`)
ROTATE = "--rotate-api-key"


@dataclass
class ApiKeyOptions:
    secret: str | None = None  # an existing Secret: NAME or NAME:KEY
    value: str | None = field(default=None, repr=False)  # a key to put in a Secret llmserve creates
    value_from: str = ""  # where `value` came from, for messages (a path or an environment variable)
    open: bool = False  # --no-api-key: pods take requests without a key
    rotate: bool = False  # confirms a key that differs from the live version's


def parse_ref(text: str) -> tuple[str, str]:
    name, _, key = text.partition(":")
    if not name or (":" in text and not key):
        raise DeployInputError(f"--api-key-secret '{text}': expected NAME or NAME:KEY", hint="e.g. model-key:api-key")
    return name, key or DEFAULT_KEY


def _show(ref: tuple[str, str] | None) -> str:
    return f"Secret {ref[0]} (key {ref[1]})" if ref else "no key (open)"


class ApiKeys:
    def __init__(self, cluster: Cluster, options: ApiKeyOptions, report):
        self.c = cluster
        self.o = options
        self.report = report

    def _read(self, ref: tuple[str, str]) -> str | None:
        secret = api_call(
            f"read Secret {ref[0]}", self.c.core.read_namespaced_secret, ref[0], self.c.namespace, not_found_ok=True
        )
        if secret is None or ref[1] not in (secret.data or {}):
            return None
        return base64.b64decode(secret.data[ref[1]]).decode()

    def _create(self, name: str, value: str) -> tuple[str, str]:
        obj = f"{name}-api-key-{secrets.token_hex(4)}"
        body = {
            "metadata": {
                "name": obj,
                "labels": {L_DEPLOYMENT: name, L_MANAGED: "llmserve", L_API_KEY: "true"},
            },
            "type": "Opaque",
            "immutable": True,
            "stringData": {DEFAULT_KEY: value},
        }
        api_call(f"create Secret {obj}", self.c.core.create_namespaced_secret, self.c.namespace, body)
        return obj, DEFAULT_KEY

    def stays_open(self, live: bool, live_ref: tuple[str, str] | None) -> bool:
        """Whether the next rollout runs without a key, before anything is created: --no-api-key, or no key
        option while the live version runs open."""
        given = self.o.secret or self.o.value is not None
        return self.o.open or (not given and live and live_ref is None)

    def resolve(self, name: str, live: bool, live_ref: tuple[str, str] | None) -> tuple[str, str] | None:
        """The Secret the new version's pods read (None: open), after checking it against the live version's.
        `live`: a version of `name` runs now; `live_ref`: the Secret it reads (None: it runs open)."""
        o = self.o
        given = [
            x for x, on in (("--api-key-secret", o.secret), (o.value_from, o.value), ("--no-api-key", o.open)) if on
        ]
        if len(given) > 1:
            raise DeployInputError(f"give one API key source, not {' and '.join(given)}")
        want: tuple[str, str] | None
        if o.secret:
            named = parse_ref(o.secret)
            if self._read(named) is None:
                raise DeployInputError(
                    f"Secret {named[0]} with key {named[1]} not found in namespace '{self.c.namespace}'",
                    hint=f"kubectl -n {self.c.namespace} create secret generic {named[0]} --from-file={named[1]}=KEYFILE",
                )
            want = named
            changed = want != live_ref
        elif o.value is not None:
            if not o.value.strip():
                raise DeployInputError(f"the API key from {o.value_from} is empty")
            same = live_ref is not None and self._read(live_ref) == o.value
            want, changed = (live_ref, False) if same else (None, True)
        elif o.open:
            want, changed = None, live_ref is not None
        else:  # nothing said: keep the live version's key, or make one for a new deployment
            if live:
                if live_ref is None:
                    self.report(
                        f"'{name}' takes requests without an API key; give it one with --api-key-secret NAME "
                        f"(or --api-key-file) and {ROTATE}",
                        warning=True,
                    )
                return live_ref
            ref = self._create(name, secrets.token_urlsafe(32))
            self.report(
                f"API key generated into Secret {ref[0]}; read it with: kubectl -n {self.c.namespace} get secret "
                f"{ref[0]} -o jsonpath='{{.data.{ref[1]}}}' | base64 -d"
            )
            return ref
        if live and changed and not o.rotate:
            new = _show(want) if want or o.open else f"the key from {o.value_from}"
            raise DeployInputError(
                f"the API key would change: '{name}' reads {_show(live_ref)} now, this rollout would use {new}; "
                "clients holding the current key would be refused",
                hint=f"Confirm the change with {ROTATE}, or deploy with the live key (give no key option to keep it).",
            )
        if o.value is not None and want is None:
            want = self._create(name, o.value)
        if want is None:
            self.report(f"'{name}' will take requests without an API key (--no-api-key)", warning=True)
        elif live and changed:
            self.report(f"API key rotated: {_show(live_ref)} -> {_show(want)}", warning=True)
        return want

    def remove_created(self, name: str, keep: set[str] | None = None) -> list[str]:
        """Delete the Secrets llmserve created for `name`, but those named in `keep`."""
        sel = f"{L_DEPLOYMENT}={name},{L_API_KEY}=true"
        items = api_call("list Secrets", self.c.core.list_namespaced_secret, self.c.namespace, label_selector=sel).items
        items = [s for s in items if s.metadata.name not in (keep or set())]
        for s in items:
            api_call(
                f"delete Secret {s.metadata.name}",
                self.c.core.delete_namespaced_secret,
                s.metadata.name,
                self.c.namespace,
                not_found_ok=True,
            )
        return [f"secret/{s.metadata.name}" for s in items]
