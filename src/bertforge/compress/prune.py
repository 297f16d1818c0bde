"""Structured pruning of attention heads and FFN neurons, and unstructured magnitude pruning.

Head importance (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?", §4.1 eq. 2):
every head h gets a gate ξ_h (= 1) on its context vector, Att_h(x) ↦ ξ_h·Att_h(x), and

    I_h = E_{x∼X} | ∂L(x) / ∂ξ_h |

estimated over a data sample, *per example* (the gates have shape (B, heads), so each example's gradient is
its own). Scores are L2-normalised within each layer (§4.1, after Molchanov et al. 2017) and heads are
removed globally in order of increasing importance. FFN neurons get the same treatment with a gate on
each intermediate unit (a forward pre-hook on ``ffn.output``).

The loss L can be

* ``task``   — the model's own loss on labelled data (Michel et al.);
* ``fisher`` — label-free: L = −log p(ŷ|x) with ŷ sampled from the model's *own* predictive distribution
  (classification/MLM logits; for a head-less encoder a Gaussian on the last hidden state). The KL from
  the unpruned model, KL(p_1 ‖ p_ξ), has zero gradient at ξ = 1; its curvature is the Fisher information,
  E_ŷ[(∂ log p(ŷ|x)/∂ξ)²], whose diagonal these sampled gradients estimate (Kwon et al. 2022, "A Fast
  Post-Training Pruning Framework for Transformers", §3 use the same Fisher on head/neuron masks);
* ``mlm``    — label-free for models with a masked-LM head (logits (B, T, V)): 15% of tokens are replaced
  by ``[MASK]`` and L is the cross-entropy of the originals (Devlin et al. 2018 §3.1).

Physical removal (:func:`prune_heads`, :func:`prune_ffn`) slices the fused ``qkv`` rows of the removed heads
in each of the Q, K, V blocks and the matching input columns of ``out``; FFN pruning slices rows of
``intermediate`` and columns of ``output``. The new shapes go into ``ModelConfig.layer_num_heads`` /
``layer_intermediate_sizes`` (saved in ``config.json``) so the directory reloads with
:func:`bertforge.checkpoint.read.load_pretrained`. A layer may lose every head: its attention block then returns only
the output bias and the residual carries the input. ``transformers`` 5.x no longer reads ``pruned_heads``
from ``config.json`` (and has no per-layer FFN width), so a pruned dir loads in bertforge only; a dir whose
layers all keep the same FFN width and every head is still a plain ``transformers`` checkpoint.

Magnitude pruning (:func:`magnitude_prune`; Han et al. 2015) zeroes the smallest-|w| weights of the encoder's
Linear layers (not the pooler or task head, see there) with :mod:`torch.nn.utils.prune`. It changes neither
the dense file size nor the latency; the report says so and gives the size a sparse (CSR) encoding would
take.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..heads import has_mlm_head
from ..models.attention import linear
from ..models.output import Features

LOSSES = ("auto", "task", "fisher", "mlm")


def _check_prunable(model) -> None:
    if model.config.layer_sharing != "none":
        raise ConfigError(f"model.layer_sharing={model.config.layer_sharing!r}: layers share weights, so "
                          "heads cannot be removed per layer; prune a model without cross-layer sharing")


def head_counts(model) -> list:
    """Heads per layer of ``model`` (a :class:`~bertforge.task_model.TaskModel`)."""
    return [lyr.attention.num_heads for lyr in model.encoder.layers]


def _ffn_output(ffn) -> nn.Linear:
    """The FFN's output projection (I → H): ``output`` (BERT), ``wo`` (ModernBERT's GeGLU)."""
    return ffn.wo if hasattr(ffn, "wo") else ffn.output


def ffn_sizes(model) -> list:
    return [_ffn_output(lyr.ffn).in_features for lyr in model.encoder.layers]


# ------------------------------------------------------------------------------------------ importance
@contextmanager
def _ffn_gates(model, gates: list):
    """Multiply each layer's FFN activations (B, T, I) by ``gates[l]`` (B, I) via a pre-hook on ffn.output."""
    handles = []
    for lyr, g in zip(model.encoder.layers, gates):
        def hook(mod, inputs, g=g):
            return (inputs[0] * g[:, None, :].to(inputs[0].dtype),)
        handles.append(_ffn_output(lyr.ffn).register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


#: batch keys holding supervision: class / tag ids, or extractive QA's answer span
LABEL_KEYS = ("labels", "start_positions", "end_positions")


def has_labels(batch: dict) -> bool:
    return "labels" in batch or "start_positions" in batch


def is_qa(model) -> bool:
    """Whether ``model`` has an extractive-QA head: its logits are (B, 2, T), start and end over positions."""
    return getattr(model, "head_name", None) == "question_answering"


def is_multi_label(model) -> bool:
    """Whether ``model``'s head is a multi-label classifier (C independent sigmoids, BCE)."""
    return getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification"


def _f32(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _loss(model, out, batch: dict, mode: str, generator: torch.Generator) -> torch.Tensor:
    """Sum over the batch of per-example losses (so ∂/∂gate[b] is example b's own gradient)."""
    mask = batch.get("attention_mask")
    logits = out.logits
    if is_qa(model) and logits is not None and mask is not None:  # (B, 2, T): no answer in the padding
        logits = logits.masked_fill(~mask.bool()[:, None, :], -1e4)
    if mode == "task" and "start_positions" in batch:  # extractive QA: start and end CE (Devlin et al. §4.2)
        return 0.5 * (F.cross_entropy(_f32(logits[:, 0]), batch["start_positions"], reduction="sum")
                      + F.cross_entropy(_f32(logits[:, 1]), batch["end_positions"], reduction="sum"))
    if mode == "task":
        labels = batch["labels"]
        if logits is None:
            raise ConfigError("--loss task needs a model with a task head; use --loss fisher")
        if is_multi_label(model):  # C independent sigmoids: BCE summed over the labels (tasks/multilabel.py)
            return F.binary_cross_entropy_with_logits(_f32(logits), labels.to(_f32(logits).dtype), reduction="sum")
        if logits.dim() == 2 and logits.shape[-1] == 1:
            return 0.5 * ((_f32(logits.squeeze(-1)) - labels.to(_f32(logits).dtype)) ** 2).sum()
        if logits.dim() == 2:
            return F.cross_entropy(_f32(logits), labels.long(), reduction="sum")
        return F.cross_entropy(_f32(logits).flatten(0, -2), labels.long().flatten(),
                               ignore_index=-100, reduction="sum")
    if mode == "mlm":
        sel = batch["_mlm_selected"]
        return F.cross_entropy(_f32(out.logits)[sel], batch["_mlm_targets"][sel], reduction="sum")
    # fisher: sample ŷ ~ p(·|x) from the model's own prediction (QA: a start and an end position)
    if logits is not None and is_multi_label(model):  # one Bernoulli per label
        z = _f32(logits)
        with torch.no_grad():
            y = torch.bernoulli(torch.sigmoid(z), generator=generator)
        return F.binary_cross_entropy_with_logits(z, y, reduction="sum")
    if logits is not None and logits.shape[-1] > 1:
        lp = torch.log_softmax(_f32(logits), -1)
        with torch.no_grad():
            y = torch.multinomial(lp.exp().flatten(0, -2), 1, generator=generator).view(lp.shape[:-1])
        nll = -lp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        if nll.dim() == 2 and mask is not None and nll.shape == mask.shape:
            nll = nll * mask
        return nll.sum()
    # Gaussian predictive distribution: y = f(x) + ε, ε ~ N(0, I); −log p(y) = ½‖f(x) − y‖²
    h = logits if logits is not None else out.last_hidden_state
    eps = torch.randn(h.shape, generator=generator, dtype=torch.float32).to(h.device, _f32(h).dtype)
    nll = -(eps * _f32(h))  # ∂/∂h of ½‖h − (h.detach() + ε)‖² is −ε
    if h.dim() == 3 and mask is not None:
        nll = nll * mask[..., None]
    return nll.sum()


def _mask_for_mlm(batch: dict, mask_token_id: int, special_ids: Iterable[int], generator) -> dict:
    ids = batch["input_ids"]
    prob = torch.full(ids.shape, 0.15)
    cand = torch.ones_like(ids, dtype=torch.bool)
    for s in special_ids:
        cand &= ids != s
    if "attention_mask" in batch:
        cand &= batch["attention_mask"].bool()
    sel = (torch.bernoulli(prob, generator=generator).bool() & cand)
    b = dict(batch)
    b["_mlm_targets"] = ids.clone()
    b["_mlm_selected"] = sel
    b["input_ids"] = ids.masked_fill(sel, mask_token_id)
    return b


def check_loss(model, loss: str) -> None:
    """Reject an importance loss the model cannot compute.

    Raises:
        ConfigError: unknown loss; ``mlm`` on a model without a masked-LM head.
    """
    if loss not in LOSSES:
        raise ConfigError(f"--loss {loss!r}; choose one of {', '.join(LOSSES)}")
    if loss == "mlm" and not has_mlm_head(model):
        head = getattr(model, "head_name", None) or "base"
        raise ConfigError(f"--loss mlm needs a model with an MLM head (this one has head {head!r}); use "
                          f"--loss task (labelled data) or fisher")


def resolve_loss(model, batch: dict, loss: str) -> str:
    """The loss ``auto`` stands for on ``batch`` (``loss`` already passed :func:`check_loss`)."""
    if loss != "auto":
        return loss
    return "task" if (has_labels(batch) and model.head is not None) else "fisher"


def compute_importance(model, batches: Iterable[dict], loss: str = "auto", ffn: bool = True,
                       normalize: bool = True, seed: int = 0, mask_token_id: Optional[int] = None,
                       special_ids: Iterable[int] = ()) -> dict:
    """Head (and FFN-neuron) importance I = Σ_x |∂L(x)/∂ξ| (Michel et al. 2019, eq. 2), per example.

    Args:
        model: a :class:`~bertforge.task_model.TaskModel`; it is put in eval mode (no dropout) and
            its parameters get no gradient.
        batches: dicts of (B, T) tensors ``input_ids``, ``attention_mask``, ``token_type_ids`` (+ ``labels``,
            or QA's ``start_positions`` / ``end_positions``, for ``loss="task"``).
        loss: ``auto`` (``task`` when batches carry labels, else ``fisher``), ``task``, ``fisher``, ``mlm``.
        ffn: also score FFN neurons.
        normalize: L2-normalise scores within each layer (Michel et al. §4.1).
        mask_token_id / special_ids: for ``loss="mlm"``.
    Returns:
        ``{"heads": [Tensor (heads_l,)] per layer, "ffn": [Tensor (I_l,)] or None, "loss": mode,
        "examples": n}`` — unnormalised sums are in ``heads_raw`` / ``ffn_raw``.
    Raises:
        ConfigError: unknown loss; ``task`` without labels; ``mlm`` without a [MASK] id or without an
        MLM head.
    """
    check_loss(model, loss)
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    req = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    heads = [torch.zeros(n, dtype=torch.float64) for n in head_counts(model)]
    neurons = [torch.zeros(n, dtype=torch.float64) for n in ffn_sizes(model)] if ffn else None
    mode, n_ex = None, 0
    try:
        for batch in batches:
            mode = mode or resolve_loss(model, batch, loss)
            if mode == "task" and not has_labels(batch):
                raise ConfigError("--loss task needs labelled data; pass a labelled file or --loss fisher")
            if mode == "mlm":
                if mask_token_id is None:
                    raise ConfigError("--loss mlm needs a tokenizer with a [MASK] token; use --loss fisher")
                batch = _mask_for_mlm(batch, mask_token_id, special_ids, g)
            batch = {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in batch.items()}
            b = batch["input_ids"].shape[0]
            hg = [torch.ones(b, n, device=dev, requires_grad=True) for n in head_counts(model)]
            fg = [torch.ones(b, n, device=dev, requires_grad=True) for n in ffn_sizes(model)] if ffn else []
            inputs = {k: v for k, v in batch.items() if not k.startswith("_") and k not in LABEL_KEYS}
            with (_ffn_gates(model, fg) if ffn else _nullctx()):
                out = model(**inputs, features=Features(head_gates=hg))
                value = _loss(model, out, batch, mode, g)
            grads = torch.autograd.grad(value, hg + fg, allow_unused=True)
            for i, gr in enumerate(grads[:len(hg)]):
                if gr is not None:
                    heads[i] += gr.detach().abs().sum(0).double().cpu()
            for i, gr in enumerate(grads[len(hg):]):
                if gr is not None:
                    neurons[i] += gr.detach().abs().sum(0).double().cpu()
            n_ex += b
    finally:
        for p, r in zip(model.parameters(), req):
            p.requires_grad_(r)
        model.train(was_training)
    if n_ex == 0:
        raise ConfigError("no examples to score importance on; pass a non-empty --data file")
    heads = [h / n_ex for h in heads]
    neurons = [n / n_ex for n in neurons] if ffn else None
    out = {"heads_raw": heads, "ffn_raw": neurons, "loss": mode, "examples": n_ex}
    out["heads"] = [_l2(h) for h in heads] if normalize else heads
    out["ffn"] = ([_l2(n) for n in neurons] if normalize else neurons) if ffn else None
    return out


@contextmanager
def _nullctx():
    yield


def _l2(x: torch.Tensor) -> torch.Tensor:
    n = x.norm(p=2)
    return x / n if n > 0 else x


def lowest(scores: list, k: int, min_keep: int = 0) -> dict:
    """The ``k`` globally lowest entries of per-layer ``scores`` → {layer: [indices]}.

    ``min_keep``: entries each layer keeps at least (0 lets a layer lose every head)."""
    cand = []
    for layer, s in enumerate(scores):
        order = torch.argsort(s, stable=True).tolist()
        removable = order[:max(0, len(order) - min_keep)]
        cand += [(float(s[i]), layer, i) for i in removable]
    cand.sort()
    out: dict = {}
    for _, layer, i in cand[:k]:
        out.setdefault(layer, []).append(i)
    return {k_: sorted(v) for k_, v in out.items()}


# --------------------------------------------------------------------------------- physical removal
def _new_linear(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> nn.Linear:
    lin = linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                 dtype=weight.dtype)  # (H, 0) when every head / unit goes
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin


def prune_heads(model, heads_to_prune: dict) -> dict:
    """Remove heads physically: ``{layer: [head indices in the current layer]}`` (Michel et al. 2019).

    The fused ``qkv`` (H → 3·n·d) loses rows h·d…(h+1)·d of each of its Q, K and V blocks and ``out``
    (n·d → H) the matching input columns; ``config.layer_num_heads`` is updated, and
    ``config.bertforge["pruned_heads"]`` records the removed heads by their *original* indices.
    Returns the updated ``{layer: [original indices]}`` record.
    Raises:
        ConfigError: shared layers, or an index out of range.
    """
    _check_prunable(model)
    cfg = model.config
    meta = dict(cfg.bertforge or {})
    record = {int(k): list(v) for k, v in (meta.get("pruned_heads") or {}).items()}
    counts = head_counts(model)
    for layer, idx in heads_to_prune.items():
        layer = int(layer)
        idx = sorted(set(int(i) for i in idx))
        if not idx:
            continue
        n_layers = len(model.encoder.layers)
        if not 0 <= layer < n_layers:
            raise ConfigError(f"layer {layer} does not exist; the model has layers 0–{n_layers - 1}")
        att = model.encoder.layers[layer].attention
        n, d = att.num_heads, att.head_dim
        if idx[0] < 0 or idx[-1] >= n:
            raise ConfigError(f"layer {layer} has {n} heads; cannot prune head {idx[-1]}")
        keep = [h for h in range(n) if h not in idx]
        inner = n * d
        rows = [blk * inner + h * d + j for blk in range(3) for h in keep for j in range(d)]
        cols = [h * d + j for h in keep for j in range(d)]
        cols_t = torch.tensor(cols, dtype=torch.long, device=att.out.weight.device)
        if hasattr(att, "query"):  # MobileBERT's bottleneck attention: separate Q, K, V projections
            for part in ("query", "key", "value"):
                lin = getattr(att, part)
                setattr(att, part, _new_linear(lin.weight.detach()[cols_t], lin.bias.detach()[cols_t]))
        else:
            rows_t = torch.tensor(rows, dtype=torch.long, device=att.qkv.weight.device)
            qkv_bias = att.qkv.bias.detach()[rows_t] if att.qkv.bias is not None else None  # ModernBERT: none
            att.qkv = _new_linear(att.qkv.weight.detach()[rows_t], qkv_bias)
        att.out = _new_linear(att.out.weight.detach()[:, cols_t],
                              att.out.bias.detach() if att.out.bias is not None else None)
        att.num_heads = len(keep)
        counts[layer] = len(keep)
        # original indices of the heads that remain, to translate current → original
        orig_alive = [h for h in range(cfg.num_attention_heads) if h not in record.get(layer, [])]
        record[layer] = sorted(record.get(layer, []) + [orig_alive[h] for h in idx])
    cfg.layer_num_heads = None if all(c == cfg.num_attention_heads for c in counts) else counts
    meta["pruned_heads"] = {str(k): v for k, v in sorted(record.items()) if v}
    cfg.bertforge = meta
    return record


def prune_ffn(model, neurons_to_prune: dict) -> None:
    """Remove FFN units physically: ``{layer: [unit indices]}``; ``intermediate`` (H → I) loses rows,
    ``output`` (I → H) the matching columns, ``config.layer_intermediate_sizes`` is updated (collapsed to
    ``intermediate_size`` when every layer has the same width).

    Raises:
        ConfigError: shared layers, or an index out of range.
    """
    _check_prunable(model)
    cfg = model.config
    if cfg.model_type == "mobilebert" and cfg.num_feedforward_networks > 1 and any(neurons_to_prune.values()):
        raise ConfigError(f"MobileBERT blocks stack {cfg.num_feedforward_networks} FFNs of one width; pruning "
                          f"FFN units is not supported for them: prune heads only (--ffn-fraction 0)")
    for layer, idx in neurons_to_prune.items():
        idx = set(int(i) for i in idx)
        if not idx:
            continue
        ffn = model.encoder.layers[int(layer)].ffn
        n = _ffn_output(ffn).in_features
        if max(idx) >= n or min(idx) < 0:
            raise ConfigError(f"layer {layer} has {n} FFN units; cannot prune unit {max(idx)}")
        keep = torch.tensor([j for j in range(n) if j not in idx], dtype=torch.long,
                            device=_ffn_output(ffn).weight.device)
        if hasattr(ffn, "wo"):  # GeGLU: unit j is row j of W_a and row I + j of W_g in wi, column j of wo
            ffn.wi = _new_linear(ffn.wi.weight.detach()[torch.cat((keep, keep + n))], None)
            ffn.wo = _new_linear(ffn.wo.weight.detach()[:, keep], None)
            continue
        ffn.intermediate = _new_linear(ffn.intermediate.weight.detach()[keep],
                                       ffn.intermediate.bias.detach()[keep])
        ffn.output = _new_linear(ffn.output.weight.detach()[:, keep], ffn.output.bias.detach())
    sizes = ffn_sizes(model)
    if len(set(sizes)) == 1:
        cfg.intermediate_size, cfg.layer_intermediate_sizes = sizes[0], None
    else:
        cfg.layer_intermediate_sizes = sizes


def reachable_head_fraction(model, fraction: float, min_heads_per_layer: int) -> tuple:
    """``(heads wanted, heads removable)`` for pruning ``fraction`` of all heads while every layer keeps
    ``min_heads_per_layer``.

    Raises:
        ConfigError: when the minimum leaves nothing to remove (it is ≥ the heads of every layer).
    """
    counts = head_counts(model)
    want = round(sum(counts) * fraction)
    removable = sum(max(0, n - min_heads_per_layer) for n in counts)
    if want > 0 and removable == 0:
        raise ConfigError(f"--min-heads-per-layer {min_heads_per_layer} keeps every head (the model has "
                          f"{max(counts)} heads per layer), so --fraction {fraction} removes none; pass a "
                          f"value below {max(counts)}")
    return want, removable


# ------------------------------------------------------------------------------------ iterative loop
def iterative_prune(model, batches_fn: Callable[[], Iterable[dict]], fraction: float, steps: int = 1,
                    ffn_fraction: float = 0.0, loss: str = "auto",
                    eval_fn: Optional[Callable] = None, min_heads_per_layer: int = 0,
                    seed: int = 0, log: Optional[Callable[[dict], None]] = None, **importance_kw) -> list:
    """Prune ``fraction`` of the original heads (and ``ffn_fraction`` of the FFN units) in ``steps``
    equal steps, re-estimating importance on the pruned model before each step (Michel et al. 2019 §4.2
    prune by increasing importance; here re-scored per step), and evaluate after each.

    Args:
        batches_fn: returns a fresh iterable of batches (the importance sample).
        eval_fn: ``eval_fn(model) -> dict`` of metrics (task accuracy, or a label-free fidelity).
    Returns:
        history: one dict per step (step 0 = unpruned) with ``heads_pruned``, ``heads_fraction``,
        ``ffn_pruned``, ``heads_per_layer`` and the metrics.
    Raises:
        ConfigError: fraction outside [0, 1), steps < 1, min_heads_per_layer < 0 or ≥ the heads of
        every layer, an importance loss the model cannot compute, shared layers.
    """
    _check_prunable(model)
    if not 0 <= fraction < 1 or not 0 <= ffn_fraction < 1:
        raise ConfigError(f"--fraction {fraction} / --ffn-fraction {ffn_fraction} must be in [0, 1)")
    if steps < 1:
        raise ConfigError(f"--steps {steps} must be ≥ 1")
    if min_heads_per_layer < 0:
        raise ConfigError(f"--min-heads-per-layer {min_heads_per_layer} must be ≥ 0")
    check_loss(model, loss)
    if fraction > 0:
        reachable_head_fraction(model, fraction, min_heads_per_layer)
    total_h, total_f = sum(head_counts(model)), sum(ffn_sizes(model))
    h0, f0 = total_h, total_f
    history = []

    def record(step, imp=None):
        rec = {"step": step, "heads_pruned": h0 - sum(head_counts(model)),
               "heads_fraction": round((h0 - sum(head_counts(model))) / h0, 4),
               "ffn_pruned": f0 - sum(ffn_sizes(model)), "heads_per_layer": head_counts(model),
               "parameters": sum(p.numel() for p in model.parameters())}
        if imp is not None:
            rec["importance_loss"] = imp["loss"]
        if eval_fn is not None:
            rec.update(eval_fn(model))
        history.append(rec)
        if log:
            log(rec)

    record(0)
    for s in range(1, steps + 1):
        want_h = round(total_h * fraction * s / steps) - (h0 - sum(head_counts(model)))
        want_f = round(total_f * ffn_fraction * s / steps) - (f0 - sum(ffn_sizes(model)))
        if want_h <= 0 and want_f <= 0:
            record(s)
            continue
        imp = compute_importance(model, batches_fn(), loss=loss, ffn=want_f > 0, seed=seed + s,
                                 **importance_kw)
        if want_h > 0:
            prune_heads(model, lowest(imp["heads"], want_h, min_heads_per_layer))
        if want_f > 0:
            prune_ffn(model, lowest(imp["ffn"], want_f))
        record(s, imp)
    return history


# ------------------------------------------------------------------------------- magnitude pruning
MAGNITUDE_MODULES = ("encoder", "all")


def magnitude_targets(model, modules: str = "encoder") -> list:
    """The ``(Linear, "weight")`` pairs :func:`magnitude_prune` ranks: ``encoder`` = the Linear layers of
    the transformer blocks (attention ``qkv``/``out``, FFN ``intermediate``/``output``; a shared ALBERT
    block counted once); ``all`` = every Linear of the model (also embedding projection, pooler, task head).
    """
    if modules not in MAGNITUDE_MODULES:
        raise ConfigError(f"magnitude pruning modules {modules!r}; choose one of {', '.join(MAGNITUDE_MODULES)}")
    root = model.encoder.layers if modules == "encoder" else model
    return [(m, "weight") for m in root.modules() if isinstance(m, nn.Linear) and m.weight.numel() > 0]


def magnitude_prune(model, amount: float, scope: str = "global", modules: str = "encoder") -> dict:
    """Unstructured L1-magnitude pruning of the encoder's Linear weights (Han et al. 2015, "Learning
    both Weights and Connections"), via :func:`torch.nn.utils.prune.global_unstructured` (``scope=global``)
    or ``l1_unstructured`` per layer (``scope=layer``); the masks are then made permanent.

    Which weights are ranked (``modules``, see :func:`magnitude_targets`): by default (``encoder``) only the
    transformer blocks' attention (``qkv``, ``out``) and FFN (``intermediate``, ``output``) weights — the
    usual practice in BERT pruning (e.g. Chen et al. 2020, "The Lottery Ticket Hypothesis for Pre-trained
    BERT Networks", prune the encoder only). The pooler, the embedding projection and the task head are left
    dense: they are small, their weights have a different scale than the encoder's (a fine-tuned
    classifier's weights fall below a global threshold almost entirely, which zeroes the head and leaves
    the model at chance). ``modules="all"`` ranks every Linear of the model instead.

    Returns an honest size report: ``pruned_weights``, ``sparsity`` (of the pruned Linear weights),
    ``dense_bytes`` (unchanged: zeros still take 4 bytes), ``csr_bytes`` (fp32 values + int32 column
    indices + row pointers of the pruned matrices, i.e. what a sparse format would store) and
    ``latency_note``. Raises ConfigError for ``amount`` outside [0, 1) (the CLI's ``--magnitude``).
    """
    import torch.nn.utils.prune as tprune
    if not 0 <= amount < 1:
        raise ConfigError(f"--magnitude {amount} must be in [0, 1) (the fraction of encoder weights to zero)")
    if scope not in ("global", "layer"):
        raise ConfigError(f"--scope {scope!r}; choose global or layer")
    params = magnitude_targets(model, modules)
    if not params:
        raise ConfigError("the model has no encoder Linear weights to prune")
    if scope == "global":
        tprune.global_unstructured(params, pruning_method=tprune.L1Unstructured, amount=amount)
    else:
        for m, n in params:
            tprune.l1_unstructured(m, n, amount=amount)
    for m, n in params:
        tprune.remove(m, n)
    total = sum(m.weight.numel() for m, _ in params)
    zeros = sum(int((m.weight == 0).sum()) for m, _ in params)
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    linear_dense = sum(m.weight.numel() * m.weight.element_size() for m, _ in params)
    csr = sum(int((m.weight != 0).sum()) * (m.weight.element_size() + 4) + (m.weight.shape[0] + 1) * 4
              for m, _ in params)
    return {"method": f"l1_unstructured ({scope})", "amount": amount, "modules": modules,
            "pruned_weights": zeros,
            "linear_weights": total, "sparsity": round(zeros / max(1, total), 4),
            "dense_bytes": dense, "linear_dense_bytes": linear_dense, "linear_csr_bytes": csr,
            "csr_vs_dense": round(csr / max(1, linear_dense), 3),
            "latency_note": "dense kernels: zeros are still multiplied, so latency and the "
                            "model.safetensors size are unchanged"}


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["compute_importance", "prune_heads", "prune_ffn", "iterative_prune", "magnitude_prune",
           "magnitude_targets", "check_loss", "reachable_head_fraction",
           "lowest", "head_counts", "ffn_sizes", "math"]
