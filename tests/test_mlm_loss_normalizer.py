"""The MLM loss under data parallelism: a shard divides its summed loss by ``loss_normalizer`` (global
count of targets / W), so the average of the shards' gradients — what DDP computes — is the gradient of
the mean over the global batch, also when the shards hold different numbers of masked tokens.

Independent truth: ``F.cross_entropy`` over the whole batch's masked positions (mean), and its gradient."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from bertforge.config import ModelConfig
from bertforge.engine.train.distributed import loss_normalizer, shard_batch
from bertforge.task_model import TaskModel


def _model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
    return TaskModel(cfg, head="mlm")


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 40, (4, 10), generator=g)
    labels = torch.full_like(ids, -100)
    # rows 0 and 2 (shard 0) have 1 and 2 targets, rows 1 and 3 (shard 1) have 5 and 4: unequal shards
    for row, cols in ((0, [1]), (1, [0, 2, 4, 6, 8]), (2, [3, 7]), (3, [1, 2, 5, 9])):
        labels[row, cols] = ids[row, cols]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_normalised_shards_average_to_the_global_mean_and_its_gradient():
    model, batch = _model(), _batch()
    sel = batch["labels"] != -100
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["attention_mask"]).logits  # (B, T, V), no labels: dense
    truth = F.cross_entropy(logits[sel], batch["labels"][sel])
    g_full = _grads(model, model(**batch).loss)
    norm = loss_normalizer(batch, 2)
    assert norm.shape == () and float(norm) == 12 / 2
    losses, grads = [], []
    for r in range(2):
        shard = {**shard_batch(batch, r, 2, 4), "loss_normalizer": norm}
        out = model(**shard)
        losses.append(out.loss.detach())
        grads.append(_grads(model, out.loss))
    assert torch.allclose((losses[0] + losses[1]) / 2, truth, atol=1e-6)
    for n, g in g_full.items():
        assert torch.allclose((grads[0][n] + grads[1][n]) / 2, g, atol=1e-6), n
    # without the normaliser each shard takes its own mean, and the average is not the global one
    own = [model(**shard_batch(batch, r, 2, 4)).loss.detach() for r in range(2)]
    assert not torch.allclose((own[0] + own[1]) / 2, truth, atol=1e-3)


def test_no_normaliser_for_sequence_labels_and_single_process_default():
    assert loss_normalizer({"labels": torch.tensor([0, 1, 1])}, 2) is None  # sequence-level labels
    model, batch = _model(), _batch()
    # one process: the default divisor is this batch's own target count, i.e. the plain mean
    with torch.no_grad():
        a = model(**batch).loss
        b = model(**batch, loss_normalizer=torch.tensor(12.0)).loss
    assert torch.equal(a, b)
