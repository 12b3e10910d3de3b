"""JSON strings with JSON Schema's string keywords: ``pattern``, ``format``, ``minLength``/``maxLength``.

Every keyword speaks about the *decoded* value, while the automaton reads the JSON text. So each
condition is first written over decoded characters, then mapped character by character to the
JSON encodings of those characters (``encode``): ``"`` only as ``\\"``, ``\\`` only as ``\\\\``,
control characters only escaped. A pattern can therefore never let a raw quote or a lone backslash
into the JSON text. Only one spelling per character is generated (the raw character where JSON
allows it, else its short escape or ``\\u00XX``), a subset of the encodings JSON allows, and the
lengths count decoded characters exactly (``\\uXXXX`` surrogate pairs are never generated, so one
escape is always one character).

``pattern`` is a search, as JSON Schema defines it (ECMA-262 ``RegExp.test``): it may match
anywhere in the value unless anchored with ``^``/``$``. ``^`` is supported at the start of the
pattern (of each top-level alternative, after leading look-arounds); anywhere else it is refused.
``$`` is supported anywhere (inside a group it is the condition "the value ends here").

Look-around (``(?=A)``, ``(?!A)``, ``(?<=B)``, ``(?<!B)``, anywhere, nested, inside repetitions) is
built exactly by ``dfa_ops.look_dfa``, over the decoded value, and the automaton is then mapped to
JSON text (``encode_dfa``); a look-behind inside a look-ahead (or the reverse) is refused by name.
Inside a negative look-around what a class, ``.`` or ``$`` matches is excluded from the value, so
there each stands for what *either* dialect matches (Python's ``$`` also before a final newline).
Subsets, documented where they are made: ``\\b``/``\\B`` see ASCII word and non-word neighbours
only (regex._boundary); ``\\p{..}`` keeps to the Basic Multilingual Plane (regex._category_ranges);
a search (not anchored at its start) with look-around whose exact automaton passes
SEARCH_EXACT_STATES construction states is read from the value's start instead.

When more than one condition applies (pattern and length bounds, pattern and format, two patterns
from ``allOf``), each is compiled to a byte automaton and the value's automaton is their
intersection (``dfa_ops.intersect``).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from llmserve.constraints.dfa_ops import LookTooLarge, intersect, look_dfa
from llmserve.constraints.errors import ConstraintError, no_string_left
from llmserve.constraints.limits import limits
from llmserve.constraints.regex import (
    MAX_CODEPOINT,
    SURROGATES,
    ByteDFA,
    TreeCache,
    compile_ast,
    literal,
    parse,
)

QUOTE = ("set", [(0x22, 0x22)])
# characters JSON lets stand for themselves inside a string
_RAW = [(0x20, 0x21), (0x23, 0x5B), (0x5D, SURROGATES[0] - 1), (SURROGATES[1] + 1, MAX_CODEPOINT)]
_SHORT = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
# any character, decoded: what an unconstrained string holds and what a search may skip over
ANY_CHAR = ("set", [(0, SURROGATES[0] - 1), (SURROGATES[1] + 1, MAX_CODEPOINT)])

# days that exist in every year (29 February left out: leap years are not regular enough to bother),
# of the years 0001-9999: RFC 3339 writes year 0 too, but Python's datetime (so jsonschema's format
# checker and pydantic) has no year 0, and a random-weight model answers "0000" one date in ten
_DATE = (
    r"(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-"
    r"((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
)
# Formats are written with few counted repetitions: a counted one costs an automaton state per
# count (``{1,200}`` alone is 200 states), and every use of the format in a schema copies them all
# (the unbounded forms below are 5-40 states where the counted ones were 200-500). Where a format
# bounds a length (RFC 1123 labels of at most 63 characters, RFC 5321 local parts of at most 64),
# the bound kept here is far inside it.
# RFC 1123 host name: labels of letters, digits and inner hyphens; here at most 10 characters each
_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,8}[a-zA-Z0-9])?"
_HOSTNAME = _LABEL + r"(\." + _LABEL + r"){0,3}"
# RFC 5321 dot-atom local part (atext subset), at most 33 characters; a domain ending in a TLD


def _letters_except(n: int, words: list[str]) -> str:
    """``n`` ASCII letters, in either case, other than ``words`` (lowercase, ``n`` letters each)."""
    if not words:
        return f"[a-zA-Z]{{{n}}}" if n else ""
    heads = sorted({w[0] for w in words})
    rest = "".join(c for c in "abcdefghijklmnopqrstuvwxyz" if c not in heads)
    branches = [f"[{rest}{rest.upper()}][a-zA-Z]{{{n - 1}}}" if n > 1 else f"[{rest}{rest.upper()}]"] if rest else []
    for c in heads:
        tail = [w[1:] for w in words if w[0] == c]
        if n > 1:
            branches.append(f"[{c}{c.upper()}]({_letters_except(n - 1, tail)})")
    return "|".join(branches)


# The domain as email-validator (pydantic's EmailStr) reads it: no "--" in a label (it refuses two
# characters then "--" unless valid Punycode), a top-level domain of letters other than the
# special-use names it refuses (arpa, local, onion, test; invalid and localhost are over 6 letters)
_MAIL_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9]|-[a-zA-Z0-9]){0,9}"
_MAIL_TLD = (
    f"[a-zA-Z]{{2,3}}|{_letters_except(4, ['arpa', 'test'])}|{_letters_except(5, ['local', 'onion'])}|[a-zA-Z]{{6}}"
)
_EMAIL = r"[a-zA-Z0-9_+-]{1,16}(\.[a-zA-Z0-9_+-]{1,16})?@(" + _MAIL_LABEL + r"\.){1,3}(" + _MAIL_TLD + ")"
# RFC 3986 ``scheme "://" reg-name path-abempty ["?" query] ["#" fragment]``; segments/query/
# fragment from pchar (less pct-encoded), so no quote, backslash, space, '%', '[' or ']' (which
# RFC 3986 allows only in an IP literal) is ever generated. The subset clients parse as a web URL:
# http(s) (pydantic's HttpUrl, the type most "uri" fields come from, refuses other schemes) and a
# host name whose last label starts with a letter (WHATWG's parser reads a numeric one as IPv4),
# no label with "--" (an "xn--" one must be valid Punycode)
_PCHAR = "a-zA-Z0-9._~!$&'()*+,;=:@-"
_WEB_HOST = r"([a-zA-Z0-9]+(-[a-zA-Z0-9]+)*\.)*[a-zA-Z][a-zA-Z0-9]*(-[a-zA-Z0-9]+)*"


def _uri(pchar: str) -> str:
    """Web URLs in the form WHATWG's parser (pydantic's HttpUrl) gives them back, so that a maxLength holds after
    it: a path that starts with "/" (it adds one), no "." or ".." segment (it resolves them), no "'" in the query
    (it escapes it)."""
    dotless = pchar.replace(".", "")
    segment = rf"([{dotless}][{pchar}]*|\.[{dotless}][{pchar}]*|\.\.[{pchar}]+)?"
    query = pchar.replace("'", "")
    return rf"https?://{_WEB_HOST}(/{segment})+(\?[/?{query}]*)?(#[/?{pchar}]*)?"


_URI = _uri(_PCHAR)
_IPV4 = r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# the full form only (eight groups): every generated value is a valid address, not every address
_IPV6 = r"[0-9a-fA-F]{1,4}(:[0-9a-fA-F]{1,4}){7}"
_HEX = "[0-9a-fA-F]"


def _base64(c62: str, c63: str) -> str:
    """Base64 (RFC 4648, padded) of ASCII bytes: pydantic's Base64Str decodes the bytes as UTF-8, which arbitrary
    bytes are not. A byte's high bit is 0, so each character of a 3-byte group has a bit that is 0 (the 1st: the
    32s bit, the 2nd: the 8s, the 3rd: the 2s); the alphabet is A-Z a-z 0-9 then ``c62`` ``c63``."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789" + c62 + c63

    def chars(keep: Callable[[int], bool]) -> str:
        return "[" + "".join(re.escape(c) for i, c in enumerate(alphabet) if keep(i)) + "]"

    first, second, third = chars(lambda i: i < 32), chars(lambda i: not i & 8), chars(lambda i: not i & 2)
    group = first + second + third + chars(lambda i: True)
    one = first + chars(lambda i: not i & 15) + "=="  # one byte: its low 2 bits, then zeros
    two = first + second + chars(lambda i: not i & 3) + "="  # two bytes: the second's low 4 bits, then zeros
    return f"({group})*({one}|{two})?"


