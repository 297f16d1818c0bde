"""Prometheus metrics of one server (``GET /metrics``, text format of ``prometheus-client``).

Every app has its own registry, so several apps may live in one process (tests, benchmarks).

* ``bertforge_requests_total{route, status}`` — requests answered, every status (401, 413, 422, 429 too);
  ``route`` is the path (``/embed`` …), ``other`` for unknown paths;
* ``bertforge_request_duration_seconds{route, status}`` — latency histogram (seconds, first byte received
  to last byte sent);
* ``bertforge_queue_depth{model}`` — sequences waiting for their batch;
* ``bertforge_batch_size{model}`` — sequences per forward pass (histogram);
* ``bertforge_batch_tokens_total{model}`` / ``bertforge_batch_padded_tokens_total{model}`` — real and padded
  tokens computed; ``bertforge_inference_seconds_total{model}`` — time in forward passes;
* ``bertforge_tokens_per_second{model}`` — real tokens per second over the last 10 s (at scrape time);
* ``bertforge_requests_in_flight`` — requests being answered (the ``--max-concurrent-requests`` count).
"""
from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
RATE_WINDOW_S = 10.0


class ServerMetrics:
    """The metrics above in a registry of their own; :meth:`render` → (body bytes, content type)."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("bertforge_requests", "Requests answered", ("route", "status"), registry=r)
        self.latency = Histogram("bertforge_request_duration_seconds", "Request latency (seconds)",
                                 ("route", "status"), buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("bertforge_requests_in_flight", "Requests being answered", registry=r)
        self.queue_depth = Gauge("bertforge_queue_depth", "Sequences waiting for a batch", ("model",), registry=r)
        self.batch_size = Histogram("bertforge_batch_size", "Sequences per forward pass", ("model",),
                                    buckets=BATCH_BUCKETS, registry=r)
        self.tokens = Counter("bertforge_batch_tokens", "Real tokens computed", ("model",), registry=r)
        self.padded = Counter("bertforge_batch_padded_tokens", "Padded tokens computed", ("model",), registry=r)
        self.seconds = Counter("bertforge_inference_seconds", "Seconds in forward passes", ("model",), registry=r)
        self.tps = Gauge("bertforge_tokens_per_second", "Real tokens per second over the last 10 s", ("model",),
                         registry=r)
        self._recent: dict = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()
        # the labelled children, looked up once (labels() takes a lock and builds a tuple on every call);
        # routes and statuses are bounded sets (the app maps unknown paths to "other"), so this stays small
        self._req: dict = {}
        self._batch: dict = {}

    def register_model(self, name: str) -> None:
        for m in (self.queue_depth, self.tps):
            m.labels(name).set(0)
        for m in (self.tokens, self.padded, self.seconds):
            m.labels(name)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        c = self._req.get((route, status))
        if c is None:
            s = str(status)
            c = self._req[(route, status)] = (self.requests.labels(route, s), self.latency.labels(route, s))
        c[0].inc()
        c[1].observe(seconds)

    def observe_batch(self, model: str, n: int, tokens: int, padded: int, seconds: float) -> None:
        """One forward pass of ``n`` sequences (thread-safe: called from the model's worker thread)."""
        c = self._batch.get(model)
        if c is None:
            c = self._batch[model] = tuple(m.labels(model) for m in (self.batch_size, self.tokens, self.padded,
                                                                       self.seconds))
        c[0].observe(n)
        c[1].inc(tokens)
        c[2].inc(padded)
        c[3].inc(seconds)
        now = time.monotonic()
        with self._lock:
            q = self._recent[model]
            q.append((now, tokens))
            while q[0][0] < now - RATE_WINDOW_S:  # bounded between scrapes too
                q.popleft()

    def render(self) -> tuple:
        now = time.monotonic()
        with self._lock:
            for model, q in self._recent.items():
                while q and q[0][0] < now - RATE_WINDOW_S:
                    q.popleft()
                self.tps.labels(model).set(sum(n for _, n in q) / RATE_WINDOW_S)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


__all__ = ["ServerMetrics"]
