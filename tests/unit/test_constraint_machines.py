"""Constraint state machines in pure Python: regex -> byte DFA, custom automata -> DFA (no engine, no vocab)."""

from __future__ import annotations

import pytest

from llmserve.constraints import ByteAutomaton, ConstraintError, automaton_to_dfa, compile_regex
from llmserve.errors import ExitCode


@pytest.mark.parametrize(
    ("pattern", "accepted", "rejected"),
    [
        ("abc", [b"abc"], [b"", b"ab", b"abcd", b"abd"]),
        ("(yes|no)", [b"yes", b"no"], [b"y", b"yesno", b"maybe"]),
        ("[0-9]{2,3}", [b"12", b"123"], [b"1", b"1234", b"ab"]),
        ("a*b+", [b"b", b"aab", b"abbb"], [b"", b"a", b"ba"]),
        ("[^a]", [b"b", b"\n"], [b"a", b"bb"]),
        ("é", ["é".encode()], [b"e", "é".encode()[:1]]),
    ],
)
def test_regex_dfa_accepts_exactly_its_language(pattern, accepted, rejected):
    dfa = compile_regex(pattern)
    for data in accepted:
        assert dfa.matches(data), (pattern, data)
    for data in rejected:
        assert not dfa.matches(data), (pattern, data)


def test_a_prefix_keeps_the_dfa_alive_and_a_wrong_byte_kills_it():
    dfa = compile_regex("(yes|no)")
    start = dfa.walk(dfa.start, b"")
    assert dfa.walk(start, b"ye") >= 0
    assert dfa.walk(start, b"x") < 0


@pytest.mark.parametrize("pattern", ["(", "a{3,1}", "[z-a]"])
def test_bad_regex_is_a_constraint_error(pattern):
    with pytest.raises(ConstraintError) as caught:
        compile_regex(pattern)
    assert caught.value.exit_code == ExitCode.INVALID_INPUT


class EvenAs(ByteAutomaton):
    """Strings over {a, b} with an even number of a's."""

    def start(self):
        return 0

    def step(self, state, byte):
        if byte == ord("a"):
            return 1 - state
        return state if byte == ord("b") else None

    def accepting(self, state):
        return state == 0


def test_a_custom_automaton_becomes_a_dfa():
    dfa = automaton_to_dfa(EvenAs())
    assert dfa.num_states == 2
    for data, ok in ((b"", True), (b"aa", True), (b"abab", True), (b"a", False), (b"bab", False), (b"ac", False)):
        assert dfa.matches(data) is ok, data
