"""String formats (``schema_strings.FORMATS``): every generated value is valid for its format, checked
by ``jsonschema``'s format checker where it has one for the format and by the RFC's rules written
out here where it does not (``uri`` and ``hostname`` need packages this environment lacks), texts
the format refuses are refused by the automaton, and each format stays small: a format is copied
into the automaton at every use, so its size multiplies across a schema (issue #17, the corpus's
"more than 20000 automaton states" refusals)."""

from __future__ import annotations

import base64
import json
import random
import re
import urllib.parse

import jsonschema
import pytest
from support.automata import steered_walk

from llmserve.constraints.schema_strings import FORMATS, PYDANTIC_FORMATS, string_ast
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
    "byte": lambda v: base64.b64decode(v, validate=True).isascii(),
    "color": lambda v: re.fullmatch("#[0-9a-fA-F]{6}", v) is not None,
}


def _pydantic_reads(typ):
    from pydantic import TypeAdapter

    adapter = TypeAdapter(typ)
    return lambda v: adapter.validate_python(v) is not None


def _pydantic_types() -> dict:
    """The types whose schemas name each of PYDANTIC_FORMATS (and the web URL "uri" fields come from)."""
    import ipaddress
    import uuid

    import pydantic

    return {
        "ipvanyaddress": pydantic.IPvAnyAddress,
        "ipvanyinterface": pydantic.IPvAnyInterface,
        "ipvanynetwork": pydantic.IPvAnyNetwork,
        "ipv4interface": ipaddress.IPv4Interface,
        "ipv6interface": ipaddress.IPv6Interface,
        "ipv4network": ipaddress.IPv4Network,
        "ipv6network": ipaddress.IPv6Network,
        "uuid1": pydantic.UUID1,
        "uuid3": pydantic.UUID3,
        "uuid4": pydantic.UUID4,
        "uuid5": pydantic.UUID5,
        "name-email": pydantic.NameEmail,
        "binary": bytes,
        # the str types: the decoded bytes must be UTF-8 too
        "base64": pydantic.Base64Str,
        "base64url": pydantic.Base64UrlStr,
        "uuid": uuid.UUID,
        "email": pydantic.EmailStr,
        "uri": pydantic.HttpUrl,
        "date": __import__("datetime").date,
        "date-time": __import__("datetime").datetime,
        "time": __import__("datetime").time,
        "duration": __import__("datetime").timedelta,
    }


for _fmt in PYDANTIC_FORMATS:
    _OWN_CHECKS[_fmt] = lambda v, f=_fmt: _pydantic_reads(_pydantic_types()[f])(v)


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
        ("uri", ["https://example.com/a/b?x=1&y=2#top", "http://h.example/", "http://localhost/", "http://h/..a"], []),
        # valid, but not as WHATWG's parser (pydantic's HttpUrl) gives them back: it adds the "/" of an empty path,
        # resolves "." and ".." segments and escapes "'" in a query, so a maxLength would not hold after it
        ("uri", [], ["http://localhost", "https://h.example?q", "http://h/./a", "http://h/a/..", "http://h/?it's"]),
        ("uri", [], ["http://a b", "http://h/a#b#c", "http://h:port/", "a:[x", "//no-scheme", "http://h/%41"]),
        # valid URIs outside the subset: schemes other than http(s), a last label read as IPv4
        ("uri", [], ["urn://x", "ftp://h.example/", "http://a.b.4/", "http://xn--zz.com/"]),
        ("ipvanyinterface", ["10.0.0.1/24", "1:2:3:4:5:6:7:8/64", "10.0.0.1"], ["10.0.0.1/33", "10.0.0.256"]),
        ("uuid4", ["123e4567-e89b-42d3-a456-426614174000"], ["123e4567-e89b-12d3-a456-426614174000"]),
        ("uri-template", ["http://example.com/x"], ["http://example.com/it's"]),
        ("hostname", ["example.com", "a-b.c9", "x"], ["-a.com", "a-.com", "a..b", "a_b.com", "a" * 11]),
        ("email", ["jo.e+x@mail.example.org", "a_b@x.io", "a@b-c.tester"], ["a@b", "@x.com", "a b@x.com", "a@-x.com"]),
        # valid addresses email-validator (pydantic's EmailStr) refuses: "--" after two characters,
        # invalid Punycode, special-use domains
        ("email", [], ["a@ab--cd.com", "a@xn--zz.com", "a@corp.local", "a@x.TEST", "a@x.onion", "a@in.arpa"]),
        ("json-pointer", ["", "/a/0/~0~1", "/"], ["a/b", "/~2", "/a~"]),
        ("relative-json-pointer", ["0", "1#", "12/a/~1"], ["-1", "01", "#"]),
        ("regex", ["", "ab c_d-e"], ["a(b", "[x]", "a*"]),
        # no year 0: Python's datetime (jsonschema's checker, pydantic) refuses it
        ("date", ["0001-01-01", "0999-12-31", "2024-02-28", "9999-12-31"], ["0000-01-01", "2024-02-30", "999-01-01"]),
        ("date-time", ["0010-06-30T23:59:59.5+01:00"], ["0000-02-28T10:27:10Z", "2024-04-31T00:00:00Z"]),
        # base64 of ASCII bytes only (Base64Str decodes them as UTF-8), padded
        ("base64", ["", "aGk=", "aGkh", "YQ==", "fn5+"], ["aGk", "a===", "/w==", "gA==", "aGk=aGk="]),
        ("base64url", ["aGk=", "fn5-"], ["fn5+", "aGk"]),
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


