"""Triton Python-backend model: FEATURES (FP32 [-1, 4]) -> PROBABILITIES (FP32 [-1, 3]), LABEL (BYTES [-1]).

Serves the softmax classifier train.py wrote (weights/model.safetensors, class names in weights/config.json).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from safetensors.numpy import load_file

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")


class TritonPythonModel:
    def initialize(self, args):
        params = load_file(os.path.join(WEIGHTS, "model.safetensors"))
        self.weight, self.bias = params["weight"], params["bias"]
        with open(os.path.join(WEIGHTS, "config.json"), encoding="utf-8") as f:
            self.classes = np.array([c.encode() for c in json.load(f)["classes"]], dtype=np.object_)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy().astype(np.float32)
            if x.ndim != 2 or x.shape[1] != self.weight.shape[0]:
                error = pb_utils.TritonError(
                    f"FEATURES must have shape [n, {self.weight.shape[0]}], got {list(x.shape)}"
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            logits = x @ self.weight + self.bias
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            outputs = [
                pb_utils.Tensor("PROBABILITIES", p.astype(np.float32)),
                pb_utils.Tensor("LABEL", self.classes[p.argmax(axis=1)]),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
