"""The LLM contract's input tensors for a tritonclient request (grpc or http module)."""

from __future__ import annotations

import json

import numpy as np


def text_inputs(
    client_module, prompt: str, *, stream: bool | None = None, sampling: dict | None = None, exclude: bool | None = None
) -> list:
    """text_input, and the optional stream / sampling_parameters / exclude_input_in_output tensors."""
    out = []
    t = client_module.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    out.append(t)
    if stream is not None:
        t = client_module.InferInput("stream", [1], "BOOL")
        t.set_data_from_numpy(np.array([stream], dtype=bool))
        out.append(t)
    if sampling is not None:
        t = client_module.InferInput("sampling_parameters", [1], "BYTES")
        t.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=object))
        out.append(t)
    if exclude is not None:
        t = client_module.InferInput("exclude_input_in_output", [1], "BOOL")
        t.set_data_from_numpy(np.array([exclude], dtype=bool))
        out.append(t)
    return out