@pytest.mark.parametrize("fmt", sorted(_pydantic_types()))
def test_pydantic_reads_back_every_value_for_its_types_schema(fmt):
    """openai's parse() sends the schema pydantic writes for a model and reads the answer back with
    it: every generated value must be one the field's type accepts (HttpUrl takes only http(s))."""
    from pydantic import TypeAdapter

    typ = _pydantic_types()[fmt]
    schema = TypeAdapter(typ).json_schema()
    assert schema.get("format") == fmt, schema
    dfa = ConstraintSpec("json_schema", schema).to_dfa()
    rng = random.Random(fmt)
    for _ in range(80):
        TypeAdapter(typ).validate_python(json.loads(walk(dfa, rng, 160)))


def test_bytes_with_a_max_length_read_back_within_it():
    """pydantic counts a bytes field's maxLength in UTF-8 bytes, the schema in characters."""
    from typing import Annotated

    from pydantic import Field, TypeAdapter

    typ = Annotated[bytes, Field(max_length=5)]
    dfa = ConstraintSpec("json_schema", TypeAdapter(typ).json_schema()).to_dfa()
    rng = random.Random(5)
    for _ in range(80):
        TypeAdapter(typ).validate_python(json.loads(walk(dfa, rng, 160)))


@pytest.mark.parametrize("length", [12, 20, 25])
def test_urls_with_a_max_length_hold_it_after_pydantics_normalization(length):
    """HttpUrl/AnyUrl with Field(max_length=N) check the length of the URL as WHATWG's parser writes it back."""
    from typing import Annotated

    from pydantic import AnyUrl, Field, HttpUrl, TypeAdapter

    for typ in (Annotated[HttpUrl, Field(max_length=length)], Annotated[AnyUrl, Field(max_length=length)]):
        adapter = TypeAdapter(typ)
        dfa = ConstraintSpec("json_schema", adapter.json_schema()).to_dfa()
        rng = random.Random(length)
        for _ in range(150):
            adapter.validate_json(steered_walk(dfa, rng, 80, stop=0.05))


def test_base64_with_a_min_length_holds_it_decoded_too():
    """Annotated[Base64Bytes, Field(min_length=N)] counts decoded bytes, the `= Field(...)` form the text: both hold
    where the maximum leaves room (and the text's bounds alone where it does not)."""
    from typing import Annotated

    from pydantic import Base64Bytes, Base64Str, BaseModel, Field, TypeAdapter

    class Text(BaseModel):
        b: Base64Bytes = Field(min_length=8, max_length=8)

    adapters = [
        TypeAdapter(Annotated[Base64Bytes, Field(min_length=8)]),
        TypeAdapter(Annotated[Base64Str, Field(min_length=4, max_length=40)]),
        TypeAdapter(Text),
    ]
    rng = random.Random(8)
    for adapter in adapters:
        dfa = ConstraintSpec("json_schema", adapter.json_schema()).to_dfa()
        for _ in range(80):
            adapter.validate_json(walk(dfa, rng, 80))


def test_a_format_whose_values_the_schema_leaves_open_is_refused_by_name():
    from pydantic import MongoDsn, PostgresDsn, TypeAdapter

    from llmserve.constraints import ConstraintError

    for typ in (PostgresDsn, MongoDsn):
        with pytest.raises(ConstraintError, match="format 'multi-host-uri' is not supported: pydantic's DSN types"):
            ConstraintSpec("json_schema", TypeAdapter(typ).json_schema()).to_dfa()


def test_formats_stay_small_so_that_many_uses_fit_the_state_limit():
    """The counted repetitions they used to hold cost 200-500 states a use; a schema with a few
    dozen uri/email/json-pointer properties then passed 20,000 states."""
    from llmserve.constraints.regex import compile_ast

    sizes = {fmt: compile_ast(string_ast([], fmt, 0, None)).num_states for fmt in FORMATS}
    assert max(sizes.values()) <= 170, sizes  # email: 163, its domain as email-validator reads it
    assert all(sizes[f] <= 24 for f in ("uri", "uri-reference", "iri", "json-pointer", "regex")), sizes
