"""Regular expressions compiled to byte-level DFAs.

The DFA runs over UTF-8 *bytes*, not characters: a character class such as ``[^"]`` becomes the
byte sequences of every code point it contains. Tokens of a byte-level BPE vocabulary that end in
the middle of a multi-byte character therefore walk the DFA like any other token: they stop in an
intermediate state that only accepts the right continuation bytes.

Supported syntax (the matching is always a full match, ``^``/``$`` are accepted and ignored):
literals, ``.``, escapes (``\\d \\w \\s \\D \\W \\S \\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH`` and escaped
punctuation), Unicode general categories ``\\p{L}``/``\\P{Letter}``/``\\p{gc=Nd}`` (see
_category_ranges: the BMP's code points where required), classes ``[...]``/``[^...]`` with ranges,
groups ``(...)``, ``(?:...)``, ``(?P<name>...)``, ``(?<name>...)``, alternation ``|`` and the
quantifiers ``* + ? {m} {m,} {m,n}`` (lazy ``?`` suffixes accepted; they do not change the language).

In a JSON Schema pattern (``parse(..., schema=True)``) also look-around, ``(?=...)``, ``(?!...)``,
``(?<=...)``, ``(?<!...)``, and ``\\b``/``\\B`` (as look-around over ASCII word characters, a subset
both dialects agree on), as ("look", ...) nodes that schema_strings.py builds with
dfa_ops.look_dfa. Refused by name: back-references, recursion (``(?1)``, ``(?R)``), inline flags,
atomic and conditional groups, comments, Unicode properties other than general categories, and
look-around in a plain ``regex`` constraint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from typing import Any

import numpy as np

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.limits import ENV, Limits, budget_error, limits
from llmserve.constraints.memory_cache import MemoryCache
from llmserve.constraints.native import native as core
from llmserve.constraints.native import require_native

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_REPEAT = 1000
MAX_DFA_STATES = Limits.max_states  # the default; the limit in force is limits().max_states
# The subset construction may pass through this many times the state limit before minimising: the
# limit bounds the automaton kept (one mask row per state), and schemas whose branches share
# structure (anyOf of objects, repeated $ref targets) determinise to many equivalent states that
# minimisation merges. The construction itself stays bounded by the time and memory budgets.
SUBSET_FACTOR = 8
EMPTY_LANGUAGE = "the constraint matches no string at all"
EVERY_BYTE = np.ones(256, dtype=np.uint8)
EVERY_BYTE.flags.writeable = False

# --------------------------------------------------------------------------------------------
# AST: ("set", ranges) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, lo, hi|None)
#      | ("dfa", ByteDFA): an automaton over bytes used as it is (intersections, dfa_ops.py)
#      | ("members", [(required, node), ...], at_least_one): comma-separated members in order, each
#        optional unless required (a JSON object's properties); empty only when none is required
#        and not at_least_one
#      | ("list", node, lo, hi|None): ``node`` repeated lo..hi times, comma-separated (a JSON array)
# "members" and "list" build each element once (``jsonschema`` would otherwise write the element
# twice, before and after a comma, and nested objects and arrays doubled per level: 2^depth copies
# of the innermost value in the NFA and in the unminimised DFA). See _NFA.members / _NFA.comma_list.
# ranges: sorted, merged list of inclusive (lo, hi) code-point pairs.
# --------------------------------------------------------------------------------------------


def _normalize(ranges):
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _negate(ranges):
    out, nxt = [], 0
    for lo, hi in _normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_CODEPOINT:
        out.append((nxt, MAX_CODEPOINT))
    return out


_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x09, 0x0D), (0x20, 0x20)]
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}


@cache
def _wide_class(c: str) -> tuple[tuple[int, int], ...]:
    """What ``\\d``/``\\w``/``\\s`` match in either dialect a JSON Schema pattern meets: ECMA-262's
    (ASCII digits and word characters; Unicode white space with U+FEFF) or Python's ``re``, which
    ``jsonschema`` validates with (Unicode digits, word characters and white space, U+001C-U+001F
    among them); for ``\\w`` also Rust's ``regex``, which pydantic checks a field's pattern with. A value must satisfy the pattern in both, so a pattern that *excludes* the class
    (``\\S``, ``[^\\s-]``) excludes this union, and one that requires it gets the ASCII sets above,
    which both dialects hold. Computed once, from Python's own ``re``."""
    import re as _re

    # every code point in one string (surrogates too), to find the class's runs at C speed; decoded
    # from UTF-32 in ~10 ms where joining chr()s took ~100, paid by a process's first use
    every = np.arange(MAX_CODEPOINT + 1, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    out = [(m.start(), m.end() - 1) for m in _re.finditer("\\" + c + "+", every)]
    extra = [(0xFEFF, 0xFEFF)] if c == "s" else _rust_word_extra() if c == "w" else _newer_digits()
    return tuple(_normalize([*out, *extra, *_CLASS_ESCAPES[c]]))


def _newer_digits() -> list[tuple[int, int]]:
    """Digits a newer Unicode than Python's tables has (Rust's regex, pydantic's, knows some
    Python 3.11 does not): every code point unassigned here or outside the Basic Multilingual Plane
    (``_category_ranges``'s superset), so that what excludes ``\\d`` generates none of them."""
    return list(_category_ranges(frozenset({"Nd"}), excluded=True))


def _rust_word_extra() -> list[tuple[int, int]]:
    """What Rust's ``regex`` (pydantic's pattern checks) counts in ``\\w`` beyond Python's: marks,
    connector punctuation, the join controls and the letter-like symbols of Other_Alphabetic
    (circled letters); outside the Basic Multilingual Plane, everything (``_category_ranges``'s
    superset). An answer of a pattern that excludes ``\\w`` then passes pydantic too."""
    marks = _category_ranges(frozenset({"Mn", "Mc", "Me", "Pc"}), excluded=True)
    return [*marks, (0x200C, 0x200D), (0x24B6, 0x24E9)]


_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a", "e": "\x1b"}


def _char_node(c: str) -> tuple:
    return ("set", [(ord(c), ord(c))])


_LATIN_1_NODES = {chr(i): _char_node(chr(i)) for i in range(256)}


class _CharNodes(dict):
    """character -> its set node, shared (AST nodes are never mutated): Latin-1's always, others from
    their first use, at most 4,096 in all (a schema may name any of 1.1M code points; past that the
    others start again, so the characters a process meets now are the ones held)."""

    def __init__(self) -> None:
        super().__init__(_LATIN_1_NODES)

    def __missing__(self, c: str) -> tuple:
        if len(self) >= _CHAR_NODES_HELD:
            self.clear()
            self.update(_LATIN_1_NODES)
        node = self[c] = _char_node(c)
        return node


_CHAR_NODES_HELD = 4096


# a literal is one node per character, and schemas hold thousands (property names, enum values):
# a dict lookup mapped in C is ~4x cheaper per character than a cached function
_CHAR_NODES = _CharNodes()


def literal(text: str):
    """AST matching exactly ``text``."""
    node = _LITERALS.get(text)
    if node is None:
        node = ("cat", list(map(_CHAR_NODES.__getitem__, text)))
        if len(text) <= _LITERAL_HELD_CHARS:
            if len(_LITERALS) >= _LITERALS_HELD:
                _LITERALS.clear()
            _LITERALS[text] = node
    return node


# a schema repeats its punctuation, null/true/false and property names hundreds of times; nodes
# are never mutated, so one node serves every use (each use is still counted and written)
_LITERALS: dict[str, tuple] = {}
_LITERALS_HELD = 4096
_LITERAL_HELD_CHARS = 64


# ECMA-262's ``.`` leaves out every line terminator, Python's only ``\n``: a JSON Schema pattern
# (validated by either) gets the set both accept
_SCHEMA_DOT = _negate([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])


# ``\\b``/``\\B`` as look-around (zero-width): whether a word character is on each side. Both
# dialects must agree, as with ``\\w`` (ECMA-262's word characters are ASCII, Python's Unicode): a
# side is a word character when it is an ASCII one (a word character to both) and a non-word one
# when it is an ASCII non-word character or the value's start or end (a non-word side to both; a
# subset: a non-ASCII non-word neighbour, ``é`` to ECMA-262 or ``。`` to both, is not generated
# there, which keeps the automaton small). Not inside a positive look-around (its look-behind would
# sit inside a look-ahead, or the other way round, which dfa_ops.look_dfa refuses). Where what the
# pattern matches is excluded (inside a negative look-around, a 'not', a oneOf kept apart) a subset
# would let excluded values through: there it is read as no condition, a superset.
_ASCII_WORD = ("set", list(_WORD))
_ASCII_OTHER = ("set", [r for r in _negate(_WORD) if r[1] <= 0x7F])
_NOT_ASCII_OTHER = ("set", _negate(_ASCII_OTHER[1]))


@cache
def _boundary(non: bool) -> tuple:
    """``\\b`` (``\\B`` when ``non``): the same nodes at every use (their automata are built once)."""
    word_before, word_after = ("look", True, False, _ASCII_WORD), ("look", False, False, _ASCII_WORD)
    other_before = ("look", True, True, _NOT_ASCII_OTHER)  # no character, or an ASCII non-word one
    other_after = ("look", False, True, _NOT_ASCII_OTHER)
    if non:
        # Python's \B never matches in the empty value (ECMA-262's does): a non-word character on
        # one side at least
        char_before, char_after = ("look", True, False, _ASCII_OTHER), ("look", False, False, _ASCII_OTHER)
        return (
            "alt",
            [
                ("cat", [word_before, word_after]),
                ("cat", [char_before, other_after]),
                ("cat", [other_before, char_after]),
            ],
        )
    return ("alt", [("cat", [word_before, other_after]), ("cat", [other_before, word_after])])


_GC_NAMES = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo", "Mark": "M",
    "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
    "Number": "N", "Decimal_Number": "Nd", "digit": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
    "Punctuation": "P", "punct": "P", "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd",
    "Open_Punctuation": "Ps", "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi",
    "Final_Punctuation": "Pf", "Other_Punctuation": "Po", "Symbol": "S", "Math_Symbol": "Sm",
    "Currency_Symbol": "Sc", "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z",
    "Space_Separator": "Zs", "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C",
    "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co",
    "Unassigned": "Cn",
}  # fmt: skip
_GC = {
    "L": "Lu Ll Lt Lm Lo", "LC": "Lu Ll Lt", "M": "Mn Mc Me", "N": "Nd Nl No", "P": "Pc Pd Ps Pe Pi Pf Po",
    "S": "Sm Sc Sk So", "Z": "Zs Zl Zp", "C": "Cc Cf Cs Co Cn",
}  # fmt: skip
_GC_LEAVES = {leaf for leaves in _GC.values() for leaf in leaves.split()}


