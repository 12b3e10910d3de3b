"""/v1/embeddings on a pooling variant of the tiny model (engine: runner pooling, convert embed).

This module starts its own short-lived server: one engine serves either generation or pooling.
"""

from __future__ import annotations

import base64
import shutil
import struct

import openai
import pytest

EMBED_MANIFEST = """\
modelId: tiny-embed
modelVersion: 1
backend: vllm
engine:
  max_model_len: 512
  dtype: float32
  enforce_eager: true
  runner: pooling
  convert: embed
"""


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory, tiny_model_dir, server_control):
    src = tmp_path_factory.mktemp("embed-src") / "tiny-embed"
    shutil.copytree(tiny_model_dir, src / "model")
    (src / "llmserve.yaml").write_text(EMBED_MANIFEST)
    srv = server_control.start(src, tmp_path_factory.mktemp("embed-log") / "server.log", api_key=None)
    yield srv
    assert server_control.stop(srv) == 0


@pytest.fixture(scope="module")
def embed_client(embed_server):
    return openai.OpenAI(base_url=embed_server.base_url + "/v1", api_key="unused", timeout=120, max_retries=0)


def test_embeddings_float_and_batch(embed_client):
    r = embed_client.embeddings.create(model="tiny-embed", input=["hello", "world", "hello"], encoding_format="float")
    vecs = [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
    assert len(vecs) == 3 and len(vecs[0]) == 128
    assert vecs[0] == pytest.approx(vecs[2]) and vecs[0] != pytest.approx(vecs[1])
    assert r.usage.prompt_tokens > 0


def test_embeddings_base64(embed_server):
    import httpx

    r = httpx.post(
        embed_server.base_url + "/v1/embeddings",
        json={"model": "tiny-embed", "input": "hello", "encoding_format": "base64"},
    )
    assert r.status_code == 200, r.text
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert len(struct.unpack(f"<{len(raw) // 4}f", raw)) == 128


def test_pooling_model_rejects_generation_and_dimensions(embed_client):
    with pytest.raises(openai.BadRequestError) as info:
        embed_client.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "x"}])
    assert "pooling model" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        embed_client.embeddings.create(model="tiny-embed", input="x", dimensions=8)
    assert info.value.body["param"] == "dimensions"
