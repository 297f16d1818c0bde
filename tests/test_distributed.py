"""DDP under torchrun: N processes with the same global batch train exactly like one process.

Independent truths: the single-process run (same data, same global batch) for the 2-process run; the
plain concatenation of the global micro-batch for the rank shards; a hand-counted checkpoint rotation.
"""
from __future__ import annotations

import shutil

import pytest
import torch

from helpers import (bertforge_cmd, load_weights, make_tiny_checkpoint, read_metrics, run,
                     sentences, torchrun_cmd, write_tsv)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    ckpt = make_tiny_checkpoint(d / "tiny")
    train = write_tsv(d / "train.tsv", sentences(100, 1))
    dev = write_tsv(d / "dev.tsv", sentences(24, 2))
    return d, ckpt, train, dev


# ----------------------------------------------------------------------------------------- in-process
class _MaskingCollator:
    """Pads and draws a random 'mask' per token (stands in for dynamic MLM masking)."""

    def __call__(self, items):
        t = max(len(x) for x in items)
        ids = torch.zeros(len(items), t, dtype=torch.long)
        for i, x in enumerate(items):
            ids[i, :len(x)] = torch.tensor(x)
        return {"input_ids": ids, "mask": torch.rand(len(items), t) < 0.15,
                "labels": ids.sum(1), "scalar": torch.tensor(3.0)}


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(1, 1)


def _trainer(monkeypatch, tmp_path, rank, world, n=37, batch=8, accum=2):
    from bertforge.config import Recipe
    from bertforge.engine.train import distributed as du
    from bertforge.engine.train import trainer as tr
    monkeypatch.setattr(du, "init_distributed", lambda: du.DistContext(rank, world))
    monkeypatch.setattr(du, "wrap_model", lambda m, ctx, parallel="ddp": m)
    r = Recipe()
    r.train.batch_size, r.train.grad_accum_steps, r.train.seed = batch, accum, 5
    r.impl.progress = False
    data = [[i + 1] + list(range(1, 1 + (i * 7) % 11)) for i in range(n)]  # first token = id
    return tr.Trainer(_Lin(), data, _MaskingCollator(), r, tmp_path / f"r{rank}")


def test_rank_shards_reassemble_the_single_process_batches(monkeypatch, tmp_path):
    one = _trainer(monkeypatch, tmp_path, 0, 1)
    shards = [_trainer(monkeypatch, tmp_path, r, 2) for r in range(2)]
    assert one.steps_per_epoch == shards[0].steps_per_epoch == 37 // 16
    for epoch in (0, 1):
        ref = list(one._batches(epoch, 0))
        per_rank = [list(s._batches(epoch, 0)) for s in shards]
        assert len(ref) == len(per_rank[0]) == len(per_rank[1]) == 2 * 2
        for j, b in enumerate(ref):
            a0, a1 = per_rank[0][j], per_rank[1][j]
            for k in ("input_ids", "mask", "labels"):
                merged = torch.empty_like(b[k])
                merged[0::2], merged[1::2] = a0[k], a1[k]
                assert torch.equal(merged, b[k]), (epoch, j, k)  # same rows, same random masks
            assert a0["scalar"] == b["scalar"]  # non-batch tensors reach every rank unchanged
        # resuming at step 1 skips exactly accum micro-batches
        skipped = list(one._batches(epoch, 1))
        assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(skipped, ref[2:]))
    e0 = torch.cat([b["input_ids"][:, 0] for b in one._batches(0, 0)])
    e1 = torch.cat([b["input_ids"][:, 0] for b in one._batches(1, 0)])
    assert not torch.equal(e0, e1)  # a fresh shuffle each epoch


def test_dataset_smaller_than_global_batch_is_a_config_error(monkeypatch, tmp_path):
    """Every row of such a batch would repeat examples (a mistake in --batch-size); equal sizes train."""
    from bertforge.errors import ConfigError
    with pytest.raises(ConfigError, match="train.batch_size 8 exceeds the 5 training examples"):
        _trainer(monkeypatch, tmp_path, 0, 1, n=5, batch=8, accum=1)
    t = _trainer(monkeypatch, tmp_path, 0, 1, n=8, batch=8, accum=1)
    batches = list(t._batches(0, 0))
    assert t.steps_per_epoch == 1 and len(batches) == 1 and batches[0]["input_ids"].shape[0] == 8


def test_batch_not_divisible_by_world_is_a_config_error(monkeypatch, tmp_path):
    from bertforge.errors import ConfigError
    with pytest.raises(ConfigError, match="multiple of 2"):
        _trainer(monkeypatch, tmp_path, 0, 2, batch=7)


# ----------------------------------------------------------------------------------------- torchrun
def _finetune_args(ckpt, train, dev, out, extra=()):
    return ["finetune", "--model", ckpt, "--task", "sst2", "--train", train, "--eval", dev, "--out", out,
            "--max-steps", 6, "--batch-size", 8, "--max-seq-len", 32, "--no-progress",
            "train.dropout_off=true", "train.log_every=1", "train.save_every=3", "train.lr=2e-3",
            "train.grad_accum_steps=2", "train.deterministic=true", *extra]


@pytest.fixture(scope="module")
def finetune_one(tiny):
    d, ckpt, train, dev = tiny
    one = d / "one"
    r1 = run(bertforge_cmd(*_finetune_args(ckpt, train, dev, one)))
    assert r1.returncode == 0, r1.stderr
    return one


