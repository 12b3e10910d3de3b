"""Triton Python-backend model: TEXT (BYTES [-1]) -> TOKEN_COUNT (INT64 [-1]).

Uses only the `tokenizers` library and the tokenizer.json packaged in weights/, so it loads in
well under a second in Triton's Python backend.
"""

import os

import numpy as np
import triton_python_backend_utils as pb_utils

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")


class TritonPythonModel:
    def initialize(self, args):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(os.path.join(WEIGHTS, "tokenizer.json"))

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            decoded = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts]
            counts = np.array([len(e.ids) for e in self.tokenizer.encode_batch(decoded)], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("TOKEN_COUNT", counts)]))
        return responses
