"""The two text protocols llmserve's OpenAI routes speak to a generating model hosted by Triton.

`vllm`: the Triton vLLM backend's (NVIDIA's, r24.12 on, and llmserve's own, vllm_model.py): text_input, stream,
sampling_parameters and exclude_input_in_output in; text_output and, asked for with the return_* inputs, the
additional outputs finish_reason, num_input_tokens and num_output_tokens.

`llm-text`: the contract of Python-backend LLM packages (`python.frontend: llm-text`, checked at package time):
the same four inputs and text_output alone. It says nothing of tokens or of why generation stopped, so the routes
count tokens with the package's tokenizer (the prompt as sent; each answer piece re-tokenized, which can differ by
a token from the ids the model generated) and derive finish_reason: "length" when the answer reached max_tokens,
"stop" otherwise. A model that is not decoupled answers in one response: a streamed request gets its whole answer
as one delta. Structured outputs and constraint keys are refused for it (only the vLLM backend enforces them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# The vLLM backend's additional outputs (the stock backend's, r24.12 on), each sent on every response when its
# input is true: input -> (output, Triton type, dims).
ADDITIONAL_OUTPUTS = {
    "return_finish_reason": ("finish_reason", "TYPE_STRING", [-1]),
    "return_num_input_tokens": ("num_input_tokens", "TYPE_UINT32", [1]),
    "return_num_output_tokens": ("num_output_tokens", "TYPE_UINT32", [-1]),
}
# What one Triton response is to the routes: (text, final, finish_reason, prompt_tokens, output_tokens).
Read = tuple[str, bool, str | None, int, int]
Inputs = dict[str, tuple[str, np.ndarray]]


def _bytes(text: str) -> np.ndarray:
    return np.array([text.encode("utf-8")], dtype=np.object_)


def _is_final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _text(result: Any) -> str:
    return str(result.as_numpy("text_output").reshape(-1)[0].decode("utf-8"))


@dataclass(frozen=True)
class VllmText:
    """The Triton vLLM backend's protocol: token counts and finish reason come from the backend."""

    name = "vllm"
    structured = True  # structured outputs and constraint keys reach the engine
    default_max_tokens: int | None = None  # chat: the rest of the context, as the backend decides

    def inputs(self, prompt: str, stream: bool, params: dict[str, Any]) -> Inputs:
        return {
            "text_input": ("BYTES", _bytes(prompt)),
            # a whole answer is one response from Triton (each streamed delta is a round trip through the stub)
            "stream": ("BOOL", np.array([stream])),
            "sampling_parameters": ("BYTES", _bytes(json.dumps(params))),
            "exclude_input_in_output": ("BOOL", np.array([True])),
            "return_finish_reason": ("BOOL", np.array([True])),
            "return_num_input_tokens": ("BOOL", np.array([True])),
            "return_num_output_tokens": ("BOOL", np.array([True])),
        }

    def reader(self, prompt: str, params: dict[str, Any]) -> Callable[[Any], Read]:
        def read(result: Any) -> Read:
            reason = result.as_numpy("finish_reason")[0].decode()
            return (
                _text(result),
                _is_final(result),
                None if reason == "None" else reason,
                int(result.as_numpy("num_input_tokens")[0]),
                int(result.as_numpy("num_output_tokens")[0]),
            )

        return read


@dataclass(frozen=True)
class LlmText:
    """The llm-text contract of a Python-backend package: counts and finish reason derived here (module doc)."""

    count_tokens: Callable[[str], int]
    decoupled: bool
    name = "llm-text"
    structured = False
    # The built-in template's own default; sent explicitly so that "length" can be told from "stop".
    default_max_tokens: int | None = 16

    def inputs(self, prompt: str, stream: bool, params: dict[str, Any]) -> Inputs:
        return {
            "text_input": ("BYTES", _bytes(prompt)),
            "stream": ("BOOL", np.array([stream and self.decoupled])),
            "sampling_parameters": ("BYTES", _bytes(json.dumps(params))),
            "exclude_input_in_output": ("BOOL", np.array([True])),
        }

    def reader(self, prompt: str, params: dict[str, Any]) -> Callable[[Any], Read]:
        prompt_tokens = self.count_tokens(prompt)
        limit = params.get("max_tokens")
        produced = 0

        def read(result: Any) -> Read:
            nonlocal produced
            text = _text(result)
            tokens = self.count_tokens(text) if text else 0
            produced += tokens
            final = _is_final(result)
            reason = None
            if final:
                reason = "length" if isinstance(limit, int) and produced >= limit else "stop"
            return text, final, reason, prompt_tokens, tokens

        return read


VLLM_TEXT = VllmText()
TextProtocol = VllmText | LlmText
