"""The main job, end to end, on the embedded default (CPU vLLM, a tiny model made here).

    make the tiny model -> llmserve package -> llmserve serve --openai -> a chat request with a
    JSON-schema response_format (OpenAI client) -> print the parsed answer -> stop the server

Run it with `make demo` (which sets up .venv first) or `.venv/bin/python examples/demo.py`.
Everything happens under ./out/demo; nothing outside the repository is touched.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "out" / "demo"
LLMSERVE = str(Path(sys.executable).parent / "llmserve")

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer"},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_source() -> Path:
    step("making the tiny example model (examples/tiny-model)")
    spec = importlib.util.spec_from_file_location("make_tiny_model", REPO / "examples/tiny-model/make_tiny_model.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    src = WORK / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    shutil.copy(REPO / "examples/json-chat/llmserve.yaml", src / "llmserve.yaml")
    maker.make_tiny_model(src / "model", seed=0)
    return src


def run(*args: str) -> str:
    print("$ llmserve " + " ".join(args), flush=True)
    out = subprocess.run([LLMSERVE, *args], check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    return out.stdout


def wait_ready(proc: subprocess.Popen, port: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become ready in time")


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LLMSERVE_CACHE", str(WORK / "cache"))
    src = make_source()

    step("packaging it for the vLLM backend")
    built = json.loads(run("package", str(src), "--out", str(WORK / "dist"), "--output", "json"))
    print(f"    {built['path']}: {built['files']} files, sha256:{built['digest'][:16]}…")

    step("serving it with the OpenAI API on the real vLLM engine (CPU)")
    port = free_port()
    log = open(WORK / "server.log", "w")  # noqa: SIM115 - the server writes it until it exits; closed in `finally`
    cmd = [LLMSERVE, "serve", built["path"], "--openai", "--port", str(port), "--grpc-port", str(free_port())]
    print("$ " + " ".join(cmd[0:1]).replace(LLMSERVE, "llmserve") + " " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, port)
        print(f"    ready on http://127.0.0.1:{port} (log: {log.name})")

        step("asking for a JSON answer that must match a schema")
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model=built["modelId"],
            messages=[{"role": "user", "content": "Name a city, its population and whether it is a capital."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": ANSWER_SCHEMA, "strict": True},
            },
            max_tokens=200,
            temperature=0.8,
            seed=7,
        )
        content = reply.choices[0].message.content
        answer = json.loads(content)
        import jsonschema

        jsonschema.validate(answer, ANSWER_SCHEMA)
        print(f"    raw:    {content}")
        print(f"    parsed: {answer}")
        print("    (a random-weight model: the words are noise, the structure is guaranteed by the schema)")
    finally:
        step("stopping the server (SIGTERM: drain, then exit)")
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
        print(f"    server exited with code {code}")
    print("\ndemo complete")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
