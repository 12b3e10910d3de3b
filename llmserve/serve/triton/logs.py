"""Reading Triton's log: the lines that matter when a model fails to load or the server will not start."""

from __future__ import annotations

import re

# I1201 14:09:03.434480 18767 backend_model.cc:692] "message"
_RECORD = re.compile(r"^(?P<level>[IWE])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w.\-]+:\d+\](?: (?P<msg>.*))?$")
# Said by every Triton started without a GPU (or without its driver): not a cause of anything here.
NOISE = (
    "CudaDriverHelper has not been initialized",
    "Failed to initialize NVML",
    "DCGM unable to start",
    "Unable to allocate pinned system memory",
    "CUDA driver version is insufficient",
    "Unable to get CUDA device count",
)


def _message(msg: str) -> list[str]:
    """A record's message as lines: the quotes dropped and Triton's escaped newlines made real."""
    if len(msg) >= 2 and msg[0] == '"' and msg[-1] == '"':
        msg = msg[1:-1].replace("\\n", "\n").replace('\\"', '"')
    return msg.splitlines()


def _keep_record(level: str, msg: str, model: str | None) -> bool:
    if any(n in msg for n in NOISE):
        return False
    if level in "EW":
        return True
    low = msg.lower()
    return "failed" in low and (model is None or f"'{model}'" in msg)


def important_lines(text: str, model: str | None = None, *, limit: int = 30) -> list[str]:
    """Triton's error and warning records, its failure notes (about `model` when given) and whatever else the
    server or a Python stub printed (tracebacks, `error: creating server: ...`), without the start-up tables,
    GPU noise or repeats; the last `limit` lines."""
    out: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "|+" or any(n in line for n in NOISE):
            continue
        record = _RECORD.match(stripped)
        if record is None:
            lines = [stripped]
        elif _keep_record(record["level"], record["msg"] or "", model):
            lines = _message(record["msg"])
        else:
            continue
        for one in lines:
            key = one.strip()
            if len(key) > 1 and key not in seen:
                seen.add(key)
                out.append(one.rstrip())
    return out[-limit:]


def load_failure(text: str, model: str) -> str | None:
    """Triton's own reason for not loading `model` (first line), or None when the log gives none."""
    name = re.escape(model)
    why = r'(?P<why>[^"\n]+?)(?=\\n|"|;?$)'
    patterns = (
        rf"failed to load '{name}' version \d+: {why}",
        rf"load failed for model '{name}': {why}",
        rf"failed to load '{name}', {why}",
        rf"Poll failed for model directory '{name}': {why}",
    )
    for pattern in patterns:
        found = re.search(pattern, text, re.MULTILINE)
        if found:
            return found["why"].strip()
    return None


def is_address_in_use(text: str) -> bool:
    """The server could not bind one of its ports (another process took a port chosen free)."""
    return bool(re.search(r"address already in use|failed to start (HTTP|GRPC|Metrics)", text, re.IGNORECASE))
