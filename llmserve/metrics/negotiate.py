"""Which exposition format a scraper asked for, from its Accept header."""

from __future__ import annotations

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_OPENMETRICS = "application/openmetrics-text"


def wants_openmetrics(accept: str | None) -> bool:
    """True when the header ranks OpenMetrics at least as high as any other acceptable type.

    Prometheus sends every format it reads with descending q values
    (`application/openmetrics-text;version=1.0.0;q=0.5,...,text/plain;version=0.0.4;q=0.3,*/*;q=0.2`); a bare
    `curl` sends `*/*` and gets the text format, as do clients that send nothing.
    """
    if not accept:
        return False
    best_openmetrics, best_other = 0.0, 0.0
    for entry in accept.split(","):
        media, *params = (p.strip() for p in entry.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media.lower() == _OPENMETRICS:
            best_openmetrics = max(best_openmetrics, q)
        elif media:
            best_other = max(best_other, q)
    return best_openmetrics > 0 and best_openmetrics >= best_other
