"""moto's S3 server with one fix for large objects: a ranged GET reads only its range.

moto 5.2 answers a ranged GET by reading the whole object out of its buffer (spilled to a temporary
file above 5 MiB), then slicing it (moto/s3/responses.py: get_object returns `key.value`, then
`_handle_range_header` slices). Each part of a parallel download of a 1 GiB object then costs a
1 GiB read, so the download time measures moto, growing with the number of parts rather than the
bytes. S3 (and MinIO, Ceph) read the range only; this server does the same, for both sides of the
benchmark alike. Everything else is moto as it is.

Usage: python benchmarks/store/s3_server.py PORT
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

from moto.s3.models import FakeKey
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer

_local = threading.local()
_RANGE = re.compile(r"^bytes=(\d+)-(\d+)$")


class _Window(bytes):
    """The bytes of one range, with where they sit in the object."""

    begin: int
    total: int


_value = FakeKey.value.fget  # type: ignore[attr-defined]


def _ranged_value(self: FakeKey) -> bytes:
    window = getattr(_local, "range", None)
    if window is None:
        return _value(self)
    begin, end = window
    with self.lock:
        self._value_buffer.seek(begin)
        out = _Window(self._value_buffer.read(end - begin + 1))
    out.begin, out.total = begin, self.contentsize
    return out


_key_response = S3Response.key_response
_handle_range = S3Response._handle_range_header


def _key_response_ranged(self: S3Response, request: Any, full_url: str, headers: dict) -> Any:
    m = _RANGE.match(request.headers.get("range") or "") if request.method == "GET" else None
    _local.range = (int(m[1]), int(m[2])) if m and int(m[1]) <= int(m[2]) else None
    try:
        return _key_response(self, request, full_url, headers)
    finally:
        _local.range = None


def _handle_range_window(self: S3Response, request: Any, response_headers: dict, content: Any) -> Any:
    if not isinstance(content, _Window) or content.begin >= content.total:
        return _handle_range(self, request, response_headers, content)
    end = content.begin + len(content) - 1
    for key in [h for h in response_headers if h.startswith("x-amz-checksum-")]:
        del response_headers[key]
    response_headers["content-range"] = f"bytes {content.begin}-{end}/{content.total}"
    response_headers["content-length"] = str(len(content))
    return 206, response_headers, bytes(content)


FakeKey.value = property(_ranged_value, FakeKey.value.fset)  # type: ignore[attr-defined]
S3Response.key_response = _key_response_ranged  # type: ignore[method-assign]
S3Response._handle_range_header = _handle_range_window  # type: ignore[method-assign]

if __name__ == "__main__":
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
    server.start()
    threading.Event().wait()
