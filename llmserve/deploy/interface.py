"""A package's interface: what a caller can observe about requests and responses, apart from the
generated text itself. Red-black rollouts need it unchanged (callers cannot choose a side); a change
calls for `--strategy versioned`.

Components (each compared separately, so the refusal names what changed):
  backend          vllm or python
  io               the tensor contract: for vLLM packages the generated LLM text contract
                   (llmserve.formats.tensors.LLM_TEXT_CONTRACT), for Python packages the frozen
                   `python.tensors` with its frontend and decoupled (streaming) setting
  tokenizer        token ids are visible (usage counts, logprobs, logit_bias, max_tokens meaning)
  chat_template    how chat messages become a prompt (roles, tools accepted)
  max_model_len    the context length: a shorter one turns valid requests into 400s
  request_plugins  vLLM logits-processor plugins, which add request fields
Weights, dtype and operational engine settings are not part of the interface: they change the
answers, not the contract.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from llmserve.errors import Detail
from llmserve.formats.tensors import LLM_TEXT_CONTRACT

TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(package) -> dict:
    """The interface of an opened package (llmserve.packaging.opened.OpenedPackage), as JSON-able values."""
    m = package.manifest
    out: dict = {"backend": m.backend}
    if m.backend == "python":
        py = m.python
        out["io"] = _sha(
            json.dumps(
                {"tensors": py.tensors.model_dump(mode="json"), "frontend": py.frontend, "decoupled": py.decoupled},
                sort_keys=True,
            ).encode()
        )
    else:
        out["io"] = _sha(json.dumps(LLM_TEXT_CONTRACT.model_dump(mode="json"), sort_keys=True).encode())
    weights = Path(package.weights_dir)
    tok = hashlib.sha256()
    template = hashlib.sha256()
    for name in TOKENIZER_FILES:
        f = weights / name
        if f.is_file():
            tok.update(name.encode() + b"\0" + f.read_bytes())
    cfg_file = weights / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except ValueError:
            cfg = {}
        chat = cfg.pop("chat_template", None)
        if chat is not None:
            template.update(json.dumps(chat, sort_keys=True).encode())
        tok.update(json.dumps(cfg, sort_keys=True).encode())
    for name in ("chat_template.jinja", "chat_template.json"):
        f = weights / name
        if f.is_file():
            template.update(name.encode() + b"\0" + f.read_bytes())
    out["tokenizer"] = tok.hexdigest()
    out["chat_template"] = template.hexdigest()
    out["max_model_len"] = m.engine.get("max_model_len")
    out["request_plugins"] = sorted(p.entryPoint for p in m.plugins if p.group == "vllm.logits_processors")
    return out


def differences(live: dict, new: dict) -> list[list[str]]:
    """Rows (component, live, new) for every component that differs."""
    rows = []
    for key in sorted(set(live) | set(new)):
        a, b = live.get(key), new.get(key)
        if a != b:
            rows.append([key, _show(a), _show(b)])
    return rows


def _show(value) -> str:
    if isinstance(value, str) and len(value) == 64:
        return f"sha256:{value[:12]}…"
    return json.dumps(value)


def difference_detail(rows: list[list[str]]) -> Detail:
    return Detail(title="interface: live vs new", columns=["component", "live", "new"], rows=rows)