def _uuid(version: str) -> str:
    """RFC 4122 UUIDs of ``version`` (a set of digits); the variant digit too, without which
    Python's uuid reads no version (pydantic's UUID1-5 check it)."""
    return rf"{_HEX}{{8}}-{_HEX}{{4}}-{version}{_HEX}{{3}}-[89abAB]{_HEX}{{3}}-{_HEX}{{12}}"


FORMATS = {
    "date": _DATE,
    "time": r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])",
    "date-time": _DATE + r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])",
    "email": _EMAIL,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "hostname": _HOSTNAME,
    "uri": _URI,
    # an absolute URI is also a valid reference and IRI (RFC 3987: every URI is an IRI)
    "uri-reference": _URI,
    "iri": _URI,
    "iri-reference": _URI,
    # RFC 6570 literals are RFC 3986's characters less "'" (and a template with no expression is a
    # valid template)
    "uri-template": _uri(_PCHAR.replace("'", "")),
    "relative-uri": r"[a-zA-Z0-9._~-]+(/[a-zA-Z0-9._~-]+)*",
    "idn-email": _EMAIL,
    "idn-hostname": _HOSTNAME,
    # RFC 6901: "/"-prefixed reference tokens, "~" only as "~0" or "~1"
    "json-pointer": r"(/([a-zA-Z0-9_.-]|~[01])*)*",
    # the draft allows any non-negative integer first; no zero inside it here, since ``jsonschema``
    # (4.26) refuses a digit after a '0' ("7092#"), and answers must validate there too
    "relative-json-pointer": r"(0|[1-9]{1,3})(#|(/([a-zA-Z0-9_.-]|~[01])*)*)",
    # regular expressions made of plain characters only: valid in every dialect
    "regex": r"[a-zA-Z0-9 _-]*",
    # ISO 8601 durations of one unit (P3D, P2W, PT5M): a subset of RFC 3339's duration
    "duration": r"P([1-9][0-9]{0,3}[DWMY]|T[1-9][0-9]{0,3}[HMS])",
}
# Formats pydantic writes into the schemas of its types (what openai's parse() sends): not JSON
# Schema's, so validators leave them unchecked and any string validates; the strings here are the
# subset pydantic's own types read back. A network is written as one address (a network of one host).
PYDANTIC_FORMATS = {
    "ipvanyaddress": f"{_IPV4}|{_IPV6}",
    "ipvanyinterface": f"{_IPV4}(/(3[0-2]|[12]?[0-9]))?|{_IPV6}(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?",
    "ipvanynetwork": f"{_IPV4}|{_IPV6}",
    "ipv4interface": f"{_IPV4}(/(3[0-2]|[12]?[0-9]))?",
    "ipv6interface": f"{_IPV6}(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?",
    "ipv4network": _IPV4,
    "ipv6network": _IPV6,
    "uuid1": _uuid("1"),
    "uuid3": _uuid("3"),
    "uuid4": _uuid("4"),
    "uuid5": _uuid("5"),
    "name-email": _EMAIL,
    # bytes: pydantic reads the string's UTF-8 encoding, so maxLength counts bytes there; in ASCII
    # characters and bytes agree
    "binary": r"[ -~]*",
    # Base64Bytes/Base64Str and their URL-safe twins
    "base64": _base64("+", "/"),
    "base64url": _base64("-", "_"),
}
FORMATS.update(PYDANTIC_FORMATS)
FORMATS["byte"] = FORMATS["base64"]  # OpenAPI's name for base64-encoded characters
# pydantic-extra-types' Color: it reads "#rrggbb" (and names, rgb(), hsl()); "#rrggbb" is a CSS color everywhere
FORMATS["color"] = "#[0-9a-fA-F]{6}"
BASE64_FORMATS = ("base64", "base64url", "byte")
# Formats whose values the schema does not say enough about to generate one its type reads back: refused by name
# rather than left unconstrained (an answer would then be refused by the client's own model)
REFUSED_FORMATS = {
    "multi-host-uri": "pydantic's DSN types (PostgresDsn, MongoDsn, NatsDsn, ...) write it, and it does not say "
    "which URL schemes the field takes, so no answer is known to read back; declare the field as a str (with a "
    "pattern for the form you need)",
}
# every format JSON Schema 2019-09/2020-12 defines is above, and pydantic's. Any other name (int32, password,
# ...) is outside that vocabulary: in 2019-09/2020-12 ``format`` only annotates unless a
# format-assertion vocabulary says otherwise, and validators (``jsonschema`` among them) ignore
# formats they do not know, so an unknown format leaves the string unconstrained (``format_ast``
# returns None). A decision, documented in jsonschema.py and benchmarks/constraints/README.md.


