"""Metrics: one Prometheus exposition merged from Triton, vLLM and llmserve, and a live view of it."""
