"""Bad cases: each a typed error with a hint, exit code by kind, and no credential in any output.

Wrong credentials run against a second moto server with its IAM checks on
(INITIAL_NO_AUTH_ACTION_COUNT): there, request signatures are verified and unknown keys refused.
"""

from __future__ import annotations

import json

import boto3
import pytest
from store_helpers import free_port, start_moto, stop
from support.cli import run_cli, run_cli_json

SECRET = "s3cr3t-that-must-never-show-up"


@pytest.fixture(scope="module")
def auth_store(tmp_path_factory) -> dict[str, str]:
    """A moto server that checks signatures, a user allowed everything, and a bucket: its env."""
    # The first three requests (creating the user, its key and its policy) are let through unsigned.
    proc, url = start_moto(tmp_path_factory.mktemp("moto-auth") / "server.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup",
                       aws_secret_access_key="setup")  # fmt: skip
    iam.create_user(UserName="pusher")
    key = iam.create_access_key(UserName="pusher")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="pusher", PolicyName="all", PolicyDocument=json.dumps(policy))
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key["AccessKeyId"],
                 aws_secret_access_key=key["SecretAccessKey"]).create_bucket(Bucket="guarded")  # fmt: skip
    home = tmp_path_factory.mktemp("aws-auth")
    # The right key in a profile, the default chain set to a wrong secret: only --profile works.
    (home / "credentials").write_text(
        f"[pusher]\naws_access_key_id = {key['AccessKeyId']}\naws_secret_access_key = {key['SecretAccessKey']}\n"
    )
    (home / "config").write_text("[profile pusher]\nregion = us-east-1\n")
    yield {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
    }
    stop(proc)


def _clean(out: str) -> None:
    assert SECRET not in out and "Traceback" not in out


def test_wrong_secret_is_refused_with_a_hint(auth_store, small_packages):
    code, err, out = run_cli_json("push", small_packages["a"], "s3://guarded/prod", env=auth_store)
    assert code == 8 and err["error"] == "store-credentials", out
    assert "SignatureDoesNotMatch" in err["message"] or "403" in err["message"]
    assert "AWS_PROFILE" in err["hint"]
    _clean(out)
    # the text rendering, with tracebacks on: still no secret
    r = run_cli("push", small_packages["a"], "s3://guarded/prod", env={**auth_store, "LLMSERVE_DEBUG": "1"})
    assert r.returncode == 8 and "hint" in r.stderr and SECRET not in r.stdout + r.stderr


def test_unknown_key_is_refused(tmp_path, auth_store):
    env = {**auth_store, "AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY0000000"}
    code, err, out = run_cli_json("pull", "s3://guarded/prod/model-a:1", "--cache", tmp_path, env=env)
    assert code == 8 and err["error"] == "store-credentials", out
    _clean(out)


def test_profile_from_aws_config_works(tmp_path, auth_store, small_packages):
    code, pushed, out = run_cli_json("push", small_packages["a"], "s3://guarded/prod", "--profile", "pusher",
                                     env=auth_store)  # fmt: skip
    assert code == 0, out
    code, pulled, out = run_cli_json("pull", "s3://guarded/prod/model-a:1", "--cache", tmp_path, "--profile", "pusher",
                                     env=auth_store)  # fmt: skip
    assert code == 0 and pulled["digest"] == pushed["digest"], out
    code, err, out = run_cli_json("pull", "--list", "s3://guarded/prod", "--profile", "nobody", env=auth_store)
    assert code == 8 and err["error"] == "store-credentials" and "nobody" in err["message"], out


def test_missing_bucket(tmp_path, aws_env, small_packages):
    code, err, out = run_cli_json("push", small_packages["a"], "s3://no-such-bucket-here/prod", env=aws_env)
    assert code == 5 and err["error"] == "store-bucket-not-found" and "aws s3 mb" in err["hint"], out
    code, err, out = run_cli_json("pull", "s3://no-such-bucket-here/prod/model-a:1", "--cache", tmp_path, env=aws_env)
    assert code == 5 and err["error"] == "store-bucket-not-found", out


def test_missing_model(tmp_path, aws_env, bucket):
    r = run_cli("pull", f"s3://{bucket}/prod/nothing:7", "--cache", tmp_path, env=aws_env)
    assert r.returncode == 5 and "store-model-not-found" in r.stderr
    assert "llmserve pull --list s3://BUCKET/PREFIX" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_store(tmp_path, aws_env, small_packages):
    env = {**aws_env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_SECRET_ACCESS_KEY": SECRET}
    code, err, out = run_cli_json("push", small_packages["a"], "s3://some-bucket", env=env)
    assert code == 8 and err["error"] == "store-unreachable" and "--endpoint-url" in err["hint"], out
    _clean(out)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("pull", "https://bucket/x:1"), "not an s3:// URL"),
        (("pull", "s3://bucket/prefix"), "MODEL_ID:VERSION"),
        (("pull", "--list", "s3://bucket/prefix/model:1"), "names a model"),
        (("pull", "s3://bucket/m:1", "--max-cache-size", "lots"), "is not a size"),
    ],
)
def test_bad_references_are_usage_errors(aws_env, args, needle):
    r = run_cli(*args, env=aws_env)
    assert r.returncode == 3 and needle in r.stderr and "hint" in r.stderr, r.stderr


def test_store_gone_mid_push_is_an_interrupted_transfer(tmp_path, multipart_package):
    """The server dies during the upload: exit 8, transfer-interrupted, and the hint says to rerun."""
    import time

    import boto3
    from store_helpers import start_moto, stop
    from support.cli import popen_cli

    proc, url = start_moto(tmp_path / "moto.log")
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="k",
                      aws_secret_access_key=SECRET)  # fmt: skip
    s3.create_bucket(Bucket="doomed")
    log = tmp_path / "push.log"
    push = popen_cli("push", multipart_package, "s3://doomed", "--part-size", "5MiB", "--concurrency", "1",
                     "--max-bandwidth", "5M", log=log, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not s3.list_multipart_uploads(Bucket="doomed").get("Uploads") and time.monotonic() < deadline:
            time.sleep(0.05)
        stop(proc)
        assert push.wait(120) == 8
    finally:
        push.kill()
        stop(proc)
    err = json.loads(log.read_text())
    assert err["error"] == "transfer-interrupted" and "continues" in err["hint"], err
    assert SECRET not in log.read_text()
