"""JSON numbers with JSON Schema's bounds (``minimum``/``maximum``, ``exclusiveMinimum``/``exclusiveMaximum``).

An integer range becomes a regular expression over its decimal digits (one branch per digit count,
the classic split of a range into prefixes that share digits), so the automaton stays linear in
the number of digits. An open side of a range stops at 16 digits (or at the digits of the other
side's bound, when that has more).

A bounded ``number`` is generated as an integer in the range (a subset of the numbers the schema
accepts: every answer validates; fractions are not produced when bounds are given), or, when no
integer lies in it (``exclusiveMinimum: 0, exclusiveMaximum: 1``), as the decimals of fewest
digits in it (up to ``MAX_FRACTIONS`` of them: ``0.1`` to ``0.9``; ``_fractions``).

A fractional ``multipleOf`` (``0.1``) is generated as the integers ``jsonschema`` counts as its
multiples (it divides as floats: ``0.3 / 0.1`` is not whole there, so fractions are left out),
within ``±FRACTION_RANGE``, when they are every ``m``-th integer there (checked one by one).
"""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np

from llmserve.constraints.dfa_ops import intersect
from llmserve.constraints.errors import ConstraintError, no_string_left
from llmserve.constraints.regex import ByteDFA, compile_ast, literal, parse
from llmserve.constraints.schema_merge import Unsatisfiable

