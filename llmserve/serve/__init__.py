"""`llmserve serve`: one process, one embedded vLLM engine, pluggable protocol frontends.

Public surface: `ServeOptions`, `serve(options)`, the `Frontend` protocol and the errors in
`llmserve.serve.errors`. Importing this package does not import vLLM, torch or prometheus_client.
"""

from llmserve.serve.options import API_KEY_ENV, ServeOptions
from llmserve.serve.server import serve

__all__ = ["API_KEY_ENV", "ServeOptions", "serve"]
