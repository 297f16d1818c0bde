"""``impl.kernels``: the CPU kernels compute the same function as the plain PyTorch modules, and the plain
path compiles.

Truth: the plain modules of ``bertforge.models`` (``impl.kernels=none``) on the same weights and the same
padded, mixed-length batch. For the five families and every objective head, ``cpu`` must give the same
loss, logits (at real tokens) and gradient of every parameter within 1e-5, in training (dropout 0: the
kernels draw other dropout masks than torch) and in inference; ``torch.compile`` of the plain path must
train like eager within 1e-4.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bertforge.config import ModelConfig, load_recipe
from bertforge.errors import ConfigError
from bertforge.engine.kernels import CPU_KERNELS, apply_kernels, kernels_in_use, resolve_kernels
from bertforge.task_model import TaskModel
from bertforge.objectives.electra import ElectraPretrainModel
from bertforge.objectives.rtd import generator_config

V, T = 90, 14
FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert", "mpnet")


def tiny(fam: str, **kw) -> ModelConfig:
    base = dict(model_type=fam, vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=40, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, pad_token_id=1 if fam in ("roberta", "mpnet") else 0,
                type_vocab_size={"roberta": 1, "distilbert": 0, "mpnet": 0}.get(fam, 2))
    if fam == "albert":
        base.update(embedding_size=16, layer_sharing="all", hidden_act="gelu_new")
    if fam == "electra":
        base.update(embedding_size=16)
    if fam == "distilbert":
        base.update(add_pooling_layer=False)
    base.update(kw)
    return ModelConfig(**base)


def _randomize(model: nn.Module, seed: int = 0) -> None:
    """Move every weight off its initial value (LayerNorms ≠ 1, biases ≠ 0), so each one matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _batch(head: str, cfg: ModelConfig, seed: int = 1) -> dict:
    """A right-padded batch of three sequences of lengths T, 9 and 5, with the labels ``head`` reads."""
    g = torch.Generator().manual_seed(seed)
    b = 3
    ids = torch.randint(5, V, (b, T), generator=g)
    am = torch.ones(b, T, dtype=torch.long)
    for i, n in enumerate((T, 9, 5)):
        am[i, n:] = 0
        ids[i, n:] = cfg.pad_token_id
    batch = {"input_ids": ids, "attention_mask": am}
    if cfg.type_vocab_size > 1:
        tt = torch.zeros(b, T, dtype=torch.long)
        tt[:, 4:] = 1
        batch["token_type_ids"] = tt * am
    real = am.bool()
    if head in ("mlm", "mlm_nsp", "mlm_sop", "mlm_sbo", "electra", "electra_generator"):
        sel = (torch.rand(b, T, generator=g) < 0.3) & real
        sel[:, 1] = True  # every sequence has a target
        labels = torch.full((b, T), -100)
        labels[sel] = ids[sel]
        batch["labels"] = labels
    if head == "mlm_nsp":
        batch["next_sentence_label"] = torch.tensor([0, 1, 1])
    if head == "mlm_sop":
        batch["sentence_order_label"] = torch.tensor([1, 0, 1])
    if head == "mlm_sbo":  # each target's span boundaries: its neighbours, inside the sequence
        pos = torch.arange(T).expand(b, T)
        lengths = am.sum(1, keepdim=True)
        batch.update(span_left=(pos - 1).clamp(min=0), span_right=torch.minimum(pos + 1, lengths - 1),
                     span_pos=torch.zeros(b, T, dtype=torch.long))
    if head == "electra_discriminator":
        batch["labels"] = (torch.rand(b, T, generator=g) < 0.2).float()
    if head == "classification":
        batch["labels"] = torch.tensor([0, 2, 1])
    if head == "regression":
        batch["labels"] = torch.tensor([0.5, -1.0, 2.0])
    if head == "token_classification":
        labels = torch.randint(0, 3, (b, T), generator=g)
        batch["labels"] = labels.masked_fill(~real, -100)
    if head == "question_answering":
        batch["start_positions"] = torch.tensor([2, 3, 1])
        batch["end_positions"] = torch.tensor([5, 4, 3])
    return batch


def _model(fam: str, head: str) -> nn.Module:
    torch.manual_seed(0)
    if head == "electra":
        model = ElectraPretrainModel(tiny(fam), gen_config=generator_config(tiny(fam), 0.5))
    elif head == "electra_generator":
        model = TaskModel(generator_config(tiny(fam), 0.5), head="mlm")
    else:
        name = {"classification": "sequence_classification", "regression": "sequence_classification"}.get(head, head)
        labels = {"classification": 3, "regression": 1, "token_classification": 3}.get(head, 2)
        model = TaskModel(tiny(fam, num_labels=labels), head=name)
    _randomize(model)
    return model


def _close(a, b, what, tol=1e-5):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    err = float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0
    assert err <= tol, (what, err)


