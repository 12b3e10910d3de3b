"""Train the example's non-LLM model: a 3-class parcel-size classifier (softmax regression, numpy only).

The data are synthetic and deterministic (a fixed seed): four measurements per parcel (length, width and height in
cm, weight in kg) drawn around three sizes. The trained weights are written as a Hugging Face-style folder
(config.json + model.safetensors), the layout `llmserve package` packages; model.py serves it in Triton's
Python backend.

    python examples/triton-classifier/train.py examples/triton-classifier/model
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

FEATURES = ["length_cm", "width_cm", "height_cm", "weight_kg"]
CLASSES = ["small", "medium", "large"]
CENTRES = np.array([[20, 15, 8, 0.5], [45, 35, 20, 4.0], [90, 60, 45, 15.0]], dtype=np.float64)
SPREAD = np.array([5, 4, 3, 0.4], dtype=np.float64)


def dataset(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.concatenate([c + rng.normal(0, SPREAD * (1 + i), (n_per_class, 4)) for i, c in enumerate(CENTRES)])
    y = np.repeat(np.arange(len(CLASSES)), n_per_class)
    return x, y


def train(x: np.ndarray, y: np.ndarray, steps: int = 2000, rate: float = 0.5) -> dict[str, np.ndarray]:
    mean, scale = x.mean(axis=0), x.std(axis=0)
    z = (x - mean) / scale
    w = np.zeros((x.shape[1], len(CLASSES)))
    b = np.zeros(len(CLASSES))
    onehot = np.eye(len(CLASSES))[y]
    for _ in range(steps):
        logits = z @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(x)
        w -= rate * z.T @ grad
        b -= rate * grad.sum(axis=0)
    # the standardisation is folded into the weights: the served model takes raw measurements
    w_raw = w / scale[:, None]
    b_raw = b - (mean / scale) @ w
    return {"weight": w_raw.astype(np.float32), "bias": b_raw.astype(np.float32)}


def accuracy(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float(((x @ params["weight"] + params["bias"]).argmax(axis=1) == y).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    x, y = dataset(200, seed=7)
    params = train(x, y)
    x_test, y_test = dataset(100, seed=8)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    save_file(params, str(args.out_dir / "model.safetensors"))
    config = {"model_type": "softmax-classifier", "features": FEATURES, "classes": CLASSES}
    (args.out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    print(f"trained on {len(x)} parcels; held-out accuracy {accuracy(params, x_test, y_test):.3f}; -> {args.out_dir}")


if __name__ == "__main__":
    main()