_NO_SHORT = [cp for cp in range(0x20) if cp not in _SHORT]  # controls written \u00XX
_ALL_NO_SHORT = (
    "cat",
    [
        literal("u00"),
        (
            "alt",
            [
                (
                    "cat",
                    [("set", [(0x30, 0x30)]), ("set", [(0x30, 0x37), (0x62, 0x62), (0x65, 0x66)])],
                ),  # 00-07 0b 0e 0f
                ("cat", [("set", [(0x31, 0x31)]), ("set", [(0x30, 0x39), (0x61, 0x66)])]),  # 10-1f
            ],
        ),
    ],
)


def _encode_set(ranges: list[tuple[int, int]]):
    """The JSON encodings of the characters in ``ranges``: raw where JSON allows, else one escape
    (kept compact: one backslash, then a set of escape letters or ``u00`` and hex digits)."""
    return _encode_ranges(tuple(ranges))


@lru_cache(maxsize=4096)
def _encode_ranges(ranges: tuple[tuple[int, int], ...]):
    """``_encode_set``, built once per set (a schema's patterns repeat the same few classes
    thousands of times; the AST it returns is shared, never mutated)."""

    def has(cp: int) -> bool:
        return any(lo <= cp <= hi for lo, hi in ranges)

    raw = []
    for lo, hi in ranges:
        for rlo, rhi in _RAW:
            a, b = max(lo, rlo), min(hi, rhi)
            if a <= b:
                raw.append((a, b))
    letters = [(ord(_SHORT[cp][1]), ord(_SHORT[cp][1])) for cp in sorted(_SHORT) if has(cp)]
    after: list[tuple] = [("set", sorted(letters))] if letters else []
    if all(has(cp) for cp in _NO_SHORT):
        after.append(_ALL_NO_SHORT)
    else:
        after += [literal(f"u{cp:04x}") for cp in _NO_SHORT if has(cp)]
    branches: list[tuple] = [("set", raw)] if raw else []
    if after:
        branches.append(("cat", [literal("\\"), after[0] if len(after) == 1 else ("alt", after)]))
    if not branches:
        return ("set", [])
    return branches[0] if len(branches) == 1 else ("alt", branches)


