"""String formats (``schema_strings.FORMATS``): every generated value is valid for its format, checked
by ``jsonschema``'s format checker where it has one for the format and by the RFC's rules written
out here where it does not (``uri`` and ``hostname`` need packages this environment lacks), texts
the format refuses are refused by the automaton, and each format stays small: a format is copied
into the automaton at every use, so its size multiplies across a schema (issue #17, the corpus's
"more than 20000 automaton states" refusals)."""

from __future__ import annotations

import json
import random
import re
import urllib.parse

import jsonschema
import pytest
from support.automata import steered_walk

from llmserve.constraints.schema_strings import FORMATS, string_ast
from llmserve.constraints.spec import ConstraintSpec

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
# RFC 3986 section 2: the characters a URI may hold (unreserved, reserved, '%')
_URI_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:/?#[]@!$&'()*+,;=%")


def _rfc3986_uri(value: str) -> bool:
    """The RFC 3986 rules the generated URIs could break: allowed characters, a scheme, at most one
    '#', brackets only around an IP literal host, a numeric port."""
    if not set(value) <= _URI_CHARS or value.count("#") > 1:
        return False
    if not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*", value.split(":", 1)[0]):
        return False
    parts = urllib.parse.urlsplit(value)
    if "[" in value.replace(parts.netloc, "", 1) or "]" in value.replace(parts.netloc, "", 1):
        return False
    try:
        parts.port  # noqa: B018 - raises on a non-numeric port
    except ValueError:
        return False
    return True


def _rfc1123_hostname(value: str) -> bool:
    labels = value.split(".")
    return len(value) <= 253 and all(re.fullmatch(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?", x) for x in labels)


_OWN_CHECKS = {
    "uri": _rfc3986_uri,
    "uri-reference": _rfc3986_uri,
    "iri": _rfc3986_uri,
    "iri-reference": _rfc3986_uri,
    # RFC 6570 section 2.1: a literal is any URI character but "'" and '%' outside pct-encoding
    "uri-template": lambda v: _rfc3986_uri(v) and "'" not in v and "%" not in v,
    "hostname": _rfc1123_hostname,
    "idn-hostname": _rfc1123_hostname,
    # RFC 5321 4.5.3.1: a local part of at most 64 octets, a domain of at most 255
    "email": lambda v: v.count("@") == 1 and len(v.split("@")[0]) <= 64 and _rfc1123_hostname(v.split("@")[1]),
    "idn-email": lambda v: v.count("@") == 1 and len(v.split("@")[0]) <= 64 and _rfc1123_hostname(v.split("@")[1]),
    "regex": lambda v: re.compile(v) is not None,
}


def walk(dfa, rng: random.Random, budget: int) -> bytes:
    return steered_walk(dfa, rng, budget, stop=0.1)


def dfa_of(fmt: str):
    return ConstraintSpec("json_schema", {"type": "string", "format": fmt}).to_dfa()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_generated_value_is_valid_for_its_format(fmt):
    assert fmt in CHECKER.checkers or fmt in _OWN_CHECKS or fmt in ("duration", "relative-uri")
    dfa = dfa_of(fmt)
    rng = random.Random(fmt)
    for _ in range(80):
        value = json.loads(walk(dfa, rng, 160))
        if fmt in CHECKER.checkers:
            CHECKER.check(value, fmt)
        if fmt in _OWN_CHECKS:
            assert _OWN_CHECKS[fmt](value), (fmt, value)


@pytest.mark.parametrize(
    ("fmt", "valid", "invalid"),
    [
        ("uri", ["https://example.com/a/b?x=1&y=2#top", "urn://x", "ftp://h.example/"], []),
        ("uri", [], ["http://a b", "http://h/a#b#c", "http://h:port/", "a:[x", "//no-scheme", "http://h/%41"]),
        ("uri-template", ["http://example.com/x"], ["http://example.com/it's"]),
        ("hostname", ["example.com", "a-b.c9", "x"], ["-a.com", "a-.com", "a..b", "a_b.com", "a" * 11]),
        ("email", ["jo.e+x@mail.example.org", "a_b@x.io"], ["a@b", "@x.com", "a b@x.com", "a@-x.com"]),
        ("json-pointer", ["", "/a/0/~0~1", "/"], ["a/b", "/~2", "/a~"]),
        ("relative-json-pointer", ["0", "1#", "12/a/~1"], ["-1", "01", "#"]),
        ("regex", ["", "ab c_d-e"], ["a(b", "[x]", "a*"]),
        # no year 0: Python's datetime (jsonschema's checker, pydantic) refuses it
        ("date", ["0001-01-01", "0999-12-31", "2024-02-28", "9999-12-31"], ["0000-01-01", "2024-02-30", "999-01-01"]),
        ("date-time", ["0010-06-30T23:59:59.5+01:00"], ["0000-02-28T10:27:10Z", "2024-04-31T00:00:00Z"]),
    ],
)
def test_format_generates_the_valid_examples_and_refuses_the_others(fmt, valid, invalid):
    """``invalid``: texts the format refuses, or (``%41``, ``a*``) valid ones outside the subset."""
    dfa = dfa_of(fmt)
    for value in valid:
        assert dfa.matches(json.dumps(value).encode()), value
        if fmt in CHECKER.checkers:
            CHECKER.check(value, fmt)
        if fmt in _OWN_CHECKS:
            assert _OWN_CHECKS[fmt](value)
    for value in invalid:
        assert not dfa.matches(json.dumps(value).encode()), value


def test_formats_stay_small_so_that_many_uses_fit_the_state_limit():
    """The counted repetitions they used to hold cost 200-500 states a use; a schema with a few
    dozen uri/email/json-pointer properties then passed 20,000 states."""
    from llmserve.constraints.regex import compile_ast

    sizes = {fmt: compile_ast(string_ast([], fmt, 0, None)).num_states for fmt in FORMATS}
    assert max(sizes.values()) <= 120, sizes
    assert all(sizes[f] <= 12 for f in ("uri", "uri-reference", "iri", "json-pointer", "regex")), sizes
