"""Where a request's check runs (llmserve.serve.constraint_checks.request_check) and what the metaschema check costs
(constraint_keys.schema_problem): a burst of new schemas must not hold the default executor that requests without
a constraint are checked on, and a schema is checked against its metaschema once, within a bound."""

from __future__ import annotations

import asyncio
import threading

from llmserve.serve import constraint_keys
from llmserve.serve.constraint_checks import THREAD_PREFIX, request_check
from llmserve.serve.constraint_keys import kserve_constrained, openai_constrained
from llmserve.serve.kserve.protocol import DecodedTensor


def test_a_constrained_check_runs_on_a_check_thread_and_any_other_on_the_default_executor():
    async def both() -> tuple[str, str]:
        name = lambda: threading.current_thread().name  # noqa: E731
        return await request_check(name, constrained=True), await request_check(name, constrained=False)

    constrained, plain = asyncio.run(both())
    assert constrained.startswith(THREAD_PREFIX) and not plain.startswith(THREAD_PREFIX)


def test_which_requests_carry_a_constraint():
    assert openai_constrained({"response_format": {"type": "json_schema", "json_schema": {}}})
    assert openai_constrained({"response_format": {"type": "json_object"}})
    assert openai_constrained({"structured_outputs": {"regex": "a"}})
    assert openai_constrained({"guided_json": {}})
    assert openai_constrained({"vllm_xargs": {"constraint_regex": "a"}})
    assert not openai_constrained({"response_format": {"type": "text"}, "vllm_xargs": {"x": 1}, "messages": []})
    assert not openai_constrained([1])
    assert kserve_constrained({"constraint_choice": "[]"})
    assert kserve_constrained({}, [DecodedTensor("sampling_parameters", "BYTES", [1], [b'{"structured_outputs": {}}'])])
    assert not kserve_constrained({"max_tokens": 3}, [DecodedTensor("text_input", "BYTES", [1], [b"constraint"])])


def test_the_metaschema_check_is_remembered_and_bounded(monkeypatch):
    calls = []
    real = constraint_keys._metaschema_verdict
    monkeypatch.setattr(constraint_keys, "_metaschema_verdict", lambda s: calls.append(1) or real(s))
    monkeypatch.setattr(constraint_keys, "METASCHEMA_MAX_SUBSCHEMAS", 50)
    bad = {"type": "object", "properties": {"a": {"type": "strin"}}}
    assert "strin" in constraint_keys.schema_problem(bad)
    assert "strin" in constraint_keys.schema_problem({"properties": {"a": {"type": "strin"}}, "type": "object"})
    assert calls == [1]  # the same schema (keys in any order): checked once
    huge = {"anyOf": [{"type": "strin"} for _ in range(60)]}
    assert constraint_keys.schema_problem(huge) is None and calls == [1]  # over the bound: the converter judges


def test_a_constraint_checked_before_is_known_and_skips_the_check_queue(tmp_path, monkeypatch):
    """A request whose constraints this process checked (or refused) before is answered from memory: it need not
    queue behind a burst of new ones (a cached schema waited 19-26 s behind 50 new ones)."""
    from llmserve.constraints.compiler import check_constraint
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.spec import spec_from_request
    from llmserve.serve.constraint_keys import openai_constraints_known

    monkeypatch.setenv("LLMSERVE_CACHE", str(tmp_path))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}
    assert not openai_constraints_known(body)
    check_constraint(spec_from_request({"json_schema": schema}))
    assert openai_constraints_known(body)
    assert openai_constraints_known({"structured_outputs": {"json": schema}})
    # every constraint must be known; a refused one is known too
    assert not openai_constraints_known({**body, "vllm_xargs": {"constraint_regex": "[a-c]{2}x"}})
    bad = {"type": "string", "minLength": 3, "maxLength": 2}
    try:
        check_constraint(spec_from_request({"json_schema": bad}))
    except ConstraintError:
        pass
    assert openai_constraints_known({"vllm_xargs": {"constraint_json_schema": bad}})
    assert not openai_constraints_known({"guided_json": schema, **body})
    assert not openai_constraints_known({"structured_outputs": {"json": schema, "bogus": 1}})


def test_a_known_constraints_check_has_a_thread_new_ones_never_queue_on():
    from concurrent.futures import ThreadPoolExecutor

    from llmserve.serve.constraint_checks import on_check_thread

    name = lambda: threading.current_thread().name  # noqa: E731
    with ThreadPoolExecutor(1) as caller:  # the caller is a worker thread, as check_request's is
        known = caller.submit(on_check_thread, name, known=True).result()
        new = caller.submit(on_check_thread, name).result()
    assert known.startswith(f"{THREAD_PREFIX}-known") and new.startswith(THREAD_PREFIX) and "known" not in new


def test_data_does_not_count_as_subschemas():
    """Padding a schema with data (an annotation holding 10,001 objects) skipped the metaschema check."""
    pad = {"x-pad": [{} for _ in range(10_001)]}
    assert "is not of type 'string'" in constraint_keys.schema_problem(
        {"type": "object", "required": [{"a": 1}], **pad}
    )