def encode(node):
    """An AST over decoded characters -> the AST of their JSON-string encodings (no quotes)."""
    kind = node[0]
    if kind == "set":
        return _encode_set(node[1])
    if kind in ("cat", "alt"):
        return (kind, [encode(c) for c in node[1]])
    if kind == "rep":
        return ("rep", encode(node[1]), node[2], node[3])
    if kind == "dfa":
        return ("dfa", encode_dfa(node[1]))
    # a JSON value's own nodes (a string that holds JSON text): their commas need no escape
    if kind == "list":
        return ("list", encode(node[1]), node[2], node[3])
    if kind == "members":
        return ("members", [(req, encode(child)) for req, child in node[1]], node[2])
    raise AssertionError(kind)


def _escape_of(b: int) -> str | None:
    """The JSON spelling of the ASCII byte ``b`` when it cannot stand for itself (as _encode_set
    writes it), else None. Bytes of multi-byte characters always stand for themselves."""
    if b >= 0x80 or (0x20 <= b <= 0x7F and b not in (0x22, 0x5C)):
        return None
    return _SHORT.get(b, f"\\u{b:04x}")


def encode_dfa(dfa: ByteDFA) -> ByteDFA:
    """An automaton over the UTF-8 of decoded values -> the automaton of their JSON-string
    encodings: each transition on a byte JSON must escape becomes a path spelling its escape (a
    state per escape prefix, shared by the escapes that leave one state). Cached on the automaton."""
    cached = dfa.__dict__.get("_json")
    if cached is not None:
        return cached
    table = [list(map(int, row)) for row in np.asarray(dfa.table)]
    accept = [bool(a) for a in dfa.accept]
    n = len(table)
    for q in range(n):
        prefixes: dict[str, int] = {}
        escaped = [(b, table[q][b], esc) for b in range(0x80) if (esc := _escape_of(b)) is not None]
        for b, _, _ in escaped:
            table[q][b] = -1  # raw: never (the backslash, one of them, starts every escape below)
        for _, to, esc in escaped:
            if to < 0:
                continue
            at = q
            for k in range(1, len(esc)):
                nxt = prefixes.get(esc[:k])
                if nxt is None:
                    nxt = prefixes[esc[:k]] = len(table)
                    table.append([-1] * 256)
                    accept.append(False)
                    table[at][ord(esc[k - 1])] = nxt
                at = nxt
            table[at][ord(esc[-1])] = to
    out = compile_ast(("dfa", ByteDFA(np.array(table, dtype=np.int32), np.array(accept, dtype=np.uint8), dfa.start)))
    object.__setattr__(dfa, "_json", out)
    return out


