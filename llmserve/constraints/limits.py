"""What compiling and caching constraints may cost: every limit in one place, read from the
environment once per process (``LIMITS``; tests build their own ``Limits``).

A constraint arrives with a request, so whatever compiling it costs, a client chooses. Each limit
below turns "too expensive" into a ConstraintError (HTTP 400 / INVALID_ARGUMENT) that names the
limit, instead of a server that stalls or runs out of memory:

=====================================  =========  ==================================================
variable                               default    bounds
=====================================  =========  ==================================================
LLMSERVE_CONSTRAINT_COMPILE_MS         2000       wall-clock time of one constraint's automaton
                                                  construction (checked inside the C++ loops)
LLMSERVE_CONSTRAINT_COMPILE_MB         512        memory of that construction (NFA, subsets)
LLMSERVE_CONSTRAINT_MAX_STATES         65536      states of the byte automaton, counted once
                                                  minimised: 4 bytes per byte class each for its
                                                  transitions (about 230 for a JSON schema), and a
                                                  mask row of vocabulary-size bits (16 KiB at 128k
                                                  tokens) for each state a request reaches until
                                                  the form is compressed (COMPLETE_MAX_MB);
                                                  the construction may pass through
                                                  regex.SUBSET_FACTOR times as many (bounded by the
                                                  time and memory budgets too)
LLMSERVE_CONSTRAINT_MAX_NFA_STATES     2000000    size of the expanded expression: counted
                                                  repetitions (``{n}``) and ``$ref`` fan-out are
                                                  counted before anything is built
LLMSERVE_CONSTRAINT_CACHE_MB           1024       compiled constraints (automata and mask tables)
                                                  kept in memory, least recently used evicted; those
                                                  a running request uses stay (it holds them)
LLMSERVE_CONSTRAINT_DISK_CACHE_MB      4096       the on-disk cache ($LLMSERVE_CACHE/constraints),
                                                  least recently used files deleted
LLMSERVE_CONSTRAINT_COMPLETE_MAX_MB    256        a constraint's mask rows once compressed: the
                                                  background completion compresses them row by row
                                                  and gives up past this (never holding the dense
                                                  table); such a form is not cached on disk and
                                                  computes only the rows requests reach
=====================================  =========  ==================================================

The native core reads three more variables itself, when it loads; they are checked here too, so a
malformed value is an error rather than the default in silence:

=====================================  =========  ==================================================
LLMSERVE_CONSTRAINT_THREADS            CPUs (16)  the mask pool's threads (1 to 4096)
LLMSERVE_CONSTRAINT_SPIN_US            200        how long an idle pool worker spins before it
                                                  sleeps (0: never spins)
LLMSERVE_CONSTRAINT_SPIN_BACKOFF_US    50000      how long workers stop spinning once the CPUs are
                                                  oversubscribed (0: never back off)
=====================================  =========  ==================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llmserve.constraints.errors import ConstraintError

ENV = {
    "compile_ms": "LLMSERVE_CONSTRAINT_COMPILE_MS",
    "compile_mb": "LLMSERVE_CONSTRAINT_COMPILE_MB",
    "max_states": "LLMSERVE_CONSTRAINT_MAX_STATES",
    "max_nfa_states": "LLMSERVE_CONSTRAINT_MAX_NFA_STATES",
    "cache_mb": "LLMSERVE_CONSTRAINT_CACHE_MB",
    "disk_cache_mb": "LLMSERVE_CONSTRAINT_DISK_CACHE_MB",
    "complete_max_mb": "LLMSERVE_CONSTRAINT_COMPLETE_MAX_MB",
}

# read by the native core (csrc/thread_pool.cpp) at load: the least and the most value each may take
CORE_ENV = {
    "LLMSERVE_CONSTRAINT_THREADS": (1, 4096),
    "LLMSERVE_CONSTRAINT_SPIN_US": (0, 10**12),
    "LLMSERVE_CONSTRAINT_SPIN_BACKOFF_US": (0, 10**12),
}


def _whole_number(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _plain_digits(text: str) -> int | None:
    """``text`` as the core reads it (C's strtoll/atoi): ASCII digits only, no sign, no ``_``."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


@dataclass(frozen=True)
class Limits:
    compile_ms: int = 2000
    compile_mb: int = 512
    max_states: int = 65_536
    max_nfa_states: int = 2_000_000
    cache_mb: int = 1024
    disk_cache_mb: int = 4096
    complete_max_mb: int = 256

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Limits:
        """The defaults, overridden by the variables in ENV that are set (positive integers). The
        core's own variables (CORE_ENV) are checked as well."""
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for field, var in ENV.items():
            text = env.get(var)
            if text is None or text == "":
                continue
            value = _whole_number(text)
            if value is None or value <= 0:
                # a configuration error, found at the first constraint: never silently unlimited
                raise ConstraintError(f"{var}={text!r} must be a positive integer", hint=f"Unset {var} or fix it.")
            values[field] = value
        for var, (least, most) in CORE_ENV.items():
            text = env.get(var)
            if text is None or text == "":
                continue
            value = _plain_digits(text)
            if value is None or not least <= value <= most:
                # the core would take its default, or read another number, without a word
                what = f"a whole number from {least} to {most}" + ("" if least > 0 else " (microseconds)")
                raise ConstraintError(f"{var}={text!r} must be {what}", hint=f"Unset {var} or fix it.")
        return cls(**values)

    @property
    def cache_bytes(self) -> int:
        return self.cache_mb << 20

    @property
    def disk_cache_bytes(self) -> int:
        return self.disk_cache_mb << 20


_LIMITS: Limits | None = None


def limits() -> Limits:
    """The process's limits (read from the environment on first use)."""
    global _LIMITS
    if _LIMITS is None:
        _LIMITS = Limits.from_env()
    return _LIMITS


def set_limits(value: Limits | None) -> None:
    """Replace the process's limits (None: read the environment again on next use). For tests and
    for a server that takes them from its own options."""
    global _LIMITS
    _LIMITS = value


def budget_error(what: str, limit: str, var: str) -> ConstraintError:
    """A ConstraintError for a constraint over one of the limits: names the limit and the knob."""
    return ConstraintError(
        f"{what} (limit: {limit})",
        hint=f"Simplify the constraint, or raise {var} on the server if such constraints are expected.",
    )
