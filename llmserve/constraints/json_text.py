"""A constraint given as JSON text (a request's ``constraint`` key, a ``json_schema`` string), read."""

from __future__ import annotations

import json
from typing import Any

from llmserve.constraints.errors import ConstraintError


def read_json_text(text: str | bytes, what: str) -> Any:
    """``json.loads`` of ``text``; ConstraintError naming ``what`` when it is not JSON, or nests deeper than the
    parser recurses (a 5,000-level schema sent as a string was a 500: the request body's own depth limit never saw
    inside the string)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConstraintError(f"{what} is nested too deeply to read") from None
