"""Prometheus metrics of one server (a private registry, so several servers can share a process).

Counters and histograms are observed by the HTTP side as request outputs arrive (so TTFT
includes queueing); gauges read the scheduler's stats at scrape time.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

from engine.runtime.scheduler import SchedulerStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                    2.0, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """All metrics, prefixed ``engine_``; ``render()`` gives the exposition text."""

    def __init__(self, stats: Callable[[], SchedulerStats], model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.requests = Counter("engine_requests", "Finished generation requests (sequences) "
                                "by finish reason.", labels + ["finish_reason"], registry=r)
        self.rejected = Counter("engine_rejected_requests", "Requests refused (400-503) by "
                                "HTTP status.", labels + ["status"], registry=r)
        self.prompt_tokens = Counter("engine_prompt_tokens", "Prompt tokens processed.", labels,
                                     registry=r)
        self.generation_tokens = Counter("engine_generation_tokens", "Tokens generated.",
                                         labels, registry=r)
        self.cached_tokens = Counter("engine_cached_tokens", "Prompt tokens served from the "
                                     "radix cache.", labels, registry=r)
        self.cached_tokens_tier = Counter(
            "engine_cached_tokens_by_tier", "Prompt tokens served from the cache, by the tier "
            "that held them (device, host, storage; hierarchical cache).",
            labels + ["tier"], registry=r)
        self.ttft = Histogram("engine_time_to_first_token_seconds", "Time to first token.",
                              labels, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("engine_inter_token_latency_seconds", "Time between two output "
                             "tokens of one request.", labels, buckets=_LATENCY_BUCKETS,
                             registry=r)
        self.e2e = Histogram("engine_e2e_request_latency_seconds", "Request latency.", labels,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.model_name = model_name
        #: this model's per-token histograms, resolved once (``labels()`` locks and looks up)
        self.observe_ttft = self.ttft.labels(model_name).observe
        self.observe_itl = self.itl.labels(model_name).observe
        gauges = {
            "engine_num_running_requests": ("Requests in the running batch.",
                                            lambda s: s.num_running),
            "engine_num_queue_requests": ("Requests waiting to run.", lambda s: s.num_waiting),
            "engine_kv_cache_usage": ("Fraction of KV cache slots in use (cache included).",
                                      lambda s: s.kv_usage),
            "engine_kv_cache_used_tokens": ("KV cache slots in use.",
                                            lambda s: s.kv_used_tokens),
            "engine_kv_cache_capacity_tokens": ("KV cache slots in all.",
                                                lambda s: s.kv_capacity_tokens),
            "engine_radix_cache_tokens": ("Tokens held by the radix prefix cache.",
                                          lambda s: s.kv_cached_tokens),
            "engine_num_retractions": ("Requests retracted for lack of KV memory so far.",
                                       lambda s: s.num_retractions),
        }
        if stats().spec is not None:
            gauges.update({
                "engine_spec_accept_length": (
                    "Mean tokens emitted per request per speculative verify (1 + accepted).",
                    lambda s: s.spec.accept_length),
                "engine_spec_accepted_tokens_per_second": (
                    "Draft tokens accepted per second over the last 10 seconds.",
                    lambda s: s.spec.accepted_per_second),
                "engine_spec_accepted_tokens_total": (
                    "Draft tokens accepted so far.", lambda s: s.spec.accepted_tokens),
                "engine_spec_draft_tokens_total": (
                    "Draft tokens verified so far.", lambda s: s.spec.draft_tokens),
                "engine_spec_verify_forwards_total": (
                    "Speculative verify forwards so far.", lambda s: s.spec.verify_forwards),
            })
        for name, (doc, read) in gauges.items():
            g = Gauge(name, doc, labels, registry=r)
            g.labels(model_name).set_function(lambda read=read: float(read(stats())))
        from engine.runtime.kernel_builds import BUILDS

        for name, doc, read in (
                ("engine_kernel_builds", "Triton kernel variants built (compiled or loaded "
                 "from the disk cache) since the warm-up began (GPU).",
                 lambda: BUILDS.total),
                ("engine_kernel_builds_after_ready", "Triton kernel variants built after the "
                 "server turned ready: shapes the warm-up did not cover (GPU).",
                 lambda: BUILDS.after_ready)):
            Gauge(name, doc, labels, registry=r).labels(model_name).set_function(
                lambda read=read: float(read()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