_ANY = ("rep", ANY_CHAR, 0, None)


def _at_start(node):
    """``node`` read at the value's start, where a ``^`` holds: the ``^`` that begin it (of each
    alternative, of its first item, inside an optional group, ``^(?:^a|b)``, ``^(^x:)?y``) dropped.
    Not inside a repetition of more than one: its later rounds do not start at the start."""
    kind = node[0]
    if kind == "anchor" and node[1] == "^":
        return ("cat", [])
    if kind == "alt":
        return ("alt", [_at_start(b) for b in node[1]])
    if kind == "cat" and node[1]:
        return ("cat", [_at_start(node[1][0]), *node[1][1:]])
    if kind == "rep" and node[3] == 1:
        return ("rep", _at_start(node[1]), node[2], node[3])
    return node


def _nullable(node) -> bool:
    """Whether ``node`` matches the empty string, holding no assertion (look-around, anchor)."""
    kind = node[0]
    if kind == "cat":
        return all(_nullable(c) for c in node[1])
    if kind == "alt":
        return any(_nullable(c) for c in node[1]) and not any(_has(c, "look") or _has(c, "anchor") for c in node[1])
    if kind == "rep":
        return not (_has(node[1], "look") or _has(node[1], "anchor")) and (node[2] == 0 or _nullable(node[1]))
    return False


def _trim(node, end: int):
    """``node`` as it may be read next to a search's ``.*`` (at its start, ``end`` 0, or end, -1):
    less the items there that may match nothing (``.*a*`` is ``.*``), and a repetition there
    repeated its least number of times (``.*a{2,}`` is ``.*aa``). Exact, and fewer automaton states."""
    if _nullable(node):
        return ("cat", [])
    if node[0] == "rep" and not (_has(node[1], "look") or _has(node[1], "anchor")):
        return ("rep", node[1], node[2], node[2])
    if node[0] != "cat":
        return node
    items = list(node[1])
    while items and _nullable(items[end]):
        items.pop(end)
    if items:
        items[end] = _trim(items[end], end)
    return ("cat", items)


def _with_left(node, search: bool = True):
    """``node`` as a search from the left: anything may come first unless it starts with ``^``
    (possibly after look-arounds, which match no character: ``(?!x)^a`` is ``^(?!x)a``).
    ``search`` False: as if it started with ``^`` (a subset of the search)."""
    kind = node[0]
    if kind == "anchor" and node[1] == "^":
        return ("cat", [])
    if kind == "alt":
        return ("alt", [_with_left(b, search) for b in node[1]])
    if kind == "cat" and node[1]:
        items = node[1]
        looks = 0
        while looks < len(items) and items[looks][0] == "look":
            looks += 1
        if looks < len(items) and items[looks][0] == "anchor" and items[looks][1] == "^":
            return ("cat", [*items[:looks], _at_start(("cat", items[looks + 1 :]))])
        if items[0][0] in ("cat", "alt"):
            return ("cat", [_with_left(items[0], search), *items[1:]])
    return ("cat", [_ANY, _trim(node, 0)]) if search else _at_start(node)


def _with_right(node):
    """``node`` as a search to the right: anything may follow unless it ends with ``$``.
    Alternatives that end open share one ``.*`` after them: ``(?:a|b).*``, the same values as
    ``a.*|b.*``, whose automaton keeps one place in the value after a match for each alternative
    that matched, so its subsets multiply (an operating-system name pattern with seven such
    alternatives: 238,388 subsets, 1.7 s, minimised to 220 states; a list of 128 zone names: past
    the compile budget)."""
    kind = node[0]
    if kind == "anchor" and node[1] == "$":
        return ("cat", [])
    if kind == "alt":
        open_ = [b for b in node[1] if not _has(b, ("anchor", "$")) and not _has(b, "look")]
        if len(open_) < 2:
            return ("alt", [_with_right(b) for b in node[1]])
        shared = ("cat", [("alt", [_trim(b, -1) for b in open_]), _ANY])
        rest = [_with_right(b) for b in node[1] if _has(b, ("anchor", "$")) or _has(b, "look")]
        return ("alt", [shared, *rest]) if rest else shared
    if kind == "cat" and node[1]:
        last = node[1][-1]
        if last[0] == "anchor" and last[1] == "$":
            return ("cat", node[1][:-1])
        if last[0] in ("cat", "alt"):
            return ("cat", [*node[1][:-1], _with_right(last)])
    return ("cat", [_trim(node, -1), _ANY])