def _categories(name: str) -> frozenset[str] | None:
    """The two-letter general categories ``name`` stands for (``Any``/``ASCII``: themselves)."""
    if name in ("Any", "ASCII"):
        return frozenset([name])
    short = _GC_NAMES.get(name, name)
    if short in _GC:
        return frozenset(_GC[short].split())
    if short in _GC_LEAVES:
        return frozenset([short])
    return None


@cache
def _category_table() -> dict[str, list[tuple[int, int]]]:
    """Each general category's code points (Python's ``unicodedata``), as ranges. Once per process."""
    import unicodedata

    out: dict[str, list[tuple[int, int]]] = {}
    cat_of = unicodedata.category
    start, prev = 0, cat_of("\0")
    for cp in range(1, MAX_CODEPOINT + 2):
        cur = cat_of(chr(cp)) if cp <= MAX_CODEPOINT else ""
        if cur != prev:
            out.setdefault(prev, []).append((start, cp - 1))
            start, prev = cp, cur
    return out


@cache
def _category_ranges(cats: frozenset[str], excluded: bool) -> tuple[tuple[int, int], ...]:
    """The code points of ``cats``. Unicode adds characters (and now and then moves one) from one
    version to the next, and the validator that checks an answer may use another version than
    Python's ``unicodedata`` here: required (``excluded`` False), the category's code points of the
    Basic Multilingual Plane (a subset: fewer automaton states, and no character the validator's
    older tables may not have); excluded, the category's code points and every unassigned and
    supplementary-plane one (a superset, so what is left is assigned in the BMP, of another category)."""
    if "Any" in cats:
        return ((0, MAX_CODEPOINT),)
    if "ASCII" in cats:
        return ((0, 0x7F),)
    table = _category_table()
    ranges = [r for c in cats for r in table.get(c, [])]
    if excluded:
        ranges += [*table.get("Cn", []), (0x10000, MAX_CODEPOINT)]
    else:
        ranges = [(lo, min(hi, 0xFFFF)) for lo, hi in ranges if lo <= 0xFFFF]
    return tuple(_normalize(ranges))