def _compare(model: nn.Module, batch: dict, real: torch.Tensor) -> None:
    plain = apply_kernels(copy.deepcopy(model), "none")
    fast = apply_kernels(copy.deepcopy(model), "cpu")
    assert kernels_in_use(plain) == "none" and kernels_in_use(fast) == "cpu"
    outs = []
    for m in (plain, fast):
        m.train()
        torch.manual_seed(5)  # the ELECTRA generator's samples
        out = m(**batch)
        out.loss.backward()
        outs.append(out)
    p, f = outs
    _close(p.loss, f.loss, "loss")
    if p.logits is not None:
        lp, lf = p.logits, f.logits
        if lp.shape[:2] == real.shape:  # per-token outputs: padding positions hold no defined value
            lp, lf = lp[real], lf[real]
        _close(lp, lf, "logits")
    grads = {n: q.grad for n, q in fast.named_parameters()}
    n_grads = 0
    for name, q in plain.named_parameters():
        if q.grad is None:
            assert grads[name] is None or not grads[name].any(), name
            continue
        _close(q.grad, grads[name], name)
        n_grads += 1
    assert n_grads >= 10
    # inference: in-place activations, [CLS]-only and unpadded last blocks
    for m in (plain, fast):
        m.eval()
    with torch.no_grad():
        inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        if isinstance(model, ElectraPretrainModel):
            plain, fast = plain.discriminator, fast.discriminator
        a, b = plain(**inputs), fast(**inputs)
    for x, y, what in ((a.logits, b.logits, "eval logits"), (a.last_hidden_state, b.last_hidden_state, "eval h")):
        if x is not None:
            if x.shape[:2] == real.shape:
                x, y = x[real], y[real]
            _close(x, y, what)


COMMON_HEADS = ("mlm", "classification", "regression", "token_classification", "question_answering", "base")
CASES = [(fam, head) for fam in FAMILIES for head in COMMON_HEADS] + [
    ("bert", "mlm_nsp"), ("albert", "mlm_sop"), ("bert", "mlm_sbo"), ("electra", "electra_discriminator"),
    ("electra", "electra_generator"), ("electra", "electra")]


@pytest.mark.parametrize("fam,head", CASES)
def test_cpu_kernels_equal_plain_pytorch(fam, head):
    model = _model(fam, head)
    batch = _batch(head, model.config)
    real = batch["attention_mask"].bool()
    if head == "base":  # no loss: a sum of the hidden states at real tokens stands in for one
        class WithLoss(nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, **kw):
                out = self.m(**kw)
                out.loss = (out.last_hidden_state[real] ** 2).sum() * 1e-2 + out.pooler_output.sum() \
                    if out.pooler_output is not None else (out.last_hidden_state[real] ** 2).sum() * 1e-2
                return out
        model = WithLoss(model)
    _compare(model, batch, real)


def test_apply_kernels_swaps_classes_in_place_and_back_keeping_state():
    model = _model("bert", "mlm")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    assert apply_kernels(model, "cpu") is model
    kinds = {type(m) for m in model.modules()}
    assert set(CPU_KERNELS.values()) <= kinds and not set(CPU_KERNELS) & kinds
    assert [id(p) for p in model.parameters()] == params
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()) and state.keys() == model.state_dict().keys()
    apply_kernels(model, "cpu")  # idempotent
    apply_kernels(model, "none")
    assert kernels_in_use(model) == "none"
    assert {type(m) for m in model.modules() if isinstance(m, nn.Dropout)} == {nn.Dropout}
    assert [id(p) for p in model.parameters()] == params


def test_auto_picks_cpu_kernels_on_a_cpu_and_bad_modes_are_config_errors():
    model = _model("bert", "classification")
    assert resolve_kernels(model, "auto") == "cpu" and resolve_kernels(model, "none") == "none"
    meta = copy.deepcopy(model).to("meta")  # parameters elsewhere than on a CPU: the plain modules
    assert resolve_kernels(meta, "auto") == "none"
    with pytest.raises(ConfigError, match="auto, cpu, none"):
        apply_kernels(model, "fast")
    with pytest.raises(ConfigError, match="impl.kernels='fast'; choose one of auto, cpu, none"):
        load_recipe(None, ["impl.kernels=fast"])
    assert load_recipe(None, ["impl.kernels=none"]).impl.kernels == "none"


def test_torch_compile_of_the_plain_path_trains_like_eager():
    """torch.compile (inductor) of a model prepared with ``auto`` kernels: the kernels step aside while
    compiling; three SGD steps on a padded MLM batch match eager plain PyTorch within 1e-4 (SGD: Adam would
    turn rounding noise in a zero gradient, e.g. the key bias's, into whole steps)."""
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is not available in this PyTorch")
    model = _model("bert", "mlm")
    batch = _batch("mlm", model.config)
    eager = apply_kernels(copy.deepcopy(model), "none")
    compiled_src = apply_kernels(copy.deepcopy(model), "auto")
    compiled = torch.compile(compiled_src)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled_src)]
    for step in range(3):
        losses = []
        for m, opt in zip((eager, compiled), opts):
            m.train()
            loss = m(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        assert abs(losses[0] - losses[1]) < 1e-4, (step, losses)
    for (name, a), b in zip(eager.named_parameters(), compiled_src.parameters()):
        _close(a.detach(), b.detach(), name, tol=1e-4)
