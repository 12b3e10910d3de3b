"""`llmserve deploy s3://BUCKET/PREFIX/MODEL:VERSION` on the local target: a real S3 API (moto's server
mode over HTTP), real `llmserve serve` processes on the tiny model, the real gateway.

In file order: first version from the store -> the servers hold their cached package against LRU
eviction -> store errors leave it serving -> red-black to another reference -> rollback with the store
unreachable (the earlier package is still in the cache, by digest) -> teardown.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from deploy_helpers import MODEL, Cli, auth
from store.store_helpers import aws_test_env, start_moto, stop
from support.cli import run_cli, run_cli_json

pytestmark = pytest.mark.timeout(900)

SECRET = "testing-secret-key-for-deploy"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    proc, url = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def aws_env(moto, tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("aws")
    return aws_test_env(moto, home, secret=SECRET)


class StoreCli(Cli):
    """The deploy CLI with the store's settings in its environment (what the servers inherit)."""

    def __init__(self, state_dir: Path, env: dict[str, str]):
        super().__init__(state_dir)
        self.env = env

    def run(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None):
        return run_cli_json(*self.args(*args), env={**self.env, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def scli(tmp_path_factory, aws_env):
    c = StoreCli(tmp_path_factory.mktemp("deploy-store-state"), aws_env)
    yield c
    c.run("deploy", "down", MODEL)
    from llmserve.deploy import StateStore
    from llmserve.deploy.local_target import stop_recorded_processes

    store = StateStore(c.state_dir)
    stop_recorded_processes(store)


@pytest.fixture(scope="module")
def pushed(aws_env, deploy_packages) -> dict:
    """tiny-chat 1 and 2 pushed to a fresh bucket: {"store": s3://..., "digest": {1: ..., 2: ...}}."""
    import boto3

    bucket = f"models-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=aws_env["AWS_ENDPOINT_URL"],
        aws_access_key_id=aws_env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    store = f"s3://{bucket}/prod"
    digests = {}
    for key, version in (("v1", 1), ("v2", 2)):
        p = run_cli("push", deploy_packages[key], store, "-o", "json", env=aws_env)
        assert p.returncode == 0, p.stderr
        digests[version] = json.loads(p.stdout)["digest"]
    return {"store": store, "digest": digests}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fsx") / "store-cache"


def serving(status: dict) -> dict[int, int]:
    return {i["version"]: i["weight"] for i in status["instances"] if i["status"] == "serving"}


def chat(status: dict) -> httpx.Response:
    return httpx.post(
        status["gateway"]["url"] + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        headers=auth(status),
        timeout=60,
    )


def test_deploy_a_store_reference_pulls_once_and_serves_from_the_cache(scli, pushed, cache):
    ref = f"{pushed['store']}/{MODEL}:1"
    rc, data, text = scli.run("deploy", ref, "--cache", str(cache), "--pause", "0")
    assert rc == 0, text
    assert serving(data) == {1: 100}
    assert "pulled" in text
    (inst,) = data["instances"]
    assert inst["package"] == ref and inst["digest"] == pushed["digest"][1]  # the state: reference and digest
    r = chat(data)
    assert r.status_code == 200 and r.headers["x-served-version"] == "1"
    assert (cache / "blobs" / "sha256" / f"{pushed['digest'][1]}.llmpkg").is_file()
    # the server starts from the cache, pinned by digest; no credential in its arguments or its log
    cmdline = Path(f"/proc/{inst['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert f"{pushed['store']}/sha256:{pushed['digest'][1]}" in cmdline and str(cache) in cmdline
    assert SECRET not in cmdline and "testing-key-id" not in cmdline
    assert SECRET not in Path(inst["log"]).read_text(errors="replace") and SECRET not in text
    # deploying the same reference again changes nothing and downloads nothing
    rc, data, text = scli.run("deploy", ref, "--pause", "0")
    assert rc == 0, text
    assert data["action"] == "unchanged" and "already cached" in text


def test_a_serving_package_is_never_evicted(scli, pushed, cache):
    size1 = (cache / "blobs" / "sha256" / f"{pushed['digest'][1]}.llmpkg").stat().st_size
    # a pull that needs v1's room: v1 is the least recently used entry, but its server holds a lease
    p = run_cli(
        "pull", f"{pushed['store']}/{MODEL}:2", "--cache", cache, "--max-cache-size", str(size1 + 1000),
        "-o", "json", env=scli.env,
    )  # fmt: skip
    assert p.returncode == 8, p.stdout + p.stderr
    err = json.loads(p.stdout)
    assert err["error"] == "cache-full" and "1 package(s) in use" in err["message"], err
    assert (cache / "blobs" / "sha256" / f"{pushed['digest'][1]}.llmpkg").is_file()
    assert serving(scli.status()) == {1: 100}


@pytest.mark.parametrize(
    ("where", "env", "code", "rc", "words"),
    [
        ("s3://no-such-bucket-llmserve/prod/tiny-chat:2", {}, "store-bucket-not-found", 5, "no-such-bucket-llmserve"),
        ("{store}/tiny-chat:9", {}, "store-model-not-found", 5, "tiny-chat"),
        ("{store}/tiny-chat:2", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "store-unreachable", 8, "connect"),
    ],
    ids=["missing-bucket", "unknown-version", "unreachable-store"],
)
def test_store_errors_are_clear_and_leave_the_deployment_serving(scli, pushed, cache, where, env, code, rc, words):
    before = scli.status()
    got, data, text = scli.run("deploy", where.format(store=pushed["store"]), "--pause", "0", env=env, timeout=300)
    assert got == rc, text
    assert data is not None and data["error"] == code, text
    assert words in data["message"] and data["hint"]
    assert SECRET not in text
    after = scli.status()
    assert serving(after) == {1: 100}
    assert [i["instance"] for i in after["instances"]] == [i["instance"] for i in before["instances"]]
    assert chat(after).status_code == 200


def test_red_black_from_one_reference_to_another(scli, pushed, cache):
    ref2 = f"{pushed['store']}/{MODEL}:2"
    rc, data, text = scli.run("deploy", ref2, "--steps", "50,100", "--pause", "0.5")
    assert rc == 0, text
    assert serving(data) == {2: 100}
    (inst,) = [i for i in data["instances"] if i["status"] == "serving"]
    assert inst["package"] == ref2 and inst["digest"] == pushed["digest"][2]
    assert data["config"]["store_cache"] == str(cache.resolve())  # kept from the first deploy
    assert chat(data).headers["x-served-version"] == "2"


def test_rollback_to_a_reference_needs_no_store_when_it_is_cached(scli, pushed):
    rc, data, text = scli.run("rollback", MODEL, "--pause", "0.5", env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert rc == 0, text
    assert serving(data) == {1: 100}
    (inst,) = [i for i in data["instances"] if i["status"] == "serving"]
    assert inst["package"] == f"{pushed['store']}/{MODEL}:1" and inst["digest"] == pushed["digest"][1]
    assert chat(data).headers["x-served-version"] == "1"


def test_rollback_pulls_from_the_store_it_is_told(scli, pushed, tmp_path):
    # version 2 is not in this fresh cache and the environment's endpoint is dead: only --endpoint-url
    # can bring it back
    fresh = tmp_path / "other-cache"
    rc, data, text = scli.run(
        "rollback",
        MODEL,
        "--pause",
        "0.5",
        "--cache",
        str(fresh),
        "--endpoint-url",
        scli.env["AWS_ENDPOINT_URL"],
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
    )
    assert rc == 0, text
    assert serving(data) == {2: 100}
    (inst,) = [i for i in data["instances"] if i["status"] == "serving"]
    assert inst["digest"] == pushed["digest"][2]
    assert any(fresh.rglob("*")), "the package was pulled into the cache named on the command line"
    assert chat(data).headers["x-served-version"] == "2"
