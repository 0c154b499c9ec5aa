"""Prometheus metrics of one server, in their own registry (GET /metrics)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests_running = Gauge("trellisforge_requests_running", "Sequences generating now", registry=r)
        self.requests_waiting = Gauge("trellisforge_requests_waiting", "Sequences queued for KV pages", registry=r)
        self.prompt_tokens = Counter("trellisforge_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("trellisforge_generation_tokens", "Tokens generated", registry=r)
        # Per request: "completed" (every choice ended: stop, length or tool_calls), "cancelled" (the
        # client left first), "failed" (the engine failed under it).
        self.requests = Counter("trellisforge_requests", "Generation requests ended, by outcome", ["outcome"], registry=r)
        self.finish_reasons = Counter("trellisforge_finish_reasons", "Choices finished, by finish reason", ["finish_reason"],
                                      registry=r)
        self.time_to_first_token = Histogram("trellisforge_time_to_first_token_seconds", "Request start to first token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("trellisforge_inter_token_latency_seconds", "Time between tokens of a sequence",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.kv_pages_used = Gauge("trellisforge_kv_pages_used", "KV cache pages holding tokens", registry=r)
        self.kv_pages_free = Gauge("trellisforge_kv_pages_free", "KV cache pages free", registry=r)
        self.kv_pages_cached = Gauge("trellisforge_kv_pages_cached", "KV cache pages the prefix cache holds", registry=r)
        self.prefix_hit_tokens = Gauge("trellisforge_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache since start",
                                       registry=r)
        self.prefix_miss_tokens = Gauge("trellisforge_prefix_cache_miss_tokens",
                                        "Prompt tokens computed while the prefix cache runs, since start", registry=r)
        self.preemptions = Gauge("trellisforge_preemptions", "Sequences sent back to wait for KV pages (they compute their"
                                 " tokens again, then go on), since start", registry=r)
        # What a KV page costs: the cache's dtype (a label) and the bytes one position takes.
        self.kv_bytes_per_token = Gauge("trellisforge_kv_bytes_per_token", "KV cache bytes one position takes, by stored dtype",
                                        ["dtype"], registry=r)

    def update_engine(self, stats: dict) -> None:
        self.requests_running.set(stats["sequences_live"])
        self.requests_waiting.set(stats["sequences_waiting"])
        self.kv_pages_used.set(stats["pages_total"] - stats["pages_free"])
        self.kv_pages_free.set(stats["pages_free"])
        self.kv_pages_cached.set(stats["pages_cached"])
        self.prefix_hit_tokens.set(stats["prefix_hit_tokens"])
        self.prefix_miss_tokens.set(stats["prefix_miss_tokens"])
        self.preemptions.set(stats["preemptions"])
        self.kv_bytes_per_token.labels(dtype=stats["kv_dtype"]).set(stats["kv_bytes_per_token"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
