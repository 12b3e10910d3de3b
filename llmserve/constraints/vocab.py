"""A tokenizer's vocabulary as raw bytes per token id.

Constraints are compiled against the byte string each token stands for. Byte-level BPE (GPT-2
style, ``tokenizers`` ``ByteLevel``) maps every byte to a printable character; that map is undone
here so that a token carrying half of a multi-byte UTF-8 character is seen as exactly those bytes.
SentencePiece-style vocabularies (``▁`` for space, ``<0xNN>`` byte-fallback pieces) are handled too.
Special tokens (other than end-of-sequence) have no bytes and are never allowed under a constraint.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def _byte_level_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte -> printable character map: bytes that are printable Latin-1
    stand for themselves, the others are shifted to code points 256 and up, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = {}
    shift = 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + shift)] = b
            shift += 1
    return chars


_BYTE_LEVEL = _byte_level_decoder()


@dataclass
class Vocab:
    """Token id -> bytes (``None``: never allowed), the end-of-sequence ids, and the mask width.

    ``size`` is the width of the logits row (the model's vocabulary size, which may exceed the
    tokenizer's); ids without bytes, and ids past the tokenizer, are never allowed.
    """

    tokens: list[bytes | None]
    eos_ids: tuple[int, ...]
    size: int = 0
    _digest: str | None = field(default=None, repr=False)
    _packed: tuple | None = field(default=None, repr=False)
    _single_bytes: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        self.size = max(self.size, len(self.tokens), max(self.eos_ids, default=-1) + 1)
        self.eos_ids = tuple(sorted(set(int(e) for e in self.eos_ids)))

    @property
    def single_bytes(self) -> np.ndarray:
        """bool [256]: the bytes some token is exactly (one-byte tokens; a byte-level BPE has all 256)."""
        if self._single_bytes is None:
            out = np.zeros(256, dtype=bool)
            for data in self.tokens:
                if data is not None and len(data) == 1:
                    out[data[0]] = True
            self._single_bytes = out
        return self._single_bytes

    @property
    def words(self) -> int:
        """uint32 words per bitmask row."""
        return (self.size + 31) // 32

    @property
    def digest(self) -> str:
        if self._digest is None:
            h = hashlib.sha256()
            h.update(json.dumps({"size": self.size, "eos": list(self.eos_ids)}).encode())
            for t in self.tokens:
                if t is None:
                    h.update(b"\xff\xff\xff\xff")
                else:
                    h.update(len(t).to_bytes(4, "little"))
                    h.update(t)
            self._digest = h.hexdigest()
        return self._digest

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets int64 [size+1], data uint8): token i is data[offsets[i]:offsets[i+1]];
        an empty token (length 0) is never allowed."""
        if self._packed is None:
            lens = np.zeros(self.size, dtype=np.int64)
            for i, t in enumerate(self.tokens):
                if t is not None and i not in self.eos_ids:
                    lens[i] = len(t)
            offsets = np.zeros(self.size + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            data = bytearray()
            for i, t in enumerate(self.tokens):
                if t is not None and lens[i]:
                    data += t
            self._packed = (offsets, np.frombuffer(bytes(data), dtype=np.uint8).copy())
        return self._packed

    def token_bytes(self, i: int) -> bytes | None:
        if i in self.eos_ids or i >= len(self.tokens):
            return None
        t = self.tokens[i]
        return t if t else None

    # ---------------------------------------------------------------- constructors

    @classmethod
    def from_hf_tokenizer(cls, tokenizer, *, size: int | None = None, eos_ids=None) -> Vocab:
        """From a ``transformers`` tokenizer (fast or slow)."""
        n = len(tokenizer)
        id_to_token = {}
        for tok, i in tokenizer.get_vocab().items():
            id_to_token[i] = tok
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        try:
            added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
            special |= {i for i, t in added.items() if getattr(t, "special", False)}
        except Exception:  # pragma: no cover - tokenizer without added tokens table
            pass
        kind = _tokenizer_kind(tokenizer)
        tokens: list[bytes | None] = [None] * max(n, max(id_to_token, default=-1) + 1)
        for i, tok in id_to_token.items():
            if i in special:
                continue
            tokens[i] = _token_to_bytes(tok, kind, tokenizer)
        if eos_ids is None:
            eos_ids = []
            if getattr(tokenizer, "eos_token_id", None) is not None:
                eos_ids.append(tokenizer.eos_token_id)
        return cls(tokens, tuple(eos_ids), size or 0)

    @classmethod
    def from_tiktoken_ranks(cls, path_or_text, *, eos_ids=None, size: int | None = None) -> Vocab:
        """From a tiktoken ``.tiktoken`` ranks file (``base64(token) rank`` per line) or the
        js-tiktoken JSON ranks (``{"bpe_ranks": "...", "special_tokens": {...}}``)."""
        if isinstance(path_or_text, Path) or (
            isinstance(path_or_text, str)
            and len(path_or_text) < 4096
            and "\n" not in path_or_text
            and not path_or_text.startswith("{")
        ):
            text = Path(path_or_text).read_text()
        else:
            text = str(path_or_text)
        ranks: dict[int, bytes] = {}
        specials: dict[str, int] = {}
        if text.lstrip().startswith("{"):
            obj = json.loads(text)
            specials = obj.get("special_tokens", {})
            # js-tiktoken compresses ranks: "! <offset> <b64> <b64> ..." lines with consecutive ranks
            for line in obj["bpe_ranks"].split("\n"):
                if not line:
                    continue
                parts = line.split(" ")
                offset = int(parts[1])
                for k, b64 in enumerate(parts[2:]):
                    ranks[offset + k] = base64.b64decode(b64)
        else:
            for line in text.splitlines():
                if line.strip():
                    b64, rank = line.split()
                    ranks[int(rank)] = base64.b64decode(b64)
        n = max(max(ranks) + 1, max(specials.values(), default=-1) + 1)
        tokens: list[bytes | None] = [None] * n
        for r, b in ranks.items():
            tokens[r] = b
        if eos_ids is None:
            eos_ids = [v for k, v in specials.items() if "endoftext" in k] or [n]
        return cls(tokens, tuple(eos_ids), size or 0)


def _tokenizer_kind(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        try:
            spec = json.loads(backend.to_str())
            dec = json.dumps(spec.get("decoder") or {})
            if "ByteLevel" in dec:
                return "byte_level"
            if "ByteFallback" in dec or "Metaspace" in dec or "\u2581" in dec:
                return "sentencepiece"
        except Exception:  # pragma: no cover
            pass
    return "text"


def _token_to_bytes(tok: str, kind: str, tokenizer) -> bytes | None:
    if kind == "byte_level":
        try:
            return bytes(_BYTE_LEVEL[c] for c in tok)
        except KeyError:
            return tok.encode("utf-8")
    if kind == "sentencepiece":
        if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
            return bytes([int(tok[3:5], 16)])
        return tok.replace("\u2581", " ").encode("utf-8")
    text = tokenizer.convert_tokens_to_string([tok])
    return text.encode("utf-8") if text else None
