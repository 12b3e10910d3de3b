"""Errors of the constraint package.

``ConstraintError`` is both an llmserve ``InvalidInputError`` (the CLI renders it with a hint) and a
``ValueError``: vLLM turns a ``ValueError`` raised from a logits processor's ``validate_params`` into an
HTTP 400 for the client, so a bad constraint is rejected, never silently dropped.
"""

from __future__ import annotations

from llmserve.errors import InvalidInputError


class ConstraintError(InvalidInputError, ValueError):
    code = "invalid-constraint"
    default_hint = (
        "Check the request's constraint (regex, choice or json_schema); "
        "see `python -m pydoc llmserve.constraints` for the supported subset."
    )


def no_string_left(exc: ConstraintError) -> bool:
    """Whether ``exc`` says that no string is left (an intersection or a pattern matching nothing), as opposed to a
    refusal: a caller may then leave the value out (``Unsatisfiable``) instead of refusing the schema."""
    return "no string satisfies" in exc.message or "matches no string" in exc.message


def fresh(exc: ConstraintError) -> ConstraintError:
    """A new error equal to ``exc``, never raised: what a remembered refusal is kept as and raised again as. Raising
    one object again chains each raise's frames onto its traceback, and the frames hold the request: memory that
    grew with every request repeating a refused constraint (8-21 MB each, measured)."""
    return type(exc)(exc.message, exc.hint, details=list(exc.details))