MAX_DIGITS = 16
_CAP = 10**MAX_DIGITS - 1
# Unbounded digit runs: a counted {0,15} costs a state per digit in every number of a schema, and
# the answer's length is bounded by max_tokens steering (budget.py), not by the grammar. Exponents
# stay at two digits (1e999 would read back as infinity).
INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]{1,2})?"


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of one length between ``lo`` and ``hi`` (inclusive)."""
    if lo == hi:
        return lo
    if lo[0] == hi[0]:
        return lo[0] + "(" + _same_length(lo[1:], hi[1:]) + ")"
    rest = len(lo) - 1
    if rest == 0:
        return f"[{lo[0]}-{hi[0]}]"
    branches = []
    if lo[1:] == "0" * rest:
        low_first = int(lo[0])
    else:
        branches.append(lo[0] + "(" + _same_length(lo[1:], "9" * rest) + ")")
        low_first = int(lo[0]) + 1
    if hi[1:] == "9" * rest:
        high_first = int(hi[0])
        tail = None
    else:
        high_first = int(hi[0]) - 1
        tail = hi[0] + "(" + _same_length("0" * rest, hi[1:]) + ")"
    if low_first <= high_first:
        branches.append(f"[{low_first}-{high_first}][0-9]{{{rest}}}")
    if tail is not None:
        branches.append(tail)
    return "(" + "|".join(branches) + ")"


def natural_range(a: int, b: int) -> str:
    """A regex of the decimal numerals (no leading zeros) of a <= n <= b, 0 <= a <= b."""
    parts = []
    for length in range(len(str(a)), len(str(b)) + 1):
        lo = max(a, 10 ** (length - 1) if length > 1 else 0)
        hi = min(b, 10**length - 1)
        if lo <= hi:
            parts.append(_same_length(str(lo), str(hi)))
    return "(" + "|".join(parts) + ")"


def integer_range(lo: int | None, hi: int | None, digits: int = MAX_DIGITS) -> str:
    """A regex of the integers in [lo, hi] (None: unbounded on that side, within ``digits`` digits,
    or as many as the other bound has: ``minimum: 1e17`` leaves the 18-digit integers from there)."""
    cap = 10**digits - 1
    if hi is None:
        hi = max(cap, 10 ** len(str(abs(lo))) - 1) if lo is not None else cap
    if lo is None:
        lo = min(-cap, -(10 ** len(str(abs(hi))) - 1))
    if lo > hi:
        raise ConstraintError(f"json_schema: no integer lies between the bounds {lo} and {hi}")
    branches = []
    if lo < 0:
        branches.append("-" + natural_range(max(1, -hi), -lo))
    if hi >= 0:
        branches.append(natural_range(max(lo, 0), hi))
    return "(" + "|".join(branches) + ")"


def _bound(schema: dict, key: str):
    value = schema.get(key)
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ConstraintError(f"json_schema: {key} must be a number, got {value!r}")
    return value


def integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    """The integer range a schema's bounds leave (draft 4's boolean exclusive* included)."""
    lo, hi = _bound(schema, "minimum"), _bound(schema, "maximum")
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    ilo = None if lo is None else _ceil(lo)
    ihi = None if hi is None else _floor(hi)
    if ex_lo is True and lo is not None and ilo == lo:  # draft 4: a flag on minimum
        ilo = int(lo) + 1
    if ex_hi is True and hi is not None and ihi == hi:
        ihi = int(hi) - 1
    x_lo, x_hi = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    if x_lo is not None:
        candidate = x_lo + 1 if isinstance(x_lo, int) else _short(math.floor(x_lo) + 1, up=True)
        ilo = candidate if ilo is None else max(ilo, candidate)
    if x_hi is not None:
        candidate = x_hi - 1 if isinstance(x_hi, int) else _short(math.ceil(x_hi) - 1, up=False)
        ihi = candidate if ihi is None else min(ihi, candidate)
    return ilo, ihi


# A float bound past 2**53 is a long integer exactly (1e300 is 10**300 plus 284 digits of binary
# rounding), and a range's regex nests a group per digit the bound does not end in zeros with: an
# integer bound from a float is rounded inward to 17 significant digits (its precision), a subset.
_SIGNIFICANT = 17


def _ceil(x: float) -> int:
    """The least integer >= ``x`` (from a float: with at most _SIGNIFICANT significant digits)."""
    return x if isinstance(x, int) else _short(math.ceil(x), up=True)


def _floor(x: float) -> int:
    """The greatest integer <= ``x`` (from a float: with at most _SIGNIFICANT significant digits)."""
    return x if isinstance(x, int) else _short(math.floor(x), up=False)


def _short(n: int, up: bool) -> int:
    """``n`` rounded away from the bound it came from (up: to larger) to _SIGNIFICANT digits."""
    scale = 10 ** max(0, len(str(abs(n))) - _SIGNIFICANT)
    return -(-n // scale) * scale if up else n // scale * scale


BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


# a multipleOf automaton has a state per remainder
MAX_MULTIPLE = 10_000
_SAFE = 2**53 - 1


def multiples_dfa(m: int):
    """The JSON integers (``INTEGER``'s texts) divisible by ``m``: the decimal digits read left to
    right keep the value's remainder mod ``m`` (r -> (10 r + d) mod m), exact; the sign does not
    change divisibility. States: 0 start, 1 after '-', 2 after a leading '0' (done), 3 + r."""
    table = np.full((3 + m, 256), -1, dtype=np.int32)
    accept = np.zeros(3 + m, dtype=np.uint8)
    table[0, ord("-")] = 1
    for s in (0, 1):
        table[s, ord("0")] = 2
        for d in range(1, 10):
            table[s, ord("0") + d] = 3 + d % m
    for r in range(m):
        for d in range(10):
            table[3 + r, ord("0") + d] = 3 + (10 * r + d) % m
    accept[2] = accept[3] = 1
    return ByteDFA(table, accept, 0)


def _decimal_split(m: int) -> tuple[int, int]:
    """``m`` as ``d * 10**k`` with ``d`` not a multiple of ten: (d, k)."""
    k = len(str(m)) - len(str(m).rstrip("0"))
    return m // 10**k, k


def _multiples(m: int) -> ByteDFA:
    """The JSON integers divisible by ``m``: by ``d`` (``multiples_dfa``, a state per remainder)
    then ``k`` zeros, for ``m = d * 10**k`` (1e6 is six zeros after any integer, not a million
    states); zero itself."""
    d, k = _decimal_split(m)
    if k == 0:
        return multiples_dfa(d)
    head = intersect([multiples_dfa(d), compile_ast(parse("-?[1-9][0-9]*"))])
    return compile_ast(("alt", [literal("0"), ("cat", [("dfa", head), literal("0" * k)])]))


MAX_FRACTIONS = 50
FRACTION_RANGE = 10_000


def _admits(schema: dict, x: float) -> bool:
    """Whether ``x`` meets the schema's bounds, compared as ``jsonschema`` does (floats)."""
    lo, hi = _bound(schema, "minimum"), _bound(schema, "maximum")
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if lo is not None and (x < lo or (ex_lo is True and x == lo)):
        return False
    if hi is not None and (x > hi or (ex_hi is True and x == hi)):
        return False
    x_lo, x_hi = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    return (x_lo is None or x > x_lo) and (x_hi is None or x < x_hi)


def _fractions(schema: dict):
    """A bounded ``number`` range that holds no integer: the decimals with the fewest digits after
    the point that lie in it (at most MAX_FRACTIONS of them, a subset)."""
    values = [v for v in (_bound(schema, k) for k in BOUND_KEYS) if v is not None]
    if not values:
        return None
    lo, hi = min(values), max(values)
    for digits in range(1, 7):
        scale = 10**digits
        start = math.floor(lo * scale) - 1
        stop = min(math.ceil(hi * scale) + 1, start + 10 * MAX_FRACTIONS)
        texts = []
        for m in range(start, stop + 1):
            text = str(Decimal(m).scaleb(-digits))
            x = float(text)
            if not x.is_integer() and _admits(schema, x):
                texts.append(text)
        if texts:
            return ("alt", [literal(t) for t in texts[:MAX_FRACTIONS]])
    return None


def _window(lo: int | None, hi: int | None, multiple: float) -> tuple[int, int]:
    """The integers of [lo, hi] a fractional ``multipleOf`` is generated over: the FRACTION_RANGE
    nearest zero on either side, or the 2 x FRACTION_RANGE from the bound nearest zero when the
    range lies past them; within 2**53 (past it jsonschema's float division is inexact)."""
    span = FRACTION_RANGE
    if lo is not None and lo > span:
        lo, hi = lo, lo + 2 * span if hi is None else min(hi, lo + 2 * span)
    elif hi is not None and hi < -span:
        lo, hi = hi - 2 * span if lo is None else max(lo, hi - 2 * span), hi
    else:
        lo, hi = -span if lo is None else max(lo, -span), span if hi is None else min(hi, span)
    if max(abs(lo), abs(hi)) > _SAFE:
        raise _past_safe(multiple)
    return lo, hi


def _past_safe(multiple: float) -> ConstraintError:
    return ConstraintError(
        f"json_schema: multipleOf {multiple} with bounds past 2**53 is not supported (jsonschema divides "
        "as floats, which are inexact there)"
    )


def _fraction_multiples(schema: dict, multiple: float):
    """A fractional ``multipleOf``: the integers ``k`` within the bounds (and ±FRACTION_RANGE) with
    ``k / multiple`` whole as floats (``jsonschema``'s test), when those are exactly the multiples
    of one integer ``m`` there; refused otherwise."""
    lo, hi = _window(*integer_bounds(schema), multiple)

    def whole(ks: np.ndarray) -> np.ndarray:
        # float64 division as Python's int / float does it (every k here is exact as a float); a
        # quotient past the float range (a tiny multipleOf) is no verdict this can reproduce
        with np.errstate(over="ignore"):
            q = ks.astype(np.float64) / multiple
        if not np.isfinite(q).all():
            raise ConstraintError(f"json_schema: multipleOf {multiple} is not supported (its quotients overflow)")
        return q == np.trunc(q)

    candidates = np.arange(1, FRACTION_RANGE + 1, dtype=np.int64)
    found = np.flatnonzero(whole(candidates))
    step = int(candidates[found[0]]) if len(found) else None
    ks = np.arange(lo, hi + 1, dtype=np.int64)
    if step is None or step > MAX_MULTIPLE or bool(np.any(whole(ks) != (ks % step == 0))):
        raise ConstraintError(f"json_schema: multipleOf {multiple} is not supported (its multiples are not regular)")
    node = parse(integer_range(lo, hi))
    if step == 1:
        return node
    try:
        return ("dfa", intersect([compile_ast(node), multiples_dfa(step)]))
    except ConstraintError as exc:
        if no_string_left(exc):
            raise Unsatisfiable(f"json_schema: no multiple of {multiple} lies between the bounds") from None
        raise


def number_ast(schema: dict, integer: bool):
    """``integer`` or ``number`` with its bounds and ``multipleOf`` (a whole number: integers only,
    a subset for ``number``; a fraction is refused: ``jsonschema`` divides floats, so 0.3 is not a
    multiple of 0.1 there, and a regular language of its verdicts is not worth having)."""
    multiple = schema.get("multipleOf")
    if multiple is not None:
        if isinstance(multiple, bool) or not isinstance(multiple, (int, float)) or multiple <= 0:
            raise ConstraintError(f"json_schema: multipleOf must be a positive number, got {multiple!r}")
        if multiple != int(multiple) and isinstance(multiple, float):
            return _fraction_multiples(schema, multiple)
        if multiple != int(multiple) or _decimal_split(int(multiple))[0] > MAX_MULTIPLE:
            raise ConstraintError(
                f"json_schema: multipleOf {multiple} is not supported (only whole numbers up to {MAX_MULTIPLE}, "
                "times a power of ten)"
            )
        integer = True
    if isinstance(multiple, float) and multiple != 1:
        # jsonschema divides by a float multipleOf (16.0) as floats: a multiple's quotient is exact
        # only while the value is below 2**53
        lo, hi = integer_bounds(schema)
        if (lo is not None and lo > _SAFE) or (hi is not None and hi < -_SAFE):
            raise _past_safe(multiple)
        lo = -_SAFE if lo is None else max(lo, -_SAFE)
        hi = _SAFE if hi is None else min(hi, _SAFE)
        node = parse(integer_range(lo, hi))
    elif not any(k in schema for k in BOUND_KEYS):
        node = parse(INTEGER if integer else NUMBER)
    else:
        lo, hi = integer_bounds(schema)
        fractions = _fractions(schema) if not integer and lo is not None and hi is not None and lo > hi else None
        if fractions is not None:
            return fractions
        # an open side reaches past a large multipleOf (1e17 with minimum 1)
        digits = max(MAX_DIGITS, len(str(int(multiple))) + 1) if multiple is not None else MAX_DIGITS
        node = parse(integer_range(lo, hi, digits))
    if multiple is None or int(multiple) == 1:
        return node
    try:
        return ("dfa", intersect([compile_ast(node), _multiples(int(multiple))]))
    except ConstraintError as exc:
        if no_string_left(exc):
            raise Unsatisfiable(f"json_schema: no multiple of {multiple} lies between the bounds") from None
        raise