def test_finetune_two_processes_equal_one(tiny, finetune_one):
    d, ckpt, train, dev = tiny
    one, two = finetune_one, d / "two"
    r2 = run(torchrun_cmd(2, *_finetune_args(ckpt, train, dev, two)))
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert r2.stdout.count('"out"') == 1  # only rank 0 reports
    m1 = [m for m in read_metrics(one) if "loss" in m]
    m2 = [m for m in read_metrics(two) if "loss" in m]
    assert [m["step"] for m in m1] == [m["step"] for m in m2] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(m1, m2):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * max(1.0, abs(a["loss"])), (a, b)
        assert a["lr"] == pytest.approx(b["lr"])
    assert m1[-1]["loss"] < m1[0]["loss"]  # it did learn something (lr 2e-3)
    w1, w2 = load_weights(one / "model.safetensors"), load_weights(two / "model.safetensors")
    assert w1.keys() == w2.keys()
    diff = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert diff <= 1e-5, diff
    moved = max((w1[k] - load_weights(one / "checkpoints" / "step-3" / "model.safetensors")[k])
                .abs().max().item() for k in w1)
    assert moved > 1e-4  # the weights compared really changed during training
    # rank-0-only writing: one run dir, both checkpoints, nothing stray
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["step-3", "step-6"]
    shutil.rmtree(two)


def test_fsdp_two_processes_equal_one_and_resume(tiny, finetune_one):
    """impl.parallel=fsdp (FSDP2 fully_shard, gloo): same curve and weights as 1 process; checkpoints hold
    full (gathered) HF-layout weights; dropping the last checkpoint and resuming from step 3 under FSDP
    ends bit-identical to the uninterrupted FSDP run."""
    d, ckpt, train, dev = tiny
    one, fs = finetune_one, d / "fsdp"
    args = _finetune_args(ckpt, train, dev, fs, ["impl.parallel=fsdp"])
    r = run(torchrun_cmd(2, *args))
    assert r.returncode == 0, r.stderr[-3000:]
    m1 = [m["loss"] for m in read_metrics(one) if "loss" in m]
    m2 = [m["loss"] for m in read_metrics(fs) if "loss" in m]
    assert len(m1) == len(m2) == 6 and all(abs(a - b) <= 1e-5 for a, b in zip(m1, m2)), (m1, m2)
    w1, w2 = load_weights(one / "model.safetensors"), load_weights(fs / "model.safetensors")
    assert w1.keys() == w2.keys() and max((w1[k] - w2[k]).abs().max().item() for k in w1) <= 1e-5
    final = {k: v.clone() for k, v in w2.items()}
    shutil.rmtree(fs / "checkpoints" / "step-6")
    (fs / "model.safetensors").unlink()
    r = run(torchrun_cmd(2, *args, "--resume"))
    assert r.returncode == 0, r.stderr[-3000:]
    w3 = load_weights(fs / "model.safetensors")
    assert all(torch.equal(final[k], w3[k]) for k in final)


def _corpus(path):
    import random
    from helpers import WORDS
    rng = random.Random(0)
    docs = []
    for _ in range(30):
        docs.append("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "."
                              for _ in range(rng.randint(3, 7))))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def test_pretrain_two_processes_equal_one(tiny):
    """BERT objective (dynamic MLM + NSP): the masks are drawn per global micro-batch and the MLM loss is
    normalised by the global masked-token count, so 2 shards give the 1-process loss curve and weights."""
    d = tiny[0]
    corpus = _corpus(d / "corpus.txt")
    args = ["pretrain", "--objective", "bert", "--corpus", corpus, "--size", "tiny", "--vocab-size", 200,
            "--max-seq-len", 32, "--max-steps", 4, "--batch-size", 8, "--cache-dir", d / "cache",
            "--no-progress", "train.dropout_off=true", "train.log_every=1", "model.hidden_size=32",
            "model.embedding_size=32", "model.intermediate_size=64", "train.eval_every=1000",
            "train.deterministic=true"]
    one, two = d / "p1", d / "p2"
    r1 = run(bertforge_cmd(*args, "--out", one))
    assert r1.returncode == 0, r1.stderr
    r2 = run(torchrun_cmd(2, *args, "--out", two))
    assert r2.returncode == 0, r2.stderr[-3000:]
    m1 = [m for m in read_metrics(one) if "loss" in m]
    m2 = [m for m in read_metrics(two) if "loss" in m]
    assert len(m1) == len(m2) == 4
    for a, b in zip(m1, m2):
        for k in ("loss", "mlm_loss", "nsp_loss"):
            assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), (k, a, b)
        assert a["mlm_count"] == b["mlm_count"]  # masked tokens per global micro-batch: same masks
    w1, w2 = load_weights(one / "model.safetensors"), load_weights(two / "model.safetensors")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) <= 1e-5


def test_prebatched_dataset_gives_each_rank_its_own_items(monkeypatch, tmp_path):
    """Token-count batches (translation): items are whole batches, so under W ranks the global micro-batch
    is W items and rank r trains on item r of it — together the single process's items, in order."""
    from bertforge.config import Recipe
    from bertforge.engine.train import distributed as du
    from bertforge.engine.train import trainer as tr

    class Batches(list):
        prebatched = True

    data = Batches({"input_ids": torch.full((2, 3), i)} for i in range(10))
    r = Recipe()
    r.train.batch_size, r.train.seed = 1, 3
    r.impl.progress = False
    got = {}
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        monkeypatch.setattr(du, "init_distributed", lambda: du.DistContext(rank, world))
        monkeypatch.setattr(du, "wrap_model", lambda m, ctx, parallel="ddp": m)
        t = tr.Trainer(_Lin(), data, lambda items: items[0], r, tmp_path / f"p{rank}{world}")
        assert t.steps_per_epoch == 10 // world
        got[rank, world] = [int(b["input_ids"][0, 0]) for b in t._batches(0, 0)]
    single = got[0, 1]
    assert sorted(single) == list(range(10))
    assert [x for pair in zip(got[0, 2], got[1, 2]) for x in pair] == single
