"""The deploy step-plan parser (`--steps`): strictly rising percentages in 1..100 that end at 100."""

from __future__ import annotations

import pytest

from llmserve.deploy import DEFAULT_STEPS, parse_steps
from llmserve.errors import ExitCode, InvalidInputError


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("10,25,50,100", [10, 25, 50, 100]),
        ("100", [100]),
        ("1,2,3,100", [1, 2, 3, 100]),
        (" 10 , 100 ", [10, 100]),
        ("10,,100,", [10, 100]),
    ],
)
def test_valid_plans(text, steps):
    assert parse_steps(text) == steps


def test_the_default_plan_is_valid():
    assert parse_steps(",".join(map(str, DEFAULT_STEPS))) == DEFAULT_STEPS


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a,100", "comma-separated percentages"),
        ("10;100", "comma-separated percentages"),
        ("1.5,100", "comma-separated percentages"),
        ("", "must rise strictly"),
        ("10,50", "must rise strictly"),
        ("10,5,100", "must rise strictly"),
        ("10,10,100", "must rise strictly"),
        ("0,100", "must rise strictly"),
        ("-10,100", "must rise strictly"),
        ("50,150", "must rise strictly"),
    ],
)
def test_invalid_plans_are_input_errors(text, words):
    with pytest.raises(InvalidInputError, match=words) as caught:
        parse_steps(text)
    assert caught.value.exit_code == ExitCode.INVALID_INPUT
    assert f"--steps '{text}'" in caught.value.message
