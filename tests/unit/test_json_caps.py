"""load_json with caps (issue #11): a capped top-level array is refused once its cap is passed,
without building the rest; every other body reads exactly as json.loads reads it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmserve.serve.limits import JsonProblem, OverCap, load_json

CAPS = {"messages": 3, "stop": 2}

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3))
keys = st.sampled_from(["messages", "stop", "model", "n", "messages\u00e9", "x"]) | st.text(max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(keys, values, max_size=5), st.sampled_from([None, 0, 2]), st.booleans())
def test_bodies_within_the_caps_read_as_json_loads_reads_them(body, indent, ascii_only):
    for key, cap in CAPS.items():  # within the caps
        if isinstance(body.get(key), list):
            body[key] = body[key][:cap]
    raw = json.dumps(body, indent=indent, ensure_ascii=ascii_only).encode()
    assert load_json(raw, CAPS) == json.loads(raw) == load_json(raw)


def test_an_array_over_its_cap_is_refused_as_soon_as_the_cap_is_passed():
    # the 4th item is not even valid JSON: it is never read
    raw = b'{"model": "m", "messages": [{"a": 1}, {"a": 2}, {"a": 3}, {not json'
    with pytest.raises(OverCap) as info:
        load_json(raw, CAPS)
    assert (info.value.key, info.value.cap) == ("messages", 3)
    with pytest.raises(OverCap):
        load_json(json.dumps({"stop": ["a"] * 100_000, "messages": []}).encode(), CAPS)
    # at the cap: accepted
    assert load_json(b'{"stop" : [ "a" , "b" ] }', CAPS) == {"stop": ["a", "b"]}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [1, 2,]}',  # trailing comma
        b'{"messages": [1 2]}',
        b'{"messages": [1, 2]',  # cut short
        b'{"messages": [1]} trailing',
        b'{"a" 1}',
        b"{'a': 1}",
        b"",
        b"[1, 2, 3, 4, 5]",  # not an object: caps do not apply
        b'"just a string"',
        b"\xff\xfe{",
        b'\xef\xbb\xbf{"messages": [1]}',  # a UTF-8 byte order mark, as json.loads takes
        b'{"messages": [1], "messages": [1, 2]}',  # the last of duplicate keys wins
        b'{"messages": "not an array"}',
        b' \t\r\n{ \n"messages"\n:\n[\n1\n]\n}\n ',
        b'{"messages": [NaN, Infinity]}',
    ],
)
def test_anything_else_gets_json_loads_answer(raw):
    def outcome(caps):
        try:
            return ("ok", load_json(raw, caps))
        except JsonProblem as exc:
            return ("problem", str(exc))

    got = outcome(CAPS)
    assert got == outcome(None)
    if got[0] == "ok" and raw.strip():
        assert json.dumps(got[1]) == json.dumps(json.loads(raw))
