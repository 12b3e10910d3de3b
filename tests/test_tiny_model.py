"""Tests for examples/tiny-model/make_tiny_model.py (no vLLM here; serving tests live elsewhere)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

# torch, transformers and tokenizers are part of the pinned stack: a missing one fails collection.
import tokenizers  # noqa: F401
import torch
import transformers  # noqa: F401
from support.models import TINY_MAKER, tiny_maker

maker = tiny_maker()


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return maker.make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))


def test_writes_expected_files(tiny):
    names = {p.name for p in tiny.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    # nothing left behind next to the output (temp build dir was renamed away)
    assert [p.name for p in tiny.parent.iterdir()] == ["model"]
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (0, 1, 2)
    assert cfg["tie_word_embeddings"] is False
    assert 512 <= cfg["vocab_size"] <= 1024
    assert sum(p.stat().st_size for p in tiny.iterdir()) < 8 * 1024 * 1024


def test_same_seed_is_byte_identical(tiny, tmp_path):
    again = maker.make_tiny_model(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(tiny)


def test_different_seed_changes_weights_only(tiny, tmp_path):
    other = _digests(maker.make_tiny_model(tmp_path / "seed1", seed=1))
    base = _digests(tiny)
    assert other.keys() == base.keys()
    changed = {name for name in base if base[name] != other[name]}
    assert changed == {"model.safetensors"}


def test_refuses_non_empty_dir(tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError):
        maker.make_tiny_model(out)
    assert (out / "keep.txt").read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["busy"]  # no temp dir left behind


def test_empty_dir_is_accepted(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert (maker.make_tiny_model(out) / "model.safetensors").is_file()


def test_cli_refuses_then_force_replaces(tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    r = subprocess.run([sys.executable, str(TINY_MAKER), str(out)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "not empty" in r.stderr
    r = subprocess.run(
        [sys.executable, str(TINY_MAKER), str(out), "--seed", "0", "--force"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert not (out / "stale.txt").exists()
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world",
        '{"name": "Ada", "age": 36}',
        "  leading and trailing spaces  \n\ttabs\r\nCRLF",
        "emoji 🙂👩‍💻🏳️‍🌈 and flags 🇳🇴",
        "日本語 中文 한국어 العربية Ελληνικά русский café",
        "control \x00\x01\x7f and U+FFFF \uffff and astral \U0010ffff",
        "special-looking <|user|> text",
    ],
)
def test_tokenizer_round_trips_utf8(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text


def test_special_tokens(tokenizer):
    assert tokenizer.bos_token == "<|begin_of_text|>" and tokenizer.bos_token_id == 0
    assert tokenizer.eos_token == "<|end_of_text|>" and tokenizer.eos_token_id == 1
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.pad_token_id == 2
    # each special is a single token, and plain encode adds none
    assert tokenizer.encode("<|end_of_text|>", add_special_tokens=False) == [1]
    assert 0 not in tokenizer.encode("hi")


def test_json_punctuation_has_merges(tokenizer):
    # the corpus carries JSON, so common JSON pieces are whole tokens
    vocab = tokenizer.get_vocab()
    assert '":' in vocab or 'Ġ"' in vocab


def test_chat_template_renders(tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|system|>\nBe brief.<|end_of_text|>\n<|user|>\nhi<|end_of_text|>\n<|assistant|>\n"
    )
    no_prompt = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert no_prompt == text[: -len("<|assistant|>\n")]
    # OpenAI-style content parts: text parts are joined
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tokenizer.apply_chat_template(parts, tokenize=False) == ("<|begin_of_text|><|user|>\nab<|end_of_text|>\n")
    ids = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids) == text


def test_model_loads_and_runs(tiny, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny))
    assert model.dtype == torch.float32
    ids = tokenizer("hello", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()
