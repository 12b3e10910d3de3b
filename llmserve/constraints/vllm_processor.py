"""The constraint processor as a vLLM V1 batch-level logits processor.

Load it with the engine argument ``logits_processors=["llmserve.constraints.vllm_processor:ConstraintLogitsProcessor"]``
(or the class itself). Requires the V1 model runner: run with ``VLLM_USE_V2_MODEL_RUNNER=0`` (see
``V2_MODEL_RUNNER_SUPPORTED`` and ``REQUIRED_ENGINE_ENV``); the processor refuses to start under
Model Runner V2 rather than let a deployment run unconstrained.

Request shape
-------------
The constraint travels in ``SamplingParams.extra_args`` (over HTTP: the request body's
``vllm_xargs``, whose values must be strings, numbers or lists of those). Exactly one of:

* ``{"constraint": {"regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}}`` (in-process; an object)
* ``{"constraint": "{\\"json_schema\\": {...}}"}`` (HTTP: the same object as a JSON string)
* ``{"constraint_regex": "..."}``, ``{"constraint_choice": ["yes", "no"]}``,
  ``{"constraint_json_schema": "<schema as a JSON string>"}`` (flat HTTP form)
* ``{"constraint": {"machine": "name", "args": {...}}}``: a registered custom machine
  (``llmserve.constraints.machine.register_machine`` or the ``llmserve.constraint_machines`` entry points)

For example::

    curl localhost:8000/v1/completions -d '{"model": "m", "prompt": "Date: ",
         "vllm_xargs": {"constraint_regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}}'

An invalid constraint raises ``ConstraintError`` (a ``ValueError``) from ``validate_params``: vLLM
answers HTTP 400. Requests without these keys are not touched.

Answers that complete within ``max_tokens``
------------------------------------------
Each constraint's form knows, per automaton state, the fewest tokens to an accepting state
(``budget.py``; a new constraint, served from its automaton built as it is walked, a single-byte
bound on it: ``lazy_form.py``). While a row has more tokens left than its constraint's largest such distance
nothing changes; past that, only the tokens after which the answer can still end in time (end of
sequence included) are allowed, so the model is steered to close strings, arrays and objects and to
stop adding optional members: the answer ends with ``finish_reason: "stop"``. A request whose
shortest answer cannot fit at all is refused in ``validate_params`` (HTTP 400) wherever the
vocabulary is known in that process (an in-process engine, or ``register_vocab``); elsewhere the
engine still steers as far as the budget allows. ``extra_args["constraint_budget"] = false`` turns
the steering off for one request.

How state survives batch changes
--------------------------------
Each row holds a reference to the engine's running output-token list (handed over in
``BatchUpdate.added``) and its state is derived from that list: before every ``apply`` the core
compares the list with what it consumed (length and last token). New tokens advance the state; a
shorter or diverging history (preemption: a request comes back as a plain ``added`` with output
tokens) rebuilds the state from the start. Rows in partial prefill have no new output tokens, so
they never advance. ``removed``, then ``added``, then ``moved`` are applied in that order; a
finished request overwritten by a move simply loses its row. After the end of the constraint only
end-of-sequence is allowed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from numpy.typing import NDArray
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from llmserve.constraints import reference
from llmserve.constraints.budget import check_fits
from llmserve.constraints.compiled import CompiledConstraint, compile_dfa
from llmserve.constraints.compiler import check_constraint, compile_constraint, occurring, serving_form, shortest_answer
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.json_text import read_json_text
from llmserve.constraints.lazy_form import LazyConstraint
from llmserve.constraints.machine import (
    ByteAutomaton,
    PythonRow,
    TokenStateMachine,
    automaton_to_dfa,
    make_machine,
    registered_machines,
)
from llmserve.constraints.native import native as core
from llmserve.constraints.native import native_vocab, require_native
from llmserve.constraints.spec import spec_from_request
from llmserve.constraints.vocab import Vocab

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

log = logging.getLogger(__name__)

PROCESSOR_PATH = "llmserve.constraints.vllm_processor:ConstraintLogitsProcessor"
# Model Runner V2 has its own processor interface and rejects V1 processors. Until the V2 adapter
# exists, the engine must run the V1 model runner; the lock pins this and check-compat verifies it.
V2_MODEL_RUNNER_SUPPORTED = False
REQUIRED_ENGINE_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
FLAT_KEYS = {"constraint_regex": "regex", "constraint_choice": "choice", "constraint_json_schema": "json_schema"}
BUDGET_KEY = "constraint_budget"  # false: no steering towards an answer that ends within max_tokens
_VALIDATION_VOCAB: list[Vocab] = []  # set by register_vocab


def register_vocab(vocab: Vocab) -> None:
    """The model's vocabulary for ``validate_params`` in a process without an in-process engine (a
    frontend): with it a request whose shortest answer cannot fit in ``max_tokens`` is a 400 there."""
    _VALIDATION_VOCAB[:] = [vocab]


def budget_enabled(extra_args: dict | None) -> bool:
    value = (extra_args or {}).get(BUDGET_KEY, True)
    return value not in (False, "false", "False", 0, "0")


def validation_vocab() -> Vocab | None:
    """The vocabulary this process checks requests against (its engine's, or the one registered), or None."""
    for ref in ConstraintLogitsProcessor.instances:
        proc = ref()
        if proc is not None:
            return proc.vocab
    return _VALIDATION_VOCAB[0] if _VALIDATION_VOCAB else None


def check_budget(obj, max_tokens: int | None, limit: str | None = None) -> None:
    """BudgetError (a 400) when even the shortest answer of ``obj`` needs more than ``max_tokens``
    tokens; nothing when the vocabulary is not known in this process (see the module doc).
    ``limit``: what the refusal calls the budget (``budget.check_fits``)."""
    vocab = validation_vocab()
    if max_tokens is None or vocab is None or "machine" in obj:
        return
    check_fits(shortest_answer(obj, vocab, within=max_tokens - 1), max_tokens, limit)


def occurring_in(obj, texts: list[bytes]) -> list[bool | None]:
    """Per text, whether it occurs inside some answer of the constraint ``obj`` (``compiler.occurring``;
    None: not decided). A machine's answers are its own: None for each."""
    if "machine" in obj:
        return [None] * len(texts)
    return occurring(spec_from_request(obj), texts)


def check_engine_env(environ=None) -> list[str]:
    """Problems with the environment for this processor (empty when fine)."""
    env = os.environ if environ is None else environ
    problems = []
    for k, v in REQUIRED_ENGINE_ENV.items():
        if env.get(k) != v:
            problems.append(
                f"{k}={v} is required by the constraint processor (V1 logits-processor interface); it is {env.get(k)!r}"
            )
    return problems


def request_constraint(extra_args: dict | None):
    """The constraint object in a request's extra args, or None. Raises ConstraintError when malformed."""
    if not extra_args:
        return None
    found = [k for k in ("constraint", *FLAT_KEYS) if k in extra_args]
    if not found:
        return None
    if len(found) > 1:
        raise ConstraintError(f"give one constraint per request, got {found}")
    key = found[0]
    value = extra_args[key]
    if key == "constraint":
        if isinstance(value, str):
            value = read_json_text(value, "constraint")
        if not isinstance(value, dict):
            raise ConstraintError('constraint must be an object, e.g. {"regex": "[0-9]+"}')
        return value
    return {FLAT_KEYS[key]: value}


def validate_constraint(obj) -> None:
    """The constraint's check: a machine must be registered; any other constraint is converted and
    what its NFA would be read off its tree, within the compile limits (``limits.py``), and its tree
    kept (``compiler.check_constraint``: in memory and on disk), so that the engine builds its
    automaton without converting it again. Run it off the event loop (``llmserve.serve.constraint_keys.
    validation_problem_async``): a new constraint can take up to the compile time budget."""
    if "machine" in obj:
        if (
            not isinstance(obj["machine"], str)
            or not isinstance(obj.get("args", {}), dict)
            or set(obj) - {"machine", "args"}
        ):
            raise ConstraintError('a machine constraint is {"machine": name, "args": {...}}')
        if obj["machine"] not in registered_machines():
            raise ConstraintError(f"unknown constraint machine {obj['machine']!r}")
        return
    check_constraint(spec_from_request(obj))


_VOCABS: dict[tuple, Vocab] = {}
_VOCABS_LOCK = threading.Lock()


def vocab_for_model(vllm_config) -> Vocab:
    """The model's vocabulary, built once per process: the frontend's budget check (``register_vocab``)
    and an in-process engine's processor share one object, hence one token table and one native
    trie (each takes seconds and tens of MB at a 128k vocabulary)."""
    mc = vllm_config.model_config
    key = (
        str(mc.tokenizer),
        getattr(mc, "tokenizer_revision", None),
        bool(mc.trust_remote_code),
        int(mc.get_vocab_size()),
        repr(getattr(mc.hf_config, "eos_token_id", None)),
    )
    with _VOCABS_LOCK:  # a second caller waits for the first build instead of doing its own
        vocab = _VOCABS.get(key)
        if vocab is None:
            vocab = _VOCABS[key] = _load_vocab(mc)
    return vocab


def _load_vocab(mc) -> Vocab:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        mc.tokenizer, trust_remote_code=mc.trust_remote_code, revision=getattr(mc, "tokenizer_revision", None)
    )
    eos = set()
    if tok.eos_token_id is not None:
        eos.add(int(tok.eos_token_id))
    cfg_eos = getattr(mc.hf_config, "eos_token_id", None)
    if isinstance(cfg_eos, int):
        eos.add(cfg_eos)
    elif isinstance(cfg_eos, (list, tuple)):
        eos.update(int(e) for e in cfg_eos)
    return Vocab.from_hf_tokenizer(tok, size=mc.get_vocab_size(), eos_ids=sorted(eos))


