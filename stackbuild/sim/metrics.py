"""/metrics in Prometheus text format with sglang's metric names (model_name label).

observability/metrics_collector.py (sglang 0.5.23): TTFT, e2e latency and the prompt,
generation and request counters carry `is_streaming` (:1855-1863, :1943, :2041-2071,
observed once a request finishes, :2094-2160); inter-token latency does not (:2052-2057).
"""

from __future__ import annotations

import bisect

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.buckets = name, doc, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.total += v
        self.n += 1

    def lines(self, labels: str) -> list[str]:
        out = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        acc = 0
        for b, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{self.name}_bucket{{{labels},le="{b}"}} {acc}')
        out.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.n}')
        out.append(f"{self.name}_sum{{{labels}}} {self.total}")
        out.append(f"{self.name}_count{{{labels}}} {self.n}")
        return out


_TTFT = ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
_E2E = ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds")
COUNTERS = (
    ("sglang:prompt_tokens_total", "Number of prefill tokens processed."),
    ("sglang:generation_tokens_total", "Number of generation tokens processed."),
    ("sglang:num_requests_total", "Number of requests processed."),
)


def _flag(streaming: bool) -> str:
    return "true" if streaming else "false"


class Metrics:
    def __init__(self) -> None:
        self._ttft = {s: Histogram(*_TTFT, TTFT_BUCKETS) for s in (True, False)}
        self._e2e = {s: Histogram(*_E2E, E2E_BUCKETS) for s in (True, False)}
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        # is_streaming -> prompt tokens, generation tokens, requests (finished requests)
        self.counts = {True: [0, 0, 0], False: [0, 0, 0]}

    def ttft(self, streaming: bool, seconds: float) -> None:
        self._ttft[streaming].observe(seconds)

    def finished(self, streaming: bool, prompt_tokens: int, generated: int, e2e_s: float) -> None:
        c = self.counts[streaming]
        c[0] += prompt_tokens
        c[1] += generated
        c[2] += 1
        self._e2e[streaming].observe(e2e_s)

    def histograms(self, lb: str) -> list[str]:
        """TTFT and e2e per is_streaming (one HELP/TYPE each), then ITL."""
        out: list[str] = []
        for hs in (self._ttft, self._e2e):
            lines = [ln for s in (True, False) if hs[s].n
                     for ln in hs[s].lines(f'{lb},is_streaming="{_flag(s)}"')[2:]]
            out += hs[True].lines(lb)[:2] + lines
        return out + self.itl.lines(lb)


def render(
    model_name: str,
    *,
    running: int,
    queued: int,
    gen_throughput: float,
    accept_length: float,
    hist: Metrics,
) -> str:
    # observability/metrics_collector.py:1382-1388 (scheduler: engine_type and the ranks)
    # and :1807-1811 (tokenizer: engine_type); "unified" without disaggregation
    lb = f'model_name="{model_name}",engine_type="unified"'
    ranks = f'{lb},tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    gauges = [
        ("sglang:num_running_reqs", "The number of running requests.", running),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queued),
        ("sglang:gen_throughput", "The generation throughput (token/s).", gen_throughput),
        ("sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
         accept_length),
        ("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0),
    ]
    out: list[str] = []
    for name, doc, v in gauges:
        out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{ranks}}} {float(v)}"]
    for i, (name, doc) in enumerate(COUNTERS):
        out += [f"# HELP {name} {doc}", f"# TYPE {name} counter"]
        out += [f'{name}{{{lb},is_streaming="{_flag(s)}"}} {float(hist.counts[s][i])}'
                for s in (True, False) if hist.counts[s][2]]
    out += hist.histograms(lb)
    return "\n".join(out) + "\n"