def _has(node, kind: str | tuple) -> bool:
    """Whether ``node`` holds a ``kind`` node (or the node ``kind``) outside look-around (whose
    anchors are conditions of their own, dfa_ops.look_dfa)."""
    if node[0] == kind or node == kind:
        return True
    if node[0] in ("cat", "alt"):
        return any(_has(c, kind) for c in node[1])
    if node[0] == "rep":
        return _has(node[1], kind)
    return False


# A search (a pattern not anchored at its start) with look-around is built exactly only while its
# subset construction stays under this many states: the automaton of ``.*`` before a long counted
# repetition and a ``\\b`` (a URL pattern: 6000 states, seconds in Python) is replaced by that of
# the pattern anchored at the value's start, a subset (every value matching there matches the
# search) and a much smaller automaton.
SEARCH_EXACT_STATES = 1000


def pattern_ast(pattern: str, started: float | None = None, *, excluded: bool = False):
    """The decoded values ``pattern`` finds a match in (JSON Schema: a search unless anchored).
    With look-around (``(?=``, ``(?!``, ``(?<=``, ``(?<!``, ``\\b``, ``\\B``) an ("dfa", ...) node
    over the values' UTF-8, built by dfa_ops.look_dfa (within the compile time budget counted from
    ``started``, default now), which ``encode`` maps to JSON text like any other node.
    ``excluded``: the caller excludes these values (``not``, a ``oneOf`` kept apart), so the reading
    is a superset, never a subset: what either dialect matches (``regex.parse``), and no cheaper
    reading from the value's start for a large search (refused instead)."""
    if not isinstance(pattern, str):
        raise ConstraintError(f"json_schema: pattern must be a string, got {pattern!r}")
    tree, node, plain = _SEARCHES.get((pattern, excluded), lambda: _search(pattern, excluded), lambda found: found[1])
    if plain:
        return node
    key = (pattern, excluded, limits())
    found = _LOOK_CACHE.get(key)
    if found is not None:
        _LOOK_CACHE.move_to_end(key)
        return found
    found = ("dfa", _look_automaton(pattern, tree, node, started, excluded))
    _LOOK_CACHE[key] = found
    if len(_LOOK_CACHE) > LOOK_CACHE_SIZE:
        _LOOK_CACHE.popitem(last=False)
    return found


def _search(pattern: str, excluded: bool) -> tuple[Any, Any, bool]:
    """``pattern``'s tree, the tree of the search it stands for, and whether that search is plain
    (no look-around or anchor left in it, so it is the answer). Kept per pattern as its tree is
    (``_SEARCHES``, as ``regex.parse`` does): a schema names the same patterns many times."""
    tree = parse(pattern, schema=True, excluded=excluded)
    node = _with_right(_with_left(tree))
    if _has(node, ("anchor", "^")):
        raise ConstraintError(
            f"json_schema: pattern {pattern!r}: '^' and '$' are supported only at the start and end of the pattern "
            "(a '$' elsewhere is read as the end of the value; a '^' elsewhere is refused)"
        )
    return tree, node, not _has(node, "look") and not _has(node, "anchor")


_SEARCHES = TreeCache()


# A schema names the same pattern many times (each use, its 'not', patternProperties' checks): its
# look-around automaton is built once per process (the most recent LOOK_CACHE_SIZE patterns kept).
LOOK_CACHE_SIZE = 256
_LOOK_CACHE: OrderedDict[tuple, tuple] = OrderedDict()