class _Parser:
    def __init__(self, pattern: str, schema: bool = False, excluded: bool = False):
        self.p = pattern
        self.i = 0
        # schema mode: ``^``/``$`` become ("anchor", c) nodes (a JSON Schema pattern is a search
        # unless anchored, see schema_strings.py) and ``.`` is _SCHEMA_DOT; look-around and ``\\b``
        # become ("look", ...) nodes (schema_strings.py builds their automaton, dfa_ops.look_dfa)
        self.schema = schema
        # inside an odd number of negative look-arounds: what the pattern matches there is excluded
        # from the value, so each class, ``.`` and ``$`` stands for what *either* dialect matches
        self.neg = excluded
        self.looks = 0  # look-arounds open around the current position
        # parsing is Python, about 7 us a character: a megabyte-long pattern (a 50,000-word alternation) took
        # seconds before any compile budget was counted, so the parse counts against it too
        self.deadline = time.monotonic() + limits().compile_ms / 1000
        self.items = 0

    def error(self, what: str) -> ConstraintError:
        return ConstraintError(f"regex {self.p!r}: {what} at position {self.i}")

    def peek(self):
        return self.p[self.i] if self.i < len(self.p) else None

    def take(self):
        c = self.peek()
        if c is None:
            raise self.error("unexpected end")
        self.i += 1
        return c

    def parse(self):
        node = self.alt()
        if self.i != len(self.p):
            raise self.error("unbalanced ')'")
        return node

    def alt(self):
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def cat(self):
        items = []
        while self.peek() is not None and self.peek() not in "|)":
            items.append(self.repeat())
            self.items += 1
            if not self.items & 4095 and time.monotonic() > self.deadline:
                raise _time_budget_error()
        return ("cat", items)

    def repeat(self):
        node = self.atom()
        while True:
            c = self.peek()
            if c == "*":
                self.i += 1
                node = ("rep", node, 0, None)
            elif c == "+":
                self.i += 1
                node = ("rep", node, 1, None)
            elif c == "?":
                self.i += 1
                node = ("rep", node, 0, 1)
            elif c == "{" and self._is_counted():
                self.i += 1
                lo = self._int()
                hi = lo
                if self.peek() == ",":
                    self.i += 1
                    hi = None if self.peek() == "}" else self._int()
                if self.take() != "}":
                    raise self.error("bad repetition")
                if hi is not None and hi < lo:
                    raise self.error("repetition {m,n} with n < m")
                if lo > MAX_REPEAT or (hi or 0) > MAX_REPEAT:
                    raise self.error(f"repetition bound over {MAX_REPEAT}")
                node = ("rep", node, lo, hi)
            else:
                return node
            if self.peek() in ("?", "+") and node[0] == "rep":
                self.i += 1  # lazy / possessive marker: same language

    def _is_counted(self):
        j = self.i + 1
        k = j
        while k < len(self.p) and (self.p[k].isdigit() or self.p[k] == ","):
            k += 1
        return k < len(self.p) and self.p[k] == "}" and k > j and self.p[j].isdigit()

    def _int(self):
        j = self.i
        while self.peek() is not None and self.peek().isdigit():
            self.i += 1
        if j == self.i:
            raise self.error("expected a number")
        return int(self.p[j : self.i])

    def group(self):
        """After ``(``: a group, named or not, or a look-around."""
        if self.peek() == "?":
            self.i += 1
            k = self.take()
            if k == ":":
                pass
            elif (k == "P" and self.peek() == "<") or (k == "<" and self.peek() not in ("=", "!")):
                end = self.p.find(">", self.i)
                if end < 0:
                    raise self.error("unterminated group name")
                self.i = end + 1
            elif k in "=!" or k == "<":
                return self._look(behind=k == "<")
            else:
                self.i -= 3  # at the '(' of the group
                raise self.error(self._extension_refusal())
        node = self.alt()
        if self.take() != ")":
            raise self.error("missing ')'")
        return node

    def atom(self):
        c = self.take()
        if c == "(":
            return self.group()
        if c == "[":
            return ("set", self._class())
        if c == ".":
            if not self.schema:
                return ("set", _negate([(0x0A, 0x0A)]))
            # required: what both dialects' dot matches; excluded (negative look-around): either's
            return ("set", _negate([(0x0A, 0x0A)]) if self.neg else _SCHEMA_DOT)
        if c in "^$":
            if not self.schema:
                return ("cat", [])
            # excluded, Python's '$' also matches before a final newline (ECMA-262's only at the end)
            return ("anchor", "$\n" if c == "$" and self.neg else c)
        if c == "\\":
            if self.schema and self.peek() in ("b", "B"):
                if self.neg:
                    # excluded: a superset is needed, and holding no condition there is one
                    self.i += 1
                    return ("cat", [])
                if self.looks:
                    raise self.error("\\b and \\B inside a look-around are not supported")
                return _boundary(self.take() == "B")
            return ("set", self._escape(in_class=False))
        if c in "*+?":
            raise self.error("nothing to repeat")
        if c == ")":
            raise self.error("unbalanced ')'")
        return ("set", [(ord(c), ord(c))])

    def _escape(self, in_class: bool, negated: bool = False):
        """``negated``: inside ``[^...]`` (what the escape matches is then excluded)."""
        c = self.take()
        if self.schema and c.lower() in _CLASS_ESCAPES:
            # matched by the value in both dialects when required, excluded in both when excluded
            # (inside a negative look-around what the escape matches is excluded: ``neg`` flips it)
            negated = negated != self.neg
            if c in _CLASS_ESCAPES:
                return list(_wide_class(c)) if negated else list(_CLASS_ESCAPES[c])
            return _negate(_CLASS_ESCAPES[c.lower()] if negated else list(_wide_class(c.lower())))
        if c in _CLASS_ESCAPES:
            return list(_CLASS_ESCAPES[c])
        if c.lower() in _CLASS_ESCAPES and c.isupper():
            return _negate(_CLASS_ESCAPES[c.lower()])
        if c in _CHAR_ESCAPES:
            o = ord(_CHAR_ESCAPES[c])
            return [(o, o)]
        if c == "x":
            return self._hex(2)
        if c == "u":
            return self._hex(4)
        if c == "U":
            return self._hex(8)
        if c == "b" and in_class:
            return [(8, 8)]
        if c in "pP" and self.peek() == "{":
            return self._property(c == "P", excluded=negated != self.neg)
        if c.isalnum():
            raise self.error(f"unsupported escape \\{c}")
        return [(ord(c), ord(c))]

    def _look(self, behind: bool):
        """After ``(?=``/``(?!`` (``(?<`` for a look-behind): ("look", behind, negative, body)."""
        negative = (self.take() if behind else self.p[self.i - 1]) == "!"
        if not self.schema:
            raise self.error("look-around is supported in JSON Schema patterns only")
        outer = self.neg
        self.neg = outer != negative
        self.looks += 1
        body = self.alt()
        self.looks -= 1
        self.neg = outer
        if self.take() != ")":
            raise self.error("missing ')'")
        return ("look", behind, negative, body)

    def _extension_refusal(self) -> str:
        """What the ``(?`` group at ``self.i`` is, for its refusal."""
        rest = self.p[self.i + 2 :]
        if rest[:1].isdigit() or rest.startswith("R)") or (rest[:1] in "+-" and rest[1:2].isdigit()):
            return "recursion ((?R), (?1), (?-1)) is not supported: not a regular language"
        if rest.startswith(("P>", "&")):
            return "subroutine calls ((?P>name), (?&name)) are not supported: not a regular language"
        if rest.startswith("P="):
            return "back-references are not supported"
        if rest.startswith(">"):
            return "atomic groups (?>...) are not supported"
        if rest.startswith("("):
            return "conditional groups (?(...)...) are not supported"
        if rest.startswith("#"):
            return "comments (?#...) are not supported (not ECMA-262)"
        if rest[:1].isalpha() or rest[:1] in "-^":
            return "inline flags ((?i), (?m), (?s:...)) are not supported"
        return f"group extension '(?{rest[:1]}' is not supported"

    def _property(self, upper: bool, excluded: bool):
        """``\\p{...}``/``\\P{...}``: a Unicode general category (``L``, ``Letter``, ``gc=Lu``,
        ``General_Category=Decimal_Number``; ``Any``, ``ASCII``). ``excluded``: what the escape
        matches is kept out of the value (a negated class, a negative look-around). See
        _category_ranges for the narrowing that keeps the answers valid in other Unicode versions."""
        end = self.p.find("}", self.i)
        if end < 0:
            raise self.error("unterminated \\p{...}")
        name = self.p[self.i + 1 : end]
        key, _, value = name.partition("=")
        if value and key not in ("gc", "General_Category"):
            raise self.error(f"Unicode property \\p{{{name}}} is not supported (general categories only)")
        cats = _categories(value or key)
        if cats is None:
            raise self.error(f"unknown Unicode property \\p{{{name}}} (general categories only)")
        self.i = end + 1
        if upper:
            return _negate(list(_category_ranges(cats, not excluded)))
        return list(_category_ranges(cats, excluded))

    def _hex(self, n):
        digits = self.p[self.i : self.i + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.error("bad hex escape")
        self.i += n
        o = int(digits, 16)
        if o > MAX_CODEPOINT:
            raise self.error("code point out of range")
        return [(o, o)]

    def _class(self):
        negate = False
        if self.peek() == "^":
            negate = True
            self.i += 1
        ranges = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            if c == "\\":
                item = self._escape(in_class=True, negated=negate)
            elif c == "[" and self.peek() == ":":
                raise self.error("POSIX classes are not supported")
            else:
                item = [(ord(c), ord(c))]
            if (
                len(item) == 1
                and item[0][0] == item[0][1]
                and self.peek() == "-"
                and self.i + 1 < len(self.p)
                and self.p[self.i + 1] != "]"
            ):
                self.i += 1
                c2 = self.take()
                hi = self._escape(in_class=True) if c2 == "\\" else [(ord(c2), ord(c2))]
                if len(hi) != 1 or hi[0][0] != hi[0][1] or hi[0][0] < item[0][0]:
                    raise self.error("bad class range")
                item = [(item[0][0], hi[0][0])]
            ranges.extend(item)
        ranges = _normalize(ranges)
        return _negate(ranges) if negate else ranges


def parse(pattern: str, *, schema: bool = False, excluded: bool = False):
    """Parse ``pattern`` into the AST used by :func:`compile_ast`. ``schema``: JSON Schema's reading
    (anchors kept as ("anchor", "^" | "$") nodes for the caller to resolve; ``.`` without line
    terminators). ``excluded``: the values it matches are to be excluded, so every class, ``.`` and
    ``$`` stands for what either dialect (ECMA-262, Python's ``re``) matches, as inside a negative
    look-around."""
    return _PARSED.get((pattern, schema, excluded), lambda: _parse(pattern, schema, excluded))


def _parse(pattern: str, schema: bool, excluded: bool):
    try:
        return _Parser(pattern, schema, excluded).parse()
    except RecursionError:  # the parser recurses per group: thousands of nested groups
        raise ConstraintError(f"regex nested too deeply ({pattern[:40]!r}...)") from None


# what the trees kept per process may take in all (TreeCache)
PARSED_KEPT_BYTES = 32 << 20


class TreeCache:
    """Trees built from patterns, kept by key: schemas name the same patterns, formats and number
    grammars many times, and a server meets the same few again and again. Shared, as AST nodes are
    never mutated. Within PARSED_KEPT_BYTES in all (``tree_bytes``), least recently used dropped
    first; a tree over a sixteenth of that (a pattern of negated Unicode categories repeated
    is megabytes) is built at each use instead, so no one pattern takes much of the room.
    Refusals are not kept: they are raised again at each use."""

    def __init__(self) -> None:
        self._kept = MemoryCache(lambda: PARSED_KEPT_BYTES)

    def get(self, key: tuple, build: Callable[[], Any], tree_of: Callable[[Any], Any] = lambda found: found) -> Any:
        found = self._kept.get(key)
        if found is None:
            found = build()
            room = PARSED_KEPT_BYTES // 16
            size = tree_bytes(tree_of(found), room) + sum(len(k) for k in key if isinstance(k, str))
            if size <= room:
                self._kept.put(key, found, size)
        return found


def tree_bytes(node, cap: int | None = None) -> int:
    """About what ``node`` holds: 64 bytes for each tuple or list in it and each item of one, a
    part shared within it counted once; counting stops once past ``cap`` (a tree of a megabyte-long
    pattern took longer to count than to parse, only to be found too large to keep)."""
    seen: set[int] = set()
    stack, count = [node], 0
    limit = None if cap is None else cap // 64
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        count += 1 + len(n)
        if limit is not None and count > limit:
            break
        stack.extend(c for c in n if isinstance(c, (tuple, list)))
    return 64 * count


_PARSED = TreeCache()


# --------------------------------------------------------------------------------------------
# Code-point ranges -> UTF-8 byte-range sequences
# --------------------------------------------------------------------------------------------


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Split ``[lo, hi]`` into sequences of byte ranges whose concatenation is exactly the UTF-8
    encodings of the code points in the range (surrogates excluded)."""
    out = []
    stack = [(lo, hi)]
    while stack:
        a, b = stack.pop()
        if a > b:
            continue
        if a <= SURROGATES[1] and b >= SURROGATES[0]:
            stack.append((SURROGATES[1] + 1, b))
            stack.append((a, SURROGATES[0] - 1))
            continue
        split = False
        for bound in (0x7F, 0x7FF, 0xFFFF):
            if a <= bound < b:
                stack.append((bound + 1, b))
                stack.append((a, bound))
                split = True
                break
        if split:
            continue
        if b <= 0x7F:
            out.append([(a, b)])
            continue
        n = len(chr(a).encode("utf-8"))
        for i in range(1, n):
            m = (1 << (6 * i)) - 1
            if (a & ~m) != (b & ~m):
                if a & m:
                    stack.append(((a | m) + 1, b))
                    stack.append((a, a | m))
                    split = True
                    break
                if (b & m) != m:
                    stack.append(((b & ~m), b))
                    stack.append((a, (b & ~m) - 1))
                    split = True
                    break
        if split:
            continue
        ea, eb = chr(a).encode("utf-8"), chr(b).encode("utf-8")
        out.append(list(zip(ea, eb, strict=True)))  # same width: the splits above keep a range in one
    return out


# --------------------------------------------------------------------------------------------
# Thompson NFA over bytes, subset construction, trimming and minimisation
# --------------------------------------------------------------------------------------------


class _NFA:
    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def embed(self, dfa: ByteDFA) -> tuple[int, int]:
        """A byte automaton as it is: one NFA state per DFA state, its byte edges, accepting
        states joined to one end."""
        ids = [self.state() for _ in range(dfa.num_states)]
        e = self.state()
        for q, row in enumerate(dfa.table):
            if dfa.accept[q]:
                self.eps[ids[q]].append(e)
            for lo, hi, to in byte_ranges(row):
                self.edges[ids[q]].append((lo, hi, ids[to]))
        return ids[dfa.start], e

    def code_points(self, ranges) -> tuple[int, int]:
        s, e = self.state(), self.state()
        trie: dict = {}
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
                # share common leading byte ranges between sequences
                cur = s
                for k, rng in enumerate(seq):
                    if k == len(seq) - 1:
                        self.edges[cur].append((rng[0], rng[1], e))
                    else:
                        key = (cur, rng)
                        nxt = trie.get(key)
                        if nxt is None:
                            nxt = trie[key] = self.state()
                            self.edges[cur].append((rng[0], rng[1], nxt))
                        cur = nxt
        return s, e

    def build(self, node) -> tuple[int, int]:
        kind = node[0]
        if kind == "set":
            return self.code_points(node[1])
        if kind == "dfa":
            return self.embed(node[1])
        if kind == "cat":
            s = e = self.state()
            for child in node[1]:
                cs, ce = self.build(child)
                self.eps[e].append(cs)
                e = ce
            return s, e
        if kind == "alt":
            s, e = self.state(), self.state()
            for child in node[1]:
                cs, ce = self.build(child)
                self.eps[s].append(cs)
                self.eps[ce].append(e)
            return s, e
        if kind == "rep":
            _, child, lo, hi = node
            s = e = self.state()
            for _ in range(lo):
                cs, ce = self.build(child)
                self.eps[e].append(cs)
                e = ce
            if hi is None:
                cs, ce = self.build(child)
                loop = self.state()
                self.eps[e].append(loop)
                self.eps[loop].append(cs)
                self.eps[ce].append(loop)
                end = self.state()
                self.eps[loop].append(end)
                return s, end
            end = self.state()
            self.eps[e].append(end)
            for _ in range(hi - lo):
                cs, ce = self.build(child)
                self.eps[e].append(cs)
                self.eps[ce].append(end)
                e = ce
            return s, end
        if kind == "members":
            return self.members(node[1], node[2])
        if kind == "list":
            return self.comma_list(node[1], node[2], node[3])
        raise AssertionError(kind)

    def members(self, kvs, at_least_one: bool) -> tuple[int, int]:
        """Each member built once. ``a[i]``: no member emitted before i (epsilon only); ``p[i]``: after
        a comma, member i or a later one (the ones between optional); ``after[i]``: member i-1 was
        the last emitted, so a comma or the end (``e[i]``: the end, if members i.. are optional)
        follows. After a member the subset holds ``after[i]`` alone, not one state per later member."""
        n = len(kvs)
        s, end = self.state(), self.state()
        a = [s] + [self.state() for _ in range(n)]
        p = [self.state() for _ in range(n)]
        e = [self.state() for _ in range(n)] + [end]
        for i, (req, child) in enumerate(kvs):
            cs, ce = self.build(child)
            entry = self.state()
            self.eps[entry].append(cs)
            self.eps[a[i]].append(entry)
            self.eps[p[i]].append(entry)
            after = self.state()
            self.eps[ce].append(after)
            if i + 1 < n:
                self.edges[after].append((0x2C, 0x2C, p[i + 1]))
            self.eps[after].append(e[i + 1])
            if not req:
                self.eps[a[i]].append(a[i + 1])
                if i + 1 < n:
                    self.eps[p[i]].append(p[i + 1])
                self.eps[e[i]].append(e[i + 1])
        if not at_least_one:
            self.eps[a[n]].append(end)
        return s, end

    def comma_list(self, child, lo: int, hi: int | None) -> tuple[int, int]:
        """``child`` lo..hi times, comma-separated. Unbounded: max(lo, 1) copies, the last one looping
        back through a comma (a counted bound needs its copies: the automaton counts)."""
        s, end = self.state(), self.state()
        if lo == 0:
            self.eps[s].append(end)
        copies = max(lo, 1) if hi is None else hi
        at = s
        for k in range(copies):
            cs, ce = self.build(child)
            if k == 0:
                self.eps[at].append(cs)
            else:
                self.edges[at].append((0x2C, 0x2C, cs))
            at = self.state()
            self.eps[ce].append(at)
            if k + 1 >= lo:
                self.eps[at].append(end)
            if hi is None and k + 1 == copies:
                self.edges[at].append((0x2C, 0x2C, cs))
        return s, end


def byte_ranges(row) -> list[tuple[int, int, int]]:
    """A DFA table row (256 targets, -1 dead) as (lo, hi, target) runs of equal live targets."""
    out: list[tuple[int, int, int]] = []
    for b, to in enumerate(int(x) for x in row):
        if to < 0:
            continue
        if out and out[-1][1] == b - 1 and out[-1][2] == to:
            out[-1] = (out[-1][0], b, to)
        else:
            out.append((b, b, to))
    return out


class ByteDFA:
    """A deterministic automaton over bytes.

    ``table[s, b]`` is the next state or -1 (dead); ``accept[s]`` marks accepting states. Every state
    left in the table can still reach an accepting state (dead ends are trimmed to -1).

    Given ``classes`` (uint8[256]), the table passed is over byte classes instead, int32[S, C]: the
    next state on byte b is ``table[s, classes[b]]``. The native construction returns that form, a
    few dozen columns instead of 256 (a 50k-state schema: 12 MB instead of 50 MB, and no pages of a
    byte table to fault in); ``transitions`` gives it to the compiled form and the distance searches
    as it is, and ``table`` expands the byte table on each read, not kept (the caches count the
    automaton at its class form's size; nothing on the serving path reads ``table`` of one).
    """

    def __init__(self, table: np.ndarray, accept: np.ndarray, start: int = 0, classes: np.ndarray | None = None):
        self.accept = accept  # uint8 [S]
        self.start = start
        self.transitions: tuple[np.ndarray, np.ndarray] | None = None if classes is None else (classes, table)
        self._bytes: np.ndarray | None = table if classes is None else None

    @property
    def table(self) -> np.ndarray:
        """int32 [S, 256]."""
        if self._bytes is not None:
            return self._bytes
        assert self.transitions is not None
        classes, columns = self.transitions
        return np.ascontiguousarray(columns[:, classes])

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    @property
    def nbytes(self) -> int:
        """What the automaton holds: its byte table, or its classes and columns."""
        held = [self.accept] + ([] if self._bytes is None else [self._bytes]) + list(self.transitions or ())
        return int(sum(a.nbytes for a in held))

    def walk(self, state: int, data: bytes) -> int:
        if self.transitions is not None:  # a step reads one entry: no byte table for it
            classes, columns = self.transitions
            for b in data:
                if state < 0:
                    return -1
                state = int(columns[state, classes[b]])
            return state
        t = self.table
        for b in data:
            if state < 0:
                return -1
            state = int(t[state, b])
        return state

    def matches(self, data: bytes) -> bool:
        s = self.walk(self.start, data)
        return s >= 0 and bool(self.accept[s])


def _determinize(
    nfa: _NFA, start: int, final: int, deadline: float | None = None, max_states: int = MAX_DFA_STATES
) -> tuple[list[list[int]], list[bool]]:
    closure_cache: dict[int, frozenset] = {}

    def closure1(q):
        c = closure_cache.get(q)
        if c is None:
            seen = {q}
            todo = [q]
            while todo:
                x = todo.pop()
                for y in nfa.eps[x]:
                    if y not in seen:
                        seen.add(y)
                        todo.append(y)
            c = closure_cache[q] = frozenset(seen)
        return c

    def closure(qs):
        out = set()
        for q in qs:
            out |= closure1(q)
        # only states with byte edges (or the final state) matter for identity
        return frozenset(x for x in out if nfa.edges[x] or x == final)

    init = closure([start])
    index = {init: 0}
    order = [init]
    table: list[list[int]] = []
    accept: list[bool] = []
    i = 0
    while i < len(order):
        _check_deadline(deadline)
        cur = order[i]
        i += 1
        accept.append(final in cur)
        row = [-1] * 256
        edges = [e for q in cur for e in nfa.edges[q]]
        if edges:
            cuts = sorted({lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
            for a, b in pairwise(cuts):
                tgts = [t for lo, hi, t in edges if lo <= a and b - 1 <= hi]
                if not tgts:
                    continue
                nxt = closure(tgts)
                j = index.get(nxt)
                if j is None:
                    if len(order) >= max_states:
                        raise _states_error(max_states)
                    j = index[nxt] = len(order)
                    order.append(nxt)
                for x in range(a, b):
                    row[x] = j
        table.append(row)
    return table, accept


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise _time_budget_error()


def _trim_and_minimize(table: list[list[int]], accept: list[bool]) -> ByteDFA:
    n = len(table)
    t = np.asarray(table, dtype=np.int32).reshape(n, 256)
    acc = np.asarray(accept, dtype=bool)
    live = _co_reachable(table, acc)
    if not live[0]:
        raise ConstraintError(EMPTY_LANGUAGE)
    t = np.where((t >= 0) & live[np.clip(t, 0, None)], t, -1)
    cls = _equivalence_classes(t, acc, live)
    return _renumber(t, acc, live, cls)


def _co_reachable(table: list[list[int]], acc: np.ndarray) -> np.ndarray:
    """Bool [S]: the states from which an accepting state is reachable."""
    n = len(table)
    live = acc.copy()
    rev: list[set[int]] = [set() for _ in range(n)]
    for s in range(n):
        for d in set(table[s]):
            if d >= 0:
                rev[d].add(s)
    todo = [s for s in range(n) if live[s]]
    while todo:
        d = todo.pop()
        for s in rev[d]:
            if not live[s]:
                live[s] = True
                todo.append(s)
    return live


def _equivalence_classes(t: np.ndarray, acc: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Moore partition refinement over the live states: int64 [S] class per state (dead: -1)."""
    n = t.shape[0]
    cls = np.where(live, acc.astype(np.int64), -1)
    while True:
        nxt_cls = np.where(t >= 0, cls[np.clip(t, 0, None)], -1)
        sig: dict[tuple[int, bytes], int] = {}
        new = np.full(n, -1, dtype=np.int64)
        for s in range(n):
            if not live[s]:
                continue
            key = (int(cls[s]), nxt_cls[s].tobytes())
            new[s] = sig.setdefault(key, len(sig))
        if len(sig) == len(set(int(c) for c in cls[live])):
            return new
        cls = new


def _renumber(t: np.ndarray, acc: np.ndarray, live: np.ndarray, cls: np.ndarray) -> ByteDFA:
    """One state per class, numbered breadth-first from the start state (which becomes 0)."""
    n = t.shape[0]
    k = int(cls.max()) + 1
    rep = np.zeros(k, dtype=np.int64)
    for s in range(n - 1, -1, -1):
        if live[s]:
            rep[cls[s]] = s
    order = {int(cls[0]): 0}
    queue = [int(cls[0])]
    qi = 0
    while qi < len(queue):
        c = queue[qi]
        qi += 1
        for d in t[rep[c]]:
            if d >= 0:
                cd = int(cls[d])
                if cd not in order:
                    order[cd] = len(order)
                    queue.append(cd)
    m = len(order)
    out = np.full((m, 256), -1, dtype=np.int32)
    out_acc = np.zeros(m, dtype=np.uint8)
    for c, i in order.items():
        row = t[rep[c]]
        out[i] = np.where(row >= 0, [order.get(int(cls[d]), -1) if d >= 0 else -1 for d in row], -1)
        out_acc[i] = acc[rep[c]]
    return ByteDFA(out, out_acc, 0)


MAX_NFA_STATES = Limits.max_nfa_states  # the default; the limit in force is limits().max_nfa_states
_SET, _CAT, _ALT, _REP, _DFA, _MEMBERS, _LIST = 0, 1, 2, 3, 4, 5, 6


def _states_error(n: int) -> ConstraintError:
    return budget_error(f"constraint too large: more than {n} automaton states", f"{n} states", ENV["max_states"])


def _time_budget_error(ms: int | None = None) -> ConstraintError:
    ms = limits().compile_ms if ms is None else ms
    return budget_error(f"constraint compile time budget ({ms} ms) exceeded", f"{ms} ms", ENV["compile_ms"])


# expanded_size's memo across calls (``new_size_memo``): the core's, or the reference's dict by node identity
SizeMemo = Any


def new_size_memo() -> SizeMemo:
    """A new memo for ``expanded_size``, for the implementation in use."""
    return {} if core is None else core.TreeSizes()


def alphabet(node) -> list[tuple[int, int]] | None:
    """Every character ``node`` may match (its sets' ranges, look-arounds' included: a superset),
    or None when it holds an embedded automaton (over bytes) or a node this does not read."""
    ranges: list[tuple[int, int]] = []
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        kind = n[0]
        if kind == "set":
            ranges += n[1]
        elif kind in ("cat", "alt"):
            stack += n[1]
        elif kind in ("rep", "list"):
            stack.append(n[1])
        elif kind == "look":
            stack.append(n[3])
        elif kind != "anchor":
            return None
    return _normalize(ranges)


def expanded_size(node, cap: int, sizes: SizeMemo | None = None) -> int:
    """About how many NFA states ``node`` becomes once counted repetitions are unrolled (the
    builder's count, within a small factor), counted without unrolling anything; stops counting
    past ``cap``. Nodes may be shared (the JSON-schema converter reuses a ``$ref``'s tree): each
    use counts, as each is built. Iterative: the tree may be deeper than Python's stack.

    ``sizes`` (``new_size_memo()``): the sizes earlier calls with the same ``cap`` found, by node,
    holding the nodes (so that their identities are not reused); found sizes are added. The
    converter asks about each reference's tree, which holds the trees it asked about before:
    without this, nested references were walked once per level. The core counts
    (``tree_bindings.cpp``); ``_expanded_size`` is the reference, without the core."""
    if core is not None:
        return core.tree_expanded_size(node, cap, sizes)
    return _expanded_size(node, cap, sizes)


def _expanded_size(node, cap: int, sizes: dict[int, tuple[int, Any]] | None = None) -> int:
    """``expanded_size`` in Python (the reference): ``sizes`` by node identity, each with its node."""
    sizes = {} if sizes is None else sizes
    stack = [(node, False)]
    while stack:
        n, ready = stack.pop()
        if id(n) in sizes:
            continue
        kind = n[0]
        children = (
            [n[1]]
            if kind in ("rep", "list")
            else [c for _, c in n[1]]
            if kind == "members"
            else n[1]
            if kind in ("cat", "alt")
            else []
        )
        if not ready and children:
            stack.append((n, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        if kind == "set":
            size = 2 + 3 * len(n[1])
        elif kind == "dfa":
            size = 1 + n[1].num_states
        elif kind in ("cat", "alt"):
            size = 2 + sum(sizes[id(c)][0] for c in n[1])
        elif kind == "members":
            size = 2 + sum(5 + sizes[id(c)][0] for _, c in n[1])
        elif kind == "list":
            child, lo, hi = sizes[id(n[1])][0], n[2], n[3]
            size = 2 + (child + 1) * (max(lo, 1) if hi is None else hi)
        else:
            child, lo, hi = sizes[id(n[1])][0], n[2], n[3]
            size = 3 + child * (lo + (1 if hi is None else hi - lo))
        sizes[id(n)] = (min(size, cap + 1), n)
    return sizes[id(node)][0]


def serialize_ast(node, deadline: float | None = None, budget_ms: int = 0) -> np.ndarray:
    """The AST in the prefix int32 form the native builder reads (layout in csrc/dfa.h).
    ``deadline`` (a ``time.monotonic()``): the compile time budget of ``budget_ms``, checked while
    large embedded automata are encoded. The core writes it (``tree_bindings.cpp``);
    ``_serialize_ast`` is the reference."""
    if core is not None:
        return core.tree_words(node, lambda dfa: _dfa_words(dfa, deadline, budget_ms))
    return _serialize_ast(node, deadline, budget_ms)


def _serialize_ast(node, deadline: float | None = None, budget_ms: int = 0) -> np.ndarray:
    """``serialize_ast`` in Python (the reference)."""
    chunks: list[np.ndarray] = []
    out: list[int] = []
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n[0]
        if kind == "set":
            out += (_SET, len(n[1]))
            for lo, hi in n[1]:
                out += (lo, hi)
        elif kind == "cat" or kind == "alt":
            out += (_CAT if kind == "cat" else _ALT, len(n[1]))
            stack.extend(reversed(n[1]))
        elif kind == "rep":
            out += (_REP, n[2], -1 if n[3] is None else n[3])
            stack.append(n[1])
        elif kind == "members":
            out += (_MEMBERS, len(n[1]), int(bool(n[2])))
            for req, child in reversed(n[1]):
                stack.append(child)
                stack.append(("req", bool(req)))
        elif kind == "req":  # a member's flag, just before it
            out.append(int(n[1]))
        elif kind == "list":
            out += (_LIST, n[2], -1 if n[3] is None else n[3])
            stack.append(n[1])
        elif kind == "dfa":
            # the same automaton is embedded at every use of a shared $ref or free-form value:
            # its encoding is computed once (per-row Python loops cost seconds on large schemas)
            chunks += (np.array(out, dtype=np.int32), _dfa_words(n[1], deadline, budget_ms))
            out = []
        else:
            raise AssertionError(kind)
    chunks.append(np.array(out, dtype=np.int32))
    return np.concatenate(chunks)


# rows of an embedded automaton encoded between two checks of the clock
WORDS_CHUNK = 8192


def _dfa_words(dfa: ByteDFA, deadline: float | None = None, budget_ms: int = 0) -> np.ndarray:
    """An embedded automaton's encoding: kind, states, start, accept flags, then per row the count
    of its (lo, hi, target) runs of equal live targets and the runs. Cached on the automaton.
    Encoded WORDS_CHUNK rows at a time, the clock checked between (``deadline``): a product of
    hundreds of thousands of states takes seconds."""
    cached = dfa.__dict__.get("_words")
    if cached is not None:
        return cached
    n = dfa.num_states
    head = np.array([_DFA, n, dfa.start], dtype=np.int32)
    parts = [head, np.asarray(dfa.accept, dtype=np.int32)]
    if dfa.transitions is not None:
        # over byte classes: the intervals of bytes of one class are where targets may change, and
        # a row's target on each is its class's column (no byte table is expanded)
        classes, columns = dfa.transitions
        first = np.concatenate(([0], np.flatnonzero(classes[1:] != classes[:-1]) + 1))
        at_first = np.asarray(classes, dtype=np.intp)[first]
    for at in range(0, n, WORDS_CHUNK):
        if deadline is not None and time.monotonic() > deadline:
            raise _time_budget_error(budget_ms)
        if dfa.transitions is None:
            parts.append(_rows_words(np.asarray(dfa.table[at : at + WORDS_CHUNK], dtype=np.int32)))
        else:
            rows = np.asarray(columns[at : at + WORDS_CHUNK], dtype=np.int32)[:, at_first]
            parts.append(_rows_words(rows, first))
    words = np.concatenate(parts)
    object.__setattr__(dfa, "_words", words)
    return words


def _rows_words(t: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
    """Rows ``t`` as ``_dfa_words`` lays them out: per row its count of runs, then the runs.
    ``t``: a byte table, int32 [n, 256]; or, given ``first`` (the first byte of each of a partition
    of the bytes into intervals every row treats alike, increasing), the targets on each interval,
    int32 [n, len(first)]."""
    n = t.shape[0]
    if first is None:
        # Runs can only change where some row's target changes: the byte intervals every row
        # treats alike (a few dozen, the automaton's byte classes), searched instead of all 256.
        first = np.concatenate(([0], np.flatnonzero((t[:, 1:] != t[:, :-1]).any(axis=0)) + 1))
        t = t[:, first]
    last = np.concatenate((first[1:] - 1, [255]))  # the last byte of each interval
    live = t >= 0
    starts = live.copy()  # a run starts at the first interval, or where the target changes
    starts[:, 1:] &= t[:, 1:] != t[:, :-1]
    ends = live.copy()  # and ends at the last one, or before a change
    ends[:, :-1] &= t[:, :-1] != t[:, 1:]
    rows, lo = np.nonzero(starts)  # row-major: runs in row order, bytes increasing
    _, hi = np.nonzero(ends)
    counts = np.bincount(rows, minlength=n)
    body = np.empty(n + 3 * len(rows), dtype=np.int32)
    before = np.cumsum(counts) - counts  # runs of the rows before each row
    row_at = np.arange(n) + 3 * before  # where each row's count goes
    body[row_at] = counts
    first_run = row_at[rows] + 1 + 3 * (np.arange(len(rows)) - before[rows])
    body[first_run] = first[lo]
    body[first_run + 1] = last[hi]
    body[first_run + 2] = t[rows, lo]
    return body


def _check_size(node, lim: Limits, sizes: SizeMemo | None = None) -> None:
    if expanded_size(node, lim.max_nfa_states, sizes) > lim.max_nfa_states:
        raise budget_error(
            f"constraint too large: more than {lim.max_nfa_states} automaton states once its repetitions "
            "and references are expanded",
            f"{lim.max_nfa_states} states",
            ENV["max_nfa_states"],
        )


def serialized(node, *, started: float | None = None, sizes: SizeMemo | None = None) -> np.ndarray:
    """``serialize_ast(node)`` for ``compile_words``: the expanded size checked first, as
    ``compile_ast`` does (a shared subtree is written once per use), within the compile time budget
    counted from ``started``. The words are the tree's identity where a caller looks built automata
    up by their trees (``jsonschema._Converter._embedded``). ``sizes``: ``expanded_size``'s memo,
    counted to the limits' ``max_nfa_states``."""
    lim = limits()
    deadline = (time.monotonic() if started is None else started) + lim.compile_ms / 1000
    _check_size(node, lim, sizes)
    return serialize_ast(node, deadline, lim.compile_ms)


def compile_words(words: np.ndarray, *, started: float | None = None, classes: bool = False) -> ByteDFA:
    """``compile_ast`` (native) of the tree ``serialized`` wrote as ``words``."""
    lim = limits()
    deadline = (time.monotonic() if started is None else started) + lim.compile_ms / 1000
    return _native_dfa(words, lim, deadline, classes)


def _native_dfa(words: np.ndarray, lim: Limits, deadline: float, classes: bool) -> ByteDFA:
    require_native()
    left_ms = _left_ms(deadline, lim)
    try:
        built = core.build_dfa(
            words, lim.max_states * SUBSET_FACTOR, lim.max_nfa_states, left_ms, lim.compile_mb << 20, classes=classes
        )
    except ValueError as exc:
        raise _native_error(str(exc), lim) from None
    if built[-1].shape[0] > lim.max_states:
        raise _states_error(lim.max_states)
    if classes:
        letter_of, table, accept = built
        return ByteDFA(table, accept, 0, classes=letter_of)
    table, accept = built
    return ByteDFA(table, accept, 0)


def _left_ms(deadline: float, lim: Limits) -> int:
    left_ms = int((deadline - time.monotonic()) * 1000)
    if left_ms <= 0:
        raise _time_budget_error(lim.compile_ms)
    return left_ms


def _native_error(message: str, lim: Limits) -> ConstraintError:
    """The core's ValueError as the ConstraintError that names the limit and its knob."""
    if "time budget" in message:
        return _time_budget_error(lim.compile_ms)
    if "memory budget" in message:
        return budget_error(message, f"{lim.compile_mb} MiB", ENV["compile_mb"])
    if f"more than {lim.max_states * SUBSET_FACTOR} automaton" in message:
        return _states_error(lim.max_states)
    if "automaton states" in message:
        return budget_error(message, f"{lim.max_nfa_states} states", ENV["max_nfa_states"])
    return ConstraintError(message)


def compile_ast(
    node,
    backend: str = "native",
    *,
    started: float | None = None,
    classes: bool = False,
    sizes: SizeMemo | None = None,
) -> ByteDFA:
    """``backend``: "native" (the C++ core) or "python" (the reference; same table, tests compare).
    ``classes``: the native core gives the automaton over byte classes (``ByteDFA``): for a whole
    constraint's automaton, which is compiled as it is; one that conversion code reads and combines
    (``table``) is better built dense, as the core expands it faster than numpy.

    Bounded by the limits in force (``limits.py``): the expanded size is checked before anything
    is built, and the construction stops once the compile time budget, counted from ``started``
    (a ``time.monotonic()``; default now), is spent. ``sizes``: ``expanded_size``'s memo for that
    check, counted to the limits' ``max_nfa_states`` (the JSON-schema converter's)."""
    lim = limits()
    deadline = _checked_deadline(node, lim, started, sizes)
    if backend == "native":
        words = serialize_ast(node, deadline, lim.compile_ms)  # counted in the budget: before left_ms is taken
        return _native_dfa(words, lim, deadline, classes)
    if backend != "python":
        raise ValueError(f"backend must be native or python, not {backend!r}")
    nfa = _NFA()
    s, e = nfa.build(node)
    table, accept = _determinize(nfa, s, e, deadline, lim.max_states * SUBSET_FACTOR)
    dfa = _trim_and_minimize(table, accept)
    if dfa.num_states > lim.max_states:
        raise _states_error(lim.max_states)
    return dfa


def ast_words(node, *, started: float | None = None, sizes: SizeMemo | None = None) -> np.ndarray:
    """``node`` serialised for the core (``serialize_ast``), once its expanded size is checked
    against the limits, within the compile time budget counted from ``started`` (arguments as for
    ``compile_ast``): the form an automaton is built from, whole or as it is walked, and kept."""
    lim = limits()
    deadline = _checked_deadline(node, lim, started, sizes)
    return serialize_ast(node, deadline, lim.compile_ms)


def lazy_words(words: np.ndarray, *, started: float | None = None) -> core.LazyDfa:
    """The automaton of the tree ``words`` holds (``ast_words``), built as it is walked
    (``csrc/lazy_dfa.h``): only its NFA now, within what is left of the compile time budget counted
    from ``started``; its states as walks and mask rows reach them, at most as many as a whole
    construction may find (``max_states`` x SUBSET_FACTOR), within ``compile_mb`` in all and the
    whole ``compile_ms`` per walk or mask row (not what was left of it when the NFA was built): a
    call past those raises ValueError. The states are not minimal (the state limit counts these,
    not a minimal automaton's); each reaches acceptance."""
    require_native()
    lim = limits()
    left_ms = _left_ms((time.monotonic() if started is None else started) + lim.compile_ms / 1000, lim)
    try:
        return core.LazyDfa(
            words, lim.max_states * SUBSET_FACTOR, lim.max_nfa_states, left_ms, lim.compile_mb << 20, lim.compile_ms
        )
    except ValueError as exc:
        raise _native_error(str(exc), lim) from None


@dataclass(frozen=True)
class TreeFacts:
    """What the core would build from a tree's ``words`` (``tree_facts``): its NFA's states and
    moves, and one shortest answer over the bytes asked about (None: none over those bytes)."""

    states: int
    moves: int
    answer: bytes | None

    def nfa_fits(self, lim: Limits) -> bool:
        """Whether ``lazy_words`` would build the NFA within the limits: its states exactly, its
        memory with room to spare (the core charges 64 bytes a state and 8 a move, and then the
        start state's subset, which this does not know)."""
        return self.states <= lim.max_nfa_states and 64 * self.states + 8 * self.moves <= (lim.compile_mb << 20) // 2


def tree_facts(words: np.ndarray, usable: np.ndarray = EVERY_BYTE) -> TreeFacts:
    """The NFA ``lazy_words`` would build from ``words``, found without building it
    (``csrc/tree_facts.h``): its states and moves, exactly as the builder counts them (counting
    stops past the limits' ``max_nfa_states``), and one shortest answer whose bytes all have
    ``usable`` (bool or uint8 [256]). One walk over the words, several times cheaper than the NFA:
    a frontend checks a new constraint with it, and the engine builds the NFA. Within the compile
    time budget; ConstraintError past it."""
    require_native()
    lim = limits()
    try:
        states, moves, answer = core.tree_facts(
            words, np.ascontiguousarray(usable, dtype=np.uint8), lim.max_nfa_states, lim.compile_ms
        )
    except ValueError as exc:
        raise _native_error(str(exc), lim) from None
    return TreeFacts(int(states), int(moves), answer)


def lazy_ast(node, *, started: float | None = None, sizes: SizeMemo | None = None) -> core.LazyDfa:
    """``node``'s automaton built as it is walked: ``lazy_words`` of ``ast_words`` (same arguments
    and limits)."""
    started = time.monotonic() if started is None else started
    return lazy_words(ast_words(node, started=started, sizes=sizes), started=started)


def _checked_deadline(node, lim: Limits, started: float | None, sizes: SizeMemo | None) -> float:
    """The compile time budget's deadline counted from ``started`` (default now), once ``node``'s
    expanded size is checked against the limits and the budget is not spent already."""
    deadline = (time.monotonic() if started is None else started) + lim.compile_ms / 1000
    _check_size(node, lim, sizes)
    if time.monotonic() > deadline:
        raise _time_budget_error(lim.compile_ms)
    return deadline


def compile_regex(pattern: str, backend: str = "native") -> ByteDFA:
    """Compile ``pattern`` (full-match semantics) to a trimmed, minimal byte DFA."""
    started = time.monotonic()
    return compile_ast(parse(pattern), backend, started=started)
