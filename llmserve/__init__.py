"""llmserve: package, pin, serve and roll out LLMs on vLLM and NVIDIA Triton."""

__version__ = "0.1.0"
