#!/usr/bin/env python
"""Make a tiny, random, deterministic causal LM folder (Llama architecture).

Usage:
    python examples/tiny-model/make_tiny_model.py OUT_DIR [--seed 0] [--force]

Importable too (``examples/`` is not a package; load this file with importlib):
    make_tiny_model(out_dir: Path, seed: int = 0) -> Path

What lands in OUT_DIR (a Hugging Face-style model folder that transformers and vLLM load):
    config.json, generation_config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json, chat_template.jinja (+ special_tokens_map.json
    if the installed transformers writes one)

The tokenizer is a byte-level BPE trained with ``tokenizers`` on ``corpus.txt`` next to this
file, so every byte sequence is representable. The model is a randomly initialised
LlamaForCausalLM with a tiny config (hidden 128, 2 layers, 4 heads / 2 KV heads of dim 32,
float32).

Same seed -> byte-identical files. The folder is written into a temporary sibling directory and
renamed into place, so a crash never leaves a half-written OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Belt and braces for determinism: BPE training with tokenizers 0.23 gave the same vocab and merges
# with 16 threads too, but a single thread removes the question. Only effective if set before
# tokenizers starts its thread pool (i.e. before this process first uses tokenizers).
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.txt"

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD]  # ids 0, 1, 2
TARGET_VOCAB_SIZE = 768

# bos once, then per message: "<|role|>\n" + content + eos + "\n".
# add_generation_prompt opens an assistant turn for the model to complete.
# Content may be a string or a list of OpenAI-style parts (text parts are joined; others dropped);
# None (an assistant turn that only calls tools) renders as empty.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- eos_token + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|assistant|>\\n' -}}"
    "{%- endif -%}"
)

# head_dim 32, not 16: vLLM's CPU attention backend supports head sizes
# 32, 64, 80, 96, 112, 128, ... only ("Unsupported CPU attention configuration: head_dim=16").
# hidden_size = num_attention_heads * head_dim keeps the shapes conventional for every engine.
MODEL_CONFIG = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    initializer_range=0.02,
)


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = CORPUS.read_text(encoding="utf-8")
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tok


def _write_tokenizer(tmp: Path):
    from transformers import PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        add_bos_token=False,
        add_eos_token=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(tmp))
    return hf_tok


def _write_model(tmp: Path, hf_tok, seed: int):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards" on stderr

    bos_id = hf_tok.convert_tokens_to_ids(BOS)
    eos_id = hf_tok.convert_tokens_to_ids(EOS)
    pad_id = hf_tok.convert_tokens_to_ids(PAD)
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
        **MODEL_CONFIG,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False
    )
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()


def _fix_up(folder: Path):
    """Make the folder portable and byte-stable.

    - tokenizer_config.json: transformers 5 writes ``"tokenizer_class": "TokenizersBackend"``,
      which transformers 4.x cannot resolve; ``PreTrainedTokenizerFast`` loads in both (5.x maps
      it to TokenizersBackend). The chat template is also copied into tokenizer_config.json for
      readers that predate ``chat_template.jinja``; the .jinja file wins in transformers 5.
    - every JSON file is rewritten with sorted keys and a fixed layout.
    - files get mode 0644 (safetensors writes 0600 through a temp file).
    """
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    jinja = folder / "chat_template.jinja"
    if not jinja.exists():  # older transformers keep it only in tokenizer_config.json
        jinja.write_text(CHAT_TEMPLATE, encoding="utf-8")

    for p in sorted(folder.glob("*.json")):
        data = json.loads(p.read_text(encoding="utf-8"))
        p.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    for p in folder.iterdir():
        os.chmod(p, 0o644)


def make_tiny_model(out_dir: Path, seed: int = 0, force: bool = False) -> Path:
    """Build the tiny model into ``out_dir`` and return its resolved path.

    Raises FileExistsError if ``out_dir`` exists and is non-empty, unless ``force``.
    """
    out_dir = Path(out_dir).resolve()
    if out_dir.exists():
        if not out_dir.is_dir():
            raise FileExistsError(f"{out_dir} exists and is not a directory")
        if any(out_dir.iterdir()) and not force:
            raise FileExistsError(f"{out_dir} is not empty (use --force to overwrite)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)

    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        hf_tok = _write_tokenizer(tmp)
        _write_model(tmp, hf_tok, seed)
        _fix_up(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Make a tiny random Llama model folder (deterministic per seed).")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace OUT_DIR if it is not empty")
    args = ap.parse_args(argv)
    try:
        out = make_tiny_model(args.out_dir, seed=args.seed, force=args.force)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
