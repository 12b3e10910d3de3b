"""A real S3 API for the store's tests: moto's server mode, as its own process on 127.0.0.1.

The CLI runs as a subprocess (support.cli) and finds the server through the usual AWS settings:
AWS_ENDPOINT_URL and dummy keys in its environment, with the AWS config files pointed away from
the user's own. Each test gets a fresh bucket.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from store_helpers import aws_test_env, make_package, start_moto, stop


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory) -> str:
    proc, url = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    yield url
    stop(proc)


@pytest.fixture(scope="session")
def aws_env(s3_endpoint, tmp_path_factory) -> dict[str, str]:
    """The environment of every CLI run: the test server, dummy keys, no config from the host."""
    home = tmp_path_factory.mktemp("aws")
    env = aws_test_env(s3_endpoint, home)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(var, None)
    os.environ.update(env)  # the tests' own boto3 client reads the same settings
    return env


@pytest.fixture(scope="session")
def s3(aws_env):
    import boto3

    return boto3.client("s3")


@pytest.fixture
def bucket(s3) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def small_packages(tmp_path_factory) -> dict[str, Path]:
    """Packages of a few MiB, built once: 'a', 'b', 'c' (distinct digests, ~6 MiB each)."""
    root = tmp_path_factory.mktemp("pkgs")
    return {name: make_package(root / name, f"model-{name}", 1, 6 << 20, seed=i) for i, name in enumerate("abc")}


@pytest.fixture(scope="session")
def multipart_package(tmp_path_factory) -> Path:
    """A 24 MiB package: 5 parts at 5 MiB."""
    return make_package(tmp_path_factory.mktemp("mp"), "big-model", 3, 24 << 20, seed=7)