class ConstraintLogitsProcessor(LogitsProcessor):
    """Batch-level constraint processor (vLLM V1 interface)."""

    # weak references to live processors (in-process engines: tests, metrics)
    instances: ClassVar[list[weakref.ref[ConstraintLogitsProcessor]]] = []

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        obj = request_constraint(sampling_params.extra_args)
        if obj is not None:
            validate_constraint(obj)
            if budget_enabled(sampling_params.extra_args):
                # the frontends checked the max_tokens asked for; the engine may have cut it to what
                # the model's context leaves after the prompt, which a refusal here must say
                n = sampling_params.max_tokens
                check_budget(
                    obj,
                    n,
                    f"a budget of {n} tokens (the lesser of max_tokens and what the context leaves after the prompt)",
                )

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        if getattr(vllm_config, "use_v2_model_runner", False):
            raise RuntimeError(
                "the llmserve constraint processor needs the V1 model runner: set VLLM_USE_V2_MODEL_RUNNER=0"
            )
        self.device = device
        self.pin_memory = bool(is_pin_memory) and torch.cuda.is_available()
        self.vocab = vocab_for_model(vllm_config)
        self.backend = os.environ.get("LLMSERVE_CONSTRAINT_BACKEND", "native")
        self.batch: reference.ReferenceBatch | core.Batch
        if self.backend == "python":
            self.batch = reference.ReferenceBatch(self.vocab)
        else:
            require_native()
            self.batch = core.Batch(native_vocab(self.vocab))
        # rows handled by self.batch -> their compiled form: the processor holds its own reference, so
        # the compiled-constraint cache may evict a form while a request still uses it (memory.py)
        self.constrained: dict[int, CompiledConstraint | LazyConstraint] = {}
        self.python_rows: dict[int, PythonRow] = {}  # TokenStateMachine rows
        # rows steered to end within their budget -> (most output tokens, the output-token list)
        self.budgets: dict[int, tuple[int, list[int]]] = {}
        self.max_model_len = int(getattr(vllm_config.model_config, "max_model_len", 0) or 0)
        # counters, for tests and debugging: readded = an added request that already had output
        # tokens (a preempted request coming back); rebuilt = rows whose state was rebuilt from history
        self.stats = {
            "added": 0,
            "readded": 0,
            "removed": 0,
            "moved": 0,
            "swapped": 0,
            "rebuilt": 0,
            "applied": 0,
            "steered": 0,  # row-steps whose tokens were narrowed to end within max_tokens
            "failed": 0,  # rows whose constraint could not be built here: ended at once (``_ended``)
        }
        # the packed bitmask of the non-float32 path, allocated on first use (empty: none yet)
        self._bitmask_host = torch.empty((0, 0), dtype=torch.uint8)
        self._bitmask: NDArray[np.uint32] = self._bitmask_host.numpy().view(np.uint32)
        # what a row whose constraint cannot be built here is served from (``_ended``): built now, so
        # that serving it cannot fail
        self._end_only = compile_constraint(
            {"regex": ""}, self.vocab, backend="python" if self.backend == "python" else "native"
        )
        ConstraintLogitsProcessor.instances.append(weakref.ref(self))

    def is_argmax_invariant(self) -> bool:
        return False

    # ------------------------------------------------------------------ membership

    def _compile(self, obj, within: int | None, output_tokens: list[int]):
        """The form a row is served from; ``within``: the answer must end within that many more
        tokens after ``output_tokens`` (see ``compiler.serving_form``)."""
        if "machine" in obj:
            machine = make_machine(obj["machine"], self.vocab, obj.get("args"))
            if isinstance(machine, ByteAutomaton):
                return compile_dfa(
                    automaton_to_dfa(machine), self.vocab, backend="python" if self.backend == "python" else "native"
                )
            return machine
        if self.backend == "python":
            return compile_constraint(obj, self.vocab, backend="python")
        return serving_form(obj, self.vocab, within=within, tokens=output_tokens)

    def _ended(self, obj, exc: Exception) -> CompiledConstraint:
        """The form of a row whose constraint the frontend admitted but this process cannot build (a
        conversion out of its time budget on a loaded engine whose disk cache lost the frontend's
        tree, a custom machine failing here): end of sequence only, so the answer ends at once
        instead of running unconstrained, and an error in the engine's log (with the traceback when
        it is not a refusal: a bug). Raising instead would stop the engine and fail every request in
        the batch, so nothing here may raise."""
        self.stats["failed"] += 1
        try:
            what = json.dumps(obj, sort_keys=True, default=str)[:200]
        except (TypeError, ValueError):
            what = repr(obj)[:200]
        reason = (
            (exc.message.splitlines() or [""])[0]
            if isinstance(exc, ConstraintError)
            else f"{type(exc).__name__}: {exc}"
        )
        log.error(
            "constraint %s could not be built in the engine, the answer ends here: %s",
            what,
            reason,
            exc_info=not isinstance(exc, ConstraintError),
        )
        return self._end_only

    def _clear(self, i: int) -> None:
        self.batch.clear_row(i)
        self.constrained.pop(i, None)
        self.python_rows.pop(i, None)
        self.budgets.pop(i, None)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        st = self.stats
        st["removed"] += len(batch_update.removed)
        for i in batch_update.removed:
            self._clear(i)
        for i, params, prompt, output_tokens in batch_update.added:
            self._clear(i)
            obj = request_constraint(params.extra_args if params is not None else None)
            if obj is None:
                continue
            st["added"] += 1
            st["readded"] += 1 if output_tokens else 0
            limit = self._token_limit(params, prompt)
            if limit is None or not budget_enabled(params.extra_args):
                limit = None
            within = None if limit is None else limit - len(output_tokens or ()) - 1  # end of sequence: one more
            try:
                compiled = self._compile(obj, within, output_tokens or [])
            except Exception as exc:  # one request must not take the engine (every request) down
                compiled = self._ended(obj, exc)
            if isinstance(compiled, TokenStateMachine):
                self.python_rows[i] = PythonRow(compiled, output_tokens, self.vocab.size)
            else:
                self.batch.set_row(i, compiled if self.backend == "python" else compiled.native, output_tokens)
                self.constrained[i] = compiled
                if limit is not None:
                    self.budgets[i] = (limit, output_tokens)
        for a, b, direction in batch_update.moved:
            if direction == MoveDirectionality.SWAP:
                st["swapped"] += 1
                self.batch.swap(a, b)
                _swap_keys(self.constrained, a, b)
                _swap_keys(self.python_rows, a, b)
                _swap_keys(self.budgets, a, b)
            else:  # a -> b; whatever was at b (possibly a finished request) is overwritten
                st["moved"] += 1
                self.batch.move(a, b)
                _move_key(self.constrained, a, b)
                _move_key(self.python_rows, a, b)
                _move_key(self.budgets, a, b)

    def _token_limit(self, params, prompt) -> int | None:
        """The most output tokens the request may have: max_tokens, and what the context leaves."""
        limit = getattr(params, "max_tokens", None)
        if self.max_model_len and prompt is not None:
            room = self.max_model_len - len(prompt)
            limit = room if limit is None else min(limit, room)
        return limit

    # ------------------------------------------------------------------ masks

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.constrained and not self.python_rows:
            return logits
        B = logits.shape[0]
        self.stats["applied"] += 1
        if self.constrained:
            self.stats["rebuilt"] += self.batch.sync(B)
            if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.stride(-1) == 1:
                self.batch.fill_apply(logits.detach().numpy())
            else:
                self._apply_via_bitmask(logits, B)
            if self.budgets:
                self._steer(logits, B)
        for i, row in self.python_rows.items():
            if i >= B:
                continue
            row.sync()
            allowed = torch.from_numpy(row.allowed_mask(self.vocab.eos_ids)).to(logits.device)
            n = min(allowed.shape[0], logits.shape[1])
            logits[i, :n].masked_fill_(~allowed[:n], float("-inf"))
            if logits.shape[1] > n:
                logits[i, n:] = float("-inf")
        return logits

    def _steer(self, logits: torch.Tensor, B: int) -> None:
        """Rows close to their token limit: only the tokens after which the answer can still end
        in time (budget.py has the invariant). A row far from its limit costs one comparison; a
        steered row costs one native apply of a row its constraint usually has kept already."""
        native_rows = None
        if (
            core is not None
            and logits.device.type == "cpu"
            and logits.dtype == torch.float32
            and logits.stride(-1) == 1
            and logits.shape[1] <= self.vocab.words * 32
        ):
            native_rows = logits.detach().numpy()
        for i, (limit, tokens) in self.budgets.items():
            compiled = self.constrained.get(i)
            if i >= B or compiled is None:
                continue
            left = limit - len(tokens)  # tokens still to come, this one included
            if left - 2 >= compiled.max_distance:
                continue
            state, _ = self.batch.row(i)
            if state is None or state < 0:
                continue
            row = compiled.budget_row(state, left - 2)
            if row is None:  # nothing fits any more (admitted without a vocabulary): leave the row be
                continue
            self.stats["steered"] += 1
            if native_rows is not None:
                core.apply_bitmask(native_rows[i : i + 1], row.reshape(1, -1))
                continue
            allowed = np.unpackbits(row.view(np.uint8), bitorder="little")[: logits.shape[1]].astype(bool)
            logits[i].masked_fill_(~torch.from_numpy(allowed).to(logits.device), float("-inf"))

    def _apply_via_bitmask(self, logits: torch.Tensor, B: int) -> None:
        """Other dtypes or devices: fill the packed bitmask natively, apply it with torch."""
        V = logits.shape[1]
        W = (V + 31) // 32
        if self._bitmask.shape[0] < B or self._bitmask.shape[1] != W:
            # a torch-owned host buffer, pinned when the engine pins memory (faster copy to the device)
            self._bitmask_host = torch.empty((max(B, 8), 4 * W), dtype=torch.uint8, pin_memory=self.pin_memory)
            self._bitmask = self._bitmask_host.numpy().view(np.uint32)
        active = np.zeros(B, dtype=np.uint8)
        self.batch.fill(self._bitmask[:B], active, B)
        apply_bitmask_torch(logits, self._bitmask_host[:B], torch.from_numpy(active.view(np.bool_)))


