"""Dynamic batching: one queue and one inference thread per model.

Requests put their sequences (one :class:`Item` per text, QA window or NER window) on the model's queue and
await one future per item. A scheduler coroutine on the event loop forms batches and hands each to the
model's own worker thread (a one-thread executor that alone calls the runner, so inference never runs on
the event loop and the model keeps its thread count), then resolves the items' futures.

A batch is formed when the worker is free: it always holds the oldest waiting item (no request starves),
plus the waiting items of the same output kind whose lengths are closest to it, as long as
``items × longest ≤ max_batch_tokens`` and ``items ≤ max_batch_requests``. Sequences are padded to the
batch's own longest, never to a fixed length. With ``max_wait_ms`` > 0 the scheduler waits up to that long
after the oldest item arrived for the batch to fill (fewer than ``max_batch_requests`` waiting), but only
while some request the server accepted has not queued its items yet (``arriving``): with nothing else on the
way a wait cannot fill the batch, so a lone request is dispatched at once and ``max_wait_ms`` adds no latency
to it. With 0 (the default) a free worker takes what is waiting at once — while it computes, the next batch
fills. When the queue runs empty (at most once a second) and again after half a second without work, the
worker thread returns the heap pages freed by the last batches to the system (``malloc_trim``), so the
resident memory of a long-running server stays flat.
A request's items may land in different batches; the request gathers its futures in its own order.
"""
from __future__ import annotations

import asyncio
import collections
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..engine.kernels.allocator import trim

#: what an item asks of the forward pass: a pooled embedding (H,), sequence logits (C,), token logits
#: (T, C) or QA start/end logits (2, T)
KINDS = ("embed", "hidden", "logits", "token_logits", "qa_logits")
#: a busy worker calls ``malloc_trim`` (:func:`bertforge.engine.kernels.allocator.trim`) when its queue runs empty, at
#: most once per TRIM_EVERY_S seconds; an idle one TRIM_IDLE_S seconds after its last batch
TRIM_EVERY_S = 1.0
TRIM_IDLE_S = 0.5


@dataclass
class Item:
    ids: list
    type_ids: list
    kind: str
    future: asyncio.Future
    t0: float = field(default_factory=time.perf_counter)

    def __len__(self) -> int:
        return len(self.ids)


