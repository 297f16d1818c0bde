"""The serve worker gives freed heap pages back (malloc_trim) when its queue runs empty, at most once per
TRIM_EVERY_S, and never between batches of a busy queue."""
import asyncio
from types import SimpleNamespace

import numpy as np
from tokenizers import Tokenizer, models

from bertforge.server import batching


class _Runner:
    def __init__(self):
        self.calls = 0

    def __call__(self, ids, am, tt, outputs=()):
        self.calls += 1
        return {"last_hidden_state": np.ones((*ids.shape, 4), dtype=np.float32)}


def _worker(monkeypatch, every: float, idle: float = 3600.0):
    trims = []
    monkeypatch.setattr(batching, "trim", lambda: trims.append(1))
    monkeypatch.setattr(batching, "TRIM_EVERY_S", every)
    monkeypatch.setattr(batching, "TRIM_IDLE_S", idle)
    tok = Tokenizer(models.WordLevel({"[PAD]": 0, "a": 1}, unk_token="[PAD]"))
    model = SimpleNamespace(name="m", tokenizer=tok, runner=_Runner(), pool=lambda h, am: h.mean(1))
    return batching.ModelWorker(model, max_batch_requests=2), trims


def _seqs(n):
    return [SimpleNamespace(ids=[1] * (k + 1), type_ids=[0] * (k + 1)) for k in range(n)]


async def _until(cond, timeout: float = 5.0):
    """Wait (a loaded host may be slow to run the worker thread) until ``cond()`` or the timeout."""
    end = asyncio.get_running_loop().time() + timeout
    while not cond() and asyncio.get_running_loop().time() < end:
        await asyncio.sleep(0.005)


def test_idle_worker_trims_and_a_busy_one_does_not(monkeypatch):
    async def go(every):
        w, trims = _worker(monkeypatch, every)
        w.start()
        for k in range(3):  # three requests, one after the other: the queue runs empty after each
            await w.run_items(_seqs(1), "embed")
            await _until(lambda: len(trims) > k, timeout=5.0 if every == 0 else 0.05)  # the trim follows the answer
        n_idle = len(trims)
        trims.clear()
        out = await w.run_items(_seqs(8), "embed")  # 8 items, batches of 2: empty only after the 4th batch
        await _until(lambda: len(trims) >= 1, timeout=5.0 if every == 0 else 0.05)
        await asyncio.sleep(0.05)
        await w.stop()
        return n_idle, len(trims), len(out), w.model.runner.calls

    n_idle, n_busy, n_out, calls = asyncio.run(go(0.0))
    assert n_idle == 3 and n_out == 8 and calls == 3 + 4
    assert n_busy == 1  # once, when the queue ran empty — not after each of the 4 batches
    n_idle, _, _, _ = asyncio.run(go(3600.0))
    assert n_idle == 0  # within TRIM_EVERY_S of the last trim (the worker's start): none


def test_a_quiet_worker_trims_once_after_its_last_batch(monkeypatch):
    async def go():
        w, trims = _worker(monkeypatch, every=3600.0, idle=0.05)
        w.start()
        await asyncio.sleep(0.2)
        before = len(trims)  # no batch yet: nothing to give back
        await w.run_items(_seqs(3), "embed")
        await _until(lambda: len(trims) >= 1)  # quiet for longer than TRIM_IDLE_S: one trim…
        await asyncio.sleep(0.3)  # …then none while idle
        after = len(trims)
        await w.stop()
        return before, after

    assert asyncio.run(go()) == (0, 1)