def _swap_keys(rows: dict, a: int, b: int) -> None:
    va, vb = rows.pop(a, None), rows.pop(b, None)
    if va is not None:
        rows[b] = va
    if vb is not None:
        rows[a] = vb


def _move_key(rows: dict, a: int, b: int) -> None:
    """Row a's entry to b; whatever was at b is dropped."""
    rows.pop(b, None)
    va = rows.pop(a, None)
    if va is not None:
        rows[b] = va


_BIT_VALUES = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8)


def apply_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, active: torch.Tensor | None = None) -> None:
    """In place: logits[r, t] = -inf where bit t of row r is clear (rows with active False untouched).

    ``bitmask`` is the packed mask as bytes, uint8 [B, >= ceil(V / 8)] (the little-endian bytes of the
    uint32 words the core fills: bit t is bit t % 8 of byte t // 8). Unpacked per byte, the temporary
    is one bool per token, not one int64 per token."""
    B, V = logits.shape
    if bitmask.dtype != torch.uint8 or bitmask.dim() != 2 or bitmask.shape[0] < B or bitmask.shape[1] * 8 < V:
        raise ValueError(f"bitmask must be uint8 [{B}, >= {(V + 7) // 8}], got {tuple(bitmask.shape)} {bitmask.dtype}")
    packed = bitmask[:B].to(logits.device)
    allowed = (packed.unsqueeze(-1) & _BIT_VALUES.to(logits.device)).ne(0).reshape(B, -1)[:, :V]
    if active is not None:
        allowed |= ~active.to(logits.device).unsqueeze(1)
    logits.masked_fill_(~allowed, float("-inf"))


def describe() -> dict[str, Any]:
    """What the serving/compat layers need to know about this processor."""
    return {
        "processor": PROCESSOR_PATH,
        "interface": "vllm-v1-logits-processor",
        "v2_model_runner_supported": V2_MODEL_RUNNER_SUPPORTED,
        "required_env": dict(REQUIRED_ENGINE_ENV),
        "request_keys": ["constraint", *FLAT_KEYS],
    }