class ModelWorker:
    """The queue, scheduler and inference thread of one :class:`~bertforge.server.models.ServedModel`.

    ``metrics``: a :class:`~bertforge.server.metrics.ServerMetrics` (batch sizes, queue depth, tokens).
    ``arriving``: a callable telling whether a request the server accepted has not queued its items yet
    (default: always True, i.e. batches wait ``max_wait_ms`` to fill); :attr:`inside` counts the requests
    whose items this worker holds. ``executor``: the one-thread executor inference runs on (default: a new
    one)."""

    def __init__(self, model, max_batch_tokens: int = 16384, max_batch_requests: int = 32,
                 max_wait_ms: float = 0.0, metrics=None, arriving=None, executor=None):
        self.model = model
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.max_wait = max_wait_ms / 1000.0
        self.metrics = metrics
        self.arriving = arriving if arriving is not None else (lambda: True)
        self.inside = 0
        self._depth = metrics.queue_depth.labels(model.name) if metrics is not None else None
        self.pending: collections.deque = collections.deque()
        # the model's inference thread (given: the thread that loaded and warmed it, see serve.app.build_app)
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix=f"bertforge-{model.name}")
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None
        self._closing = False
        self._trimmed = time.perf_counter()
        self._dirty = False  # batches ran since the last trim
        from ..tokenizer import pad_id
        self.pad_id = pad_id(model.tokenizer)

    # ------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the scheduler on the running event loop."""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.model.name}")

    async def stop(self) -> None:
        """Finish what is queued, then stop the scheduler and the worker thread."""
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
        self.executor.shutdown(wait=True)

    # ------------------------------------------------------------------------------ requests
    async def run_items(self, seqs: list, kind: str) -> list:
        """Queue ``seqs`` (:class:`~bertforge.server.models.Encoded`) and return their outputs in order."""
        loop = asyncio.get_running_loop()
        items = [Item(s.ids, s.type_ids, kind, loop.create_future()) for s in seqs]
        self.pending.extend(items)
        if self._depth is not None:
            self._depth.set(len(self.pending))
        self.inside += 1
        self._wake.set()
        try:
            if len(items) == 1:
                return [await items[0].future]
            return list(await asyncio.gather(*(it.future for it in items)))
        except BaseException:
            for it in items:  # a cancelled request (client gone): its items are skipped
                if not it.future.done():
                    it.future.cancel()
            raise
        finally:
            self.inside -= 1

    # ------------------------------------------------------------------------------ scheduler
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.pending:
                if self._closing:
                    return
                self._wake.clear()
                if not self._dirty:
                    await self._wake.wait()
                    continue
                try:  # batches ran since the last trim: give their freed pages back after TRIM_IDLE_S of quiet
                    await asyncio.wait_for(self._wake.wait(), TRIM_IDLE_S)
                except asyncio.TimeoutError:
                    await self._trim(loop)
            if self.max_wait > 0:
                while len(self.pending) < self.max_batch_requests and not self._closing and self.arriving():
                    left = self.pending[0].t0 + self.max_wait - time.perf_counter()
                    if left <= 0:
                        break
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), left)
                    except asyncio.TimeoutError:
                        break
            elif self.arriving():
                await asyncio.sleep(0)  # requests parsed in this turn of the loop join the batch
            batch = self._take()
            if self._depth is not None:
                self._depth.set(len(self.pending))
            if not batch:
                continue
            try:
                results = await loop.run_in_executor(self.executor, self._forward, batch)
            except Exception as e:  # a backend failure: those requests get a 500
                for it in batch:
                    if not it.future.done():
                        it.future.set_exception(e)
                continue
            for it, r in zip(batch, results):
                if not it.future.done():
                    it.future.set_result(r)
            self._dirty = True
            if not self.pending and time.perf_counter() - self._trimmed > TRIM_EVERY_S:
                await self._trim(loop)

    async def _trim(self, loop) -> None:
        """Hand the heap pages the last batches freed back to the system, on the worker thread (a flat RSS;
        glibc keeps them otherwise, fragmented among live blocks — engine/kernels/allocator.py)."""
        self._trimmed, self._dirty = time.perf_counter(), False
        await loop.run_in_executor(self.executor, trim)

    def _take(self) -> list:
        """Remove and return the next batch (see the module docstring)."""
        while self.pending and self.pending[0].future.done():  # cancelled
            self.pending.popleft()
        if not self.pending:
            return []
        if len(self.pending) == 1:  # the common case of a quiet server: nothing to choose
            return [self.pending.popleft()]
        oldest = self.pending[0]
        cands = [it for it in self.pending if it.kind == oldest.kind and not it.future.done()]
        cands = cands[:max(4 * self.max_batch_requests, 64)]
        cands.sort(key=len)
        p = next(i for i, it in enumerate(cands) if it is oldest)
        lo = hi = p
        longest = len(oldest)
        n0 = len(oldest)
        while hi - lo + 1 < self.max_batch_requests:
            left = cands[lo - 1] if lo > 0 else None
            right = cands[hi + 1] if hi + 1 < len(cands) else None
            count = hi - lo + 2
            fit_l = left is not None and count * longest <= self.max_batch_tokens
            fit_r = right is not None and count * max(longest, len(right)) <= self.max_batch_tokens
            if fit_l and (not fit_r or n0 - len(left) <= len(right) - n0):
                lo -= 1
            elif fit_r:
                hi += 1
                longest = max(longest, len(right))
            else:
                break
        chosen = cands[lo:hi + 1]
        ids = {id(it) for it in chosen}
        self.pending = collections.deque(it for it in self.pending
                                         if id(it) not in ids and not it.future.done())
        return chosen

    # ------------------------------------------------------------------------------ worker thread
    def _forward(self, batch: list) -> list:
        """Pad ``batch`` to its longest sequence, run the model once, split the outputs per item."""
        t0 = time.perf_counter()
        t = max(len(it) for it in batch)
        n = len(batch)
        ids = np.full((n, t), self.pad_id, dtype=np.int64)
        am = np.zeros((n, t), dtype=np.int64)
        tt = np.zeros((n, t), dtype=np.int64)
        for r, it in enumerate(batch):
            k = len(it)
            ids[r, :k], am[r, :k], tt[r, :k] = it.ids, 1, it.type_ids
        kind = batch[0].kind
        runner = self.model.runner
        if kind == "embed":
            h = runner(ids, am, tt, outputs=("last_hidden_state",))["last_hidden_state"]
            pooled = self.model.pool(h, am)
            out = [pooled[r] for r in range(n)]
        elif kind == "hidden":  # /embed_all: every token's last hidden state
            h = runner(ids, am, tt, outputs=("last_hidden_state",))["last_hidden_state"]
            out = [np.asarray(h[r, :len(it)], dtype=np.float32) for r, it in enumerate(batch)]
        else:
            z = runner(ids, am, tt, outputs=("logits",))["logits"]
            if kind == "logits":
                out = [z[r] for r in range(n)]
            elif kind == "token_logits":
                out = [z[r, :len(it)] for r, it in enumerate(batch)]
            else:  # qa_logits (2, T)
                out = [z[r, :, :len(it)] for r, it in enumerate(batch)]
        if self.metrics is not None:
            self.metrics.observe_batch(self.model.name, n, int(am.sum()), n * t, time.perf_counter() - t0)
        return out


__all__ = ["ModelWorker", "Item", "KINDS"]
