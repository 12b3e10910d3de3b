"""Per-request limits shared by every frontend, so no request can take the server down (#11).

What a single request may cost is bounded before the engine sees it:
  - the body: --max-body-bytes (http_guards.py), counted after decompression for KServe v2
    gzip/deflate bodies (`inflate`: streamed in slices, so the event loop keeps serving others);
  - JSON nesting: MAX_JSON_DEPTH levels (`load_json`); deeper input would overflow the Python stack
    in the parser or in any recursive walk after it (jsonschema, the tensor flattener);
  - prompt text: --max-prompt-chars, on every route that takes a prompt (OpenAI and KServe v2);
  - fields whose size multiplies work in the decode loop or in the chat template: the constants below.
    They are fixed protocol limits, as OpenAI's API has them (it takes at most 4 stop strings),
    set well above what a real client sends; the body and prompt limits are flags because they
    depend on the model and the deployment.
Request-supplied text that reaches the log goes through `log_safe` (control characters escaped, length
bounded), so a client cannot forge log lines or flood the log.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import zlib
from typing import Any

# `llmserve serve`'s defaults for --max-body-bytes and --max-prompt-chars (llmserve/serve/options.py),
# for frontends built without them (tests, embedding)
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_PROMPT_CHARS = 200_000
# vLLM SamplingParams' max_tokens when a request sets none: what /v1/completions and KServe generations get (chat
# gets the rest of the context); a constrained answer is checked against it, and a refusal names it as the default
VLLM_DEFAULT_MAX_TOKENS = 16
MAX_JSON_DEPTH = 64  # nesting levels of any JSON a request carries (the body, or JSON inside it)
MAX_MESSAGES = 2048  # chat messages per request (each one is rendered by the chat template)
MAX_PROMPTS = 256  # prompts in one /v1/completions request (each is its own engine request)
MAX_EMBEDDING_INPUTS = 2048  # inputs in one /v1/embeddings request (OpenAI's own limit)
MAX_STOP_STRINGS = 16  # stop strings: each one is searched for after every generated token
MAX_OPENAI_STOP_STRINGS = 4  # OpenAI's own limit, which vLLM's request types enforce (a 5th was a confusing 400)
MAX_STOP_CHARS = 1000  # characters of one stop string
MAX_TOKEN_LIST = 1024  # entries of logit_bias, stop_token_ids, bad_words (applied at every step)
MAX_ALLOWED_TOKEN_IDS = 262_144  # allowed_token_ids (KServe v2): at most a large vocabulary
MAX_ID_CHARS = 256  # a KServe v2 request id (echoed in responses, used in engine request ids and logs)
LOG_VALUE_CHARS = 200  # characters of one request-supplied value in a log line

INFLATE_SLICE = 256 * 1024  # decompressed bytes per step of `inflate` before yielding to the event loop


DEEP = f"nested more than {MAX_JSON_DEPTH} levels deep"


class JsonProblem(ValueError):
    """JSON a request carries that this server does not parse; the message is safe to return."""


class TooLarge(Exception):
    """A decompressed body over the limit; the caller answers 413."""


class OverCap(ValueError):
    """A top-level array of a JSON object with more items than its cap (`load_json`'s `caps`)."""

    def __init__(self, key: str, cap: int):
        super().__init__(f"'{key}' has more than {cap} items")
        self.key, self.cap = key, cap


def load_json(raw: bytes | str, caps: dict[str, int] | None = None) -> Any:
    """json.loads, refusing nesting deeper than MAX_JSON_DEPTH. A problem is a JsonProblem whose
    message completes "the body is ..." ("not valid JSON (...)", "nested more than 64 levels deep")
    and never carries the parser's exception text, which can name interpreter internals.

    `caps`: for a body that is a JSON object, the most items each named top-level array may have
    (e.g. {"messages": 2048}). Such an array is read item by item and an over-cap one is refused
    (OverCap) as soon as its cap is passed: refusing 100k chat messages then costs what reading 2049
    costs, not what building all 100k does (a tenth of a second of the event loop per request)."""
    try:
        text = raw.encode() if isinstance(raw, str) else _utf8(raw)
    except (UnicodeError, LookupError):
        raise JsonProblem("not valid JSON (not UTF-8 text)") from None
    if json_depth(text) > MAX_JSON_DEPTH:  # before parsing: the parser recurses once per level
        raise JsonProblem(DEEP)
    try:
        if caps:
            try:
                return _load_capped(text.decode("utf-8-sig"), caps)
            except _NotPlain:
                pass  # anything unusual: the standard parser decides, and words any error
        return json.loads(text)
    except RecursionError:  # not reached after the check above; kept so no input can make it a 500
        raise JsonProblem(DEEP) from None
    except json.JSONDecodeError as exc:
        raise JsonProblem(f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except OverCap:
        raise
    except ValueError:  # UnicodeDecodeError included
        raise JsonProblem("not valid JSON (not UTF-8 text)") from None


class _NotPlain(Exception):
    """`_load_capped` met something it leaves to json.loads (a syntax error, a body that is not an object)."""


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _load_capped(text: str, caps: dict[str, int]) -> dict[str, Any]:
    """A JSON object read member by member with the standard decoder (its scanner, its semantics:
    the last of duplicate keys wins), the arrays named in `caps` item by item."""
    reader = _CappedReader(text, caps)
    out, i = reader.members()
    if reader.ws(i) != len(text):
        raise _NotPlain()
    return out


class _CappedReader:
    def __init__(self, text: str, caps: dict[str, int]):
        self.text, self.caps = text, caps

    def ws(self, i: int) -> int:
        m = _WS.match(self.text, i)
        return m.end() if m else i

    def value_at(self, i: int) -> tuple[Any, int]:
        try:
            return _DECODER.raw_decode(self.text, i)
        except json.JSONDecodeError:
            raise _NotPlain() from None

    def after_item(self, i: int, close: str) -> tuple[bool, int]:
        """(whether another item follows, the index after the separator or the closing bracket)."""
        i = self.ws(i)
        if self.text.startswith(",", i):
            return True, self.ws(i + 1)
        if self.text.startswith(close, i):
            return False, i + 1
        raise _NotPlain()

    def capped_array(self, key: str, i: int, cap: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        i = self.ws(i + 1)
        if self.text.startswith("]", i):
            return items, i + 1
        more = True
        while more:
            if len(items) == cap:
                raise OverCap(key, cap)
            item, i = self.value_at(i)
            items.append(item)
            more, i = self.after_item(i, "]")
        return items, i

    def members(self) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        i = self.ws(0)
        if not self.text.startswith("{", i):
            raise _NotPlain()
        i = self.ws(i + 1)
        if self.text.startswith("}", i):
            return out, i + 1
        more = True
        while more:
            if not self.text.startswith('"', i):
                raise _NotPlain()
            key, i = self.value_at(i)
            i = self.ws(i)
            if not self.text.startswith(":", i):
                raise _NotPlain()
            i = self.ws(i + 1)
            cap = self.caps.get(key)
            if cap is not None and self.text.startswith("[", i):
                out[key], i = self.capped_array(key, i, cap)
            else:
                out[key], i = self.value_at(i)
            more, i = self.after_item(i, "}")
        return out, i


def _utf8(raw: bytes) -> bytes:
    # json.loads also takes UTF-16 and UTF-32 bytes; the depth scan reads UTF-8 bytes
    encoding = json.detect_encoding(raw)
    return raw if encoding in ("utf-8", "utf-8-sig") else raw.decode(encoding).encode()


# every byte but [ ] { } and the quote, for bytes.translate(None, delete=...)
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'[]{}"')


def json_depth(text: bytes) -> int:
    """The deepest nesting of JSON text (a scalar is 0), read from its bytes without parsing.

    All in C, linear in the size: escaped backslashes and quotes go first, then every byte but
    brackets and quotes; a byte is inside a string when an odd number of quotes precede it; the
    running sum of opening (+1) and closing (-1) brackets outside strings is the depth. Parsing
    first and walking the result costs seconds of Python for a body of a million small items, and
    the parser itself recurses once per level (a RecursionError past about a thousand). Splitting at
    the quotes instead costs a bytes object per string (0.2 s for 100k chat messages). Malformed
    JSON may measure wrong here; the parser then refuses it."""
    import numpy as np  # deferred: numpy comes with the serve extra (tritonclient, vLLM), not the CLI

    if b"\\" in text:  # most bodies have no escape at all: two scans saved
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = text.translate(None, _NOT_STRUCTURAL)
    if not kept:
        return 0
    codes = np.frombuffer(kept, dtype=np.uint8)
    quote = codes == ord('"')
    outside = (np.cumsum(quote, dtype=np.int32) & 1) == 0  # a closing quote counts as inside: not a bracket
    step = _depth_steps()[codes] * (outside & ~quote)
    return max(0, int(np.cumsum(step, dtype=np.int32).max()))  # int32: bodies are far below 2 GiB


@functools.cache
def _depth_steps() -> Any:
    """+1 for an opening bracket, -1 for a closing one, 0 for any other byte."""
    import numpy as np

    step = np.zeros(256, dtype=np.int8)
    step[[ord("["), ord("{")]] = 1
    step[[ord("]"), ord("}")]] = -1
    return step


async def inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    """A gzip or deflate body, decompressed to at most `limit` bytes (TooLarge past it).

    Decompression goes INFLATE_SLICE bytes at a time with a yield to the event loop between
    slices: a small compressed body can expand a thousandfold, and neither memory nor the loop
    may pay for that. `deflate` is the zlib format (RFC 9110). Concatenated gzip members are all
    read, as gzip.decompress does. Invalid data is a ValueError."""
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}[encoding]
    out = bytearray()
    pending = raw
    while pending:
        d = zlib.decompressobj(wbits)
        try:
            while True:
                out += d.decompress(pending, INFLATE_SLICE)
                pending = d.unconsumed_tail
                if len(out) > limit:
                    raise TooLarge()
                if d.eof or not pending:
                    break
                await asyncio.sleep(0)  # let other requests run between slices
            out += d.flush(INFLATE_SLICE)
        except zlib.error:
            raise ValueError(f"the body is not valid {encoding} data") from None
        if len(out) > limit:
            raise TooLarge()
        if not d.eof:
            raise ValueError(f"the body is not valid {encoding} data (it ends early)")
        pending = d.unused_data if encoding == "gzip" else b""
        if encoding == "deflate" and d.unused_data:
            raise ValueError("the body has bytes after the end of its deflate data")
    return bytes(out)


def log_safe(value: Any, limit: int = LOG_VALUE_CHARS) -> str:
    """Request-supplied text for a log line: control characters (newlines included) and other
    unprintable characters escaped, at most `limit` characters, so it can neither forge a line nor
    flood the log."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)[: limit * 2]
    cut = len(text) - limit
    text = text[:limit]
    safe = "".join(c if c.isprintable() and c != "\\" else _escape(c) for c in text)
    return safe + (f"...(+{cut} chars)" if cut > 0 else "")


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def short(value: Any, limit: int = 80) -> str:
    """A bounded repr of a request value for an error message (a refused value can be megabytes)."""
    if isinstance(value, (list, dict)) and len(value) > 64:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = repr(value[: limit + 1] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
