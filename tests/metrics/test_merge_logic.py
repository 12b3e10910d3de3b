"""The merger's pure parts, on fixed inputs: Accept negotiation, cutting a text page into families, quantiles from
histogram buckets, headline figures from two pages."""

from __future__ import annotations

import pytest

from llmserve.metrics import wants_openmetrics
from llmserve.metrics.families import split_text
from llmserve.metrics.headline import headline, quantile
from llmserve.metrics.scrape import parse

PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        (None, False),
        ("", False),
        ("*/*", False),
        ("text/plain;version=0.0.4", False),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text; version=1.0.0; charset=utf-8", True),
        (PROMETHEUS_3, True),
        ("text/plain;q=0.9,application/openmetrics-text;q=0.5", False),
        ("application/openmetrics-text;q=0", False),
    ],
)
def test_accept_negotiation(accept, openmetrics):
    assert wants_openmetrics(accept) is openmetrics


def test_a_text_page_is_cut_into_families_by_type_line_and_suffix():
    page = (
        '# HELP a_total A\n# TYPE a_total counter\na_total{x="1"} 1\n\n'
        '# HELP h H\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\n'
        "untyped_one 5\n# a comment\n# TYPE g gauge\ng 1\n"
    )
    families = {f.key: f.lines for f in split_text(page)}
    assert list(families) == ["a_total", "h", "untyped_one", "g"]
    assert len(families["h"]) == 6 and families["untyped_one"] == ["untyped_one 5"]


def test_quantile_interpolates_like_histogram_quantile():
    buckets = [(0.1, 0.0), (0.2, 50.0), (0.4, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.2)
    assert quantile(0.75, buckets) == pytest.approx(0.3)
    assert quantile(0.99, [(1.0, 0.0), (float("inf"), 10.0)]) == 1.0  # in +Inf: the highest finite bound
    assert quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def page(prompt: float, ttft_fast: float, ttft_all: float, requests_ok: float, requests_bad: float) -> str:
    return f"""# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0"}} {prompt}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0"}} 3
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="0.1"}} {ttft_fast}
vllm:time_to_first_token_seconds_bucket{{le="1.0"}} {ttft_all}
vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft_all}
vllm:time_to_first_token_seconds_sum 1
vllm:time_to_first_token_seconds_count {ttft_all}
# TYPE llmserve_requests_total counter
llmserve_requests_total{{endpoint="chat",status="200"}} {requests_ok}
llmserve_requests_total{{endpoint="chat",status="400"}} {requests_bad}
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="echo",version="1"}} 4
"""


def test_headline_from_two_pages_uses_the_window_only():
    before = parse(page(100, 10, 10, 50, 0), at=0.0)
    after = parse(page(300, 10, 20, 58, 2), at=2.0)
    h = headline(before, after)
    assert h["tokens_in_per_s"] == 100 and h["tokens_out_per_s"] is None and h["requests_running"] == 3
    # the 10 observations of the window all fell in (0.1, 1.0]: the fast ones before it do not count
    assert h["ttft_seconds"]["count"] == 10 and 0.1 < h["ttft_seconds"]["p50"] <= h["ttft_seconds"]["p99"] <= 1.0
    rows = {r["endpoint"]: r for r in h["endpoints"]}
    assert rows["chat"]["requests_per_s"] == 5 and rows["chat"]["error_rate"] == 0.2
    assert rows["triton/echo"]["requests_per_s"] == 0 and rows["triton/echo"]["error_rate"] is None
    # a restarted server (counters went down) counts from zero, as rate() does
    restarted = parse(page(50, 0, 0, 0, 0), at=4.0)
    assert headline(after, restarted)["tokens_in_per_s"] == 25
