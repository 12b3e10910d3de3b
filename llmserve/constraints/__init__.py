"""Constraint processor: per-request token-level state machines enforced inside the decode loop.

Public surface:

* ``ConstraintSpec`` / ``spec_from_request``: regex, choice, json_schema (``jsonschema.py`` lists what
  is supported and how; ``schema_strings.py``, ``schema_numbers.py``, ``schema_merge.py`` hold the parts)
* ``budget.py``: per automaton state the fewest tokens to the end, with which the processor makes a
  constrained answer end within ``max_tokens``
* ``Vocab``: a tokenizer's tokens as bytes (``Vocab.from_hf_tokenizer``, ``Vocab.from_tiktoken_ranks``)
* ``compile_constraint(spec, vocab)`` -> ``CompiledConstraint`` (cached on disk by (constraint, vocab) digest)
* ``ByteAutomaton``, ``TokenStateMachine``, ``register_machine``: custom constraints
* ``llmserve.constraints.vllm_processor:ConstraintLogitsProcessor``: the vLLM V1 batch-level processor
  (imported lazily: it needs vllm)
* native core ``llmserve.constraints._core`` (C++, csrc/) and its pure-Python reference ``reference``
"""

from llmserve.constraints.compiled import CompiledConstraint, compile_dfa
from llmserve.constraints.compiler import compile_constraint, load_cached
from llmserve.constraints.disk_cache import default_cache_dir
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.machine import ByteAutomaton, TokenStateMachine, automaton_to_dfa, register_machine
from llmserve.constraints.regex import ByteDFA, compile_regex
from llmserve.constraints.spec import ConstraintSpec, spec_from_request
from llmserve.constraints.vocab import Vocab

PROCESSOR_PATH = "llmserve.constraints.vllm_processor:ConstraintLogitsProcessor"
# The processor implements vLLM's V1 logits-processor interface only: engines must run with
# VLLM_USE_V2_MODEL_RUNNER=0 (check-compat can read these two constants without importing vllm).
V2_MODEL_RUNNER_SUPPORTED = False
REQUIRED_ENGINE_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}

__all__ = [
    "PROCESSOR_PATH",
    "REQUIRED_ENGINE_ENV",
    "V2_MODEL_RUNNER_SUPPORTED",
    "ByteAutomaton",
    "ByteDFA",
    "CompiledConstraint",
    "ConstraintError",
    "ConstraintSpec",
    "TokenStateMachine",
    "Vocab",
    "automaton_to_dfa",
    "compile_constraint",
    "compile_dfa",
    "compile_regex",
    "default_cache_dir",
    "load_cached",
    "register_machine",
    "spec_from_request",
]
