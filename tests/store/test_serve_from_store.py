"""`llmserve serve s3://BUCKET/PREFIX/MODEL:VERSION`: the package is pulled once into the store cache, verified,
and the server starts from there (a real engine on the tiny model, a real S3 API)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request

from store_helpers import free_port
from support.cli import cli_argv, cli_env, run_cli


def test_serve_pulls_a_store_reference_into_the_cache_and_serves_it(tmp_path, aws_env, bucket, tiny_vllm_package):
    pushed = run_cli("push", tiny_vllm_package, f"s3://{bucket}/prod", env=aws_env)
    assert pushed.returncode == 0, pushed.stderr
    cache = tmp_path / "fsx"
    port = free_port()
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        cli_argv("serve", f"s3://{bucket}/prod/tiny-chat:1", "--openai", "--port", port, "--grpc-port", 0,
                 "--cache", cache),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=cli_env(aws_env),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while "ready in" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
            assert [m["id"] for m in json.loads(response.read())["data"]] == ["tiny-chat"]
        text = log.read_text()
        assert f"s3://{bucket}/prod/tiny-chat:1 -> {cache}" in text and "pulled" in text
        assert list(cache.rglob("*.llmpkg")), "the package is in the cache"
        assert "testing-secret-key" not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    # a second pull of the same reference finds it in the cache: nothing is downloaded again
    again = run_cli("pull", f"s3://{bucket}/prod/tiny-chat:1", "--cache", cache, "-o", "json", env=aws_env)
    assert again.returncode == 0 and json.loads(again.stdout)["downloaded"] is False, again.stdout + again.stderr


def test_a_reference_to_a_missing_model_is_a_clear_error(aws_env, bucket):
    result = run_cli("serve", f"s3://{bucket}/prod/nothing:1", "--openai", env=aws_env)
    assert result.returncode == 5, result.stderr
    assert "nothing" in result.stderr