def _look_automaton(pattern: str, tree, node, started: float | None, excluded: bool = False) -> ByteDFA:
    at_start = _with_right(_with_left(tree, search=False))
    try:
        try:
            cap = None if at_start == node or excluded else SEARCH_EXACT_STATES
            return look_dfa(node, ANY_CHAR, started=started, max_built=cap)
        except LookTooLarge:
            return look_dfa(at_start, ANY_CHAR, started=started)
    except ConstraintError as exc:
        if "matches no string" in exc.message:
            raise ConstraintError(f"json_schema: no string matches pattern {pattern!r}") from None
        if "(limit: " in exc.message:  # a limit (budget_error): named as it is
            raise
        raise ConstraintError(f"json_schema: pattern {pattern!r}: {exc.message}") from None


def split_lookaheads(pattern: str) -> tuple[str, list[str], list[str]]:
    """``^(?=A)(?!B)rest`` -> (``^rest``, [``^(?:A)``], [``^(?:B)``]): look-aheads at the anchored
    start of a pattern, as patterns the value must match (``(?=``) or must not match (``(?!``);
    the rest unchanged. Look-around anywhere else is left in ``rest`` (and refused by the parser)."""
    if not pattern.startswith("^("):
        return pattern, [], []
    i = 1
    must: list[str] = []
    must_not: list[str] = []
    while pattern.startswith(("(?=", "(?!"), i):
        depth, j, in_class = 0, i, False
        while j < len(pattern):
            c = pattern[j]
            if c == "\\":
                j += 2
                continue
            if in_class:
                in_class = c != "]"
            elif c == "[":
                in_class = True
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        if j >= len(pattern):
            return pattern, [], []  # unbalanced: the parser says so
        (must if pattern[i + 2] == "=" else must_not).append(f"^(?:{pattern[i + 3 : j]})")
        i = j + 1
    return "^" + pattern[i:], must, must_not


def format_ast(fmt: Any):
    """The decoded values of ``fmt`` (a subset for the formats marked so above), or None for a
    format this module does not know: an annotation, no constraint (see FORMATS)."""
    if not isinstance(fmt, str):
        raise ConstraintError(f"json_schema: format must be a string, got {fmt!r}")
    if fmt in REFUSED_FORMATS:
        raise ConstraintError(f"json_schema: format {fmt!r} is not supported: {REFUSED_FORMATS[fmt]}")
    if fmt not in FORMATS:
        return None
    return parse(FORMATS[fmt])


def string_ast(
    patterns: list[str],
    fmt: str | None,
    lo: int,
    hi: int | None,
    started: float | None = None,
    memo: dict | None = None,
):
    """A JSON string (quotes included) whose decoded value matches every pattern (as a search), the
    format if any, and has ``lo`` to ``hi`` characters (``hi`` None: unbounded). ``started``: when
    the compile whose time budget this shares began (default now). ``memo``: one conversion's
    strings by their conditions (the same pattern with the same bounds recurs across a schema's
    properties and definitions, thousands of times in large ones: built once, the tree shared);
    only successes are kept, so a refusal says the same every time."""
    if lo < 0 or (hi is not None and hi < lo):
        raise ConstraintError(f"json_schema: bad minLength/maxLength ({lo}, {hi})")
    # kept only for conditions of the right types (anything else is refused by name when built)
    keyed = memo is not None and all(isinstance(p, str) for p in patterns) and (fmt is None or isinstance(fmt, str))
    key = (tuple(patterns), fmt, lo, hi, limits()) if keyed else None
    found = memo.get(key) if memo is not None and key is not None else None
    if found is not None:
        return found
    out = _string_ast(patterns, fmt, lo, hi, started)
    if memo is not None and key is not None:
        memo[key] = out
    return out


def _string_ast(patterns: list[str], fmt: str | None, lo: int, hi: int | None, started: float | None):
    """``string_ast`` built."""
    conditions = [pattern_ast(p, started) for p in patterns]
    if fmt is not None:
        known = format_ast(fmt)
        if known is not None:
            conditions.append(known)
    if lo > 0 or hi is not None or not conditions:
        conditions.append(("rep", ANY_CHAR, lo, hi))
    bodies = [encode(c) for c in conditions]
    if len(bodies) == 1:
        return ("cat", [QUOTE, bodies[0], QUOTE])
    started = time.monotonic() if started is None else started
    try:
        dfa = intersect([compile_ast(b, started=started) for b in bodies], started=started)
    except ConstraintError as exc:
        if no_string_left(exc):
            raise ConstraintError(
                f"json_schema: no string satisfies pattern {patterns}, format {fmt!r} and length {lo}..{hi} together"
            ) from None
        raise
    return ("cat", [QUOTE, ("dfa", dfa), QUOTE])
