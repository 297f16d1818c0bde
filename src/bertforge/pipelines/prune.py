"""Pruning from Python: :func:`prune` (what ``bertforge prune`` runs) — attention heads and FFN neurons removed
physically by importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", §4: head importance
I_h = E|∂L/∂ξ_h|), or the smallest encoder weights zeroed (unstructured L1 magnitude pruning); into a model
folder written whole (:class:`~bertforge.pipelines.rundir.RunDir`).

Head importance is estimated on ``data``: a task file (the model's own task loss when it has labels) or plain
text, one example per line (label-free Fisher loss: the model's own sampled predictions; or ``loss="mlm"`` for a
masked-LM model). Heads go in ``steps`` rounds up to ``fraction`` of all heads, re-scored after each round; the
task metric on ``eval`` (or, without labels, the KL / hidden-state drift from the unpruned model) is tracked per
round in ``prune_history.csv`` / ``.png``.

    >>> import bertforge
    >>> r = bertforge.prune("runs/sst2", "runs/sst2-p30", data="dev.tsv", eval="dev.tsv", fraction=0.3, steps=3)
    >>> r.out, r.record["heads_per_layer"], r.record["history"][-1]
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, DataError, require_at_least
from ..checkpoint.layout import carry_declarations
from ..io import json_safe
from .rundir import RunDir


@dataclass
class PruneOptions:
    """Options of :func:`prune` — the flags of ``bertforge prune`` with ``_`` for ``-``, same defaults (None:
    ``steps`` 1, ``loss`` ``"auto"`` (task / fisher / mlm), ``importance_norm`` ``"layer"`` (or ``"none"``),
    ``min_heads_per_layer`` 0, ``max_samples`` 512, ``max_seq_len`` the model's fine-tuning length).
    ``fraction`` / ``ffn_fraction``: shares (0–1) of all heads / FFN units to remove; ``magnitude``: the share
    of encoder weights to zero instead."""

    data: Optional[str] = None
    task: Optional[str] = None
    eval: Optional[str] = None
    fraction: float = 0.0
    ffn_fraction: float = 0.0
    steps: Optional[int] = None
    loss: Optional[str] = None
    importance_norm: Optional[str] = None
    min_heads_per_layer: Optional[int] = None
    max_samples: Optional[int] = None
    max_eval_samples: Optional[int] = None
    max_seq_len: Optional[int] = None
    batch_size: int = 32
    magnitude: Optional[float] = None
    seed: int = 0
    overwrite: bool = False


@dataclass
class PruneResult:
    """The pruned model dir ``out`` and its record (``prune.json``): ``parameters``, ``file_mb``; head pruning:
    ``heads_per_layer``, ``ffn_per_layer``, ``metric`` and ``history`` (one row per round); magnitude:
    ``magnitude`` and, with ``eval``, the metric before and after."""

    out: Path
    record: dict


def prune(model, out, **options) -> PruneResult:
    """Prune ``model`` (a checkpoint dir or ``"minilm"``) into ``out``; ``options``: the fields of
    :class:`PruneOptions`.

    Raises:
        ConfigError: an out-of-range share, importance options with ``magnitude``, nothing to prune, head
            pruning without ``data``; DataError: unreadable ``data`` / ``eval`` (all before ``out`` is written)."""
    unknown = sorted(set(options) - {f.name for f in fields(PruneOptions)})
    if unknown:
        raise ConfigError(f"prune() got unknown option(s) {', '.join(unknown)}; see PruneOptions")
    opts = PruneOptions(**options)
    for key in ("data", "eval"):
        if getattr(opts, key) is not None:
            setattr(opts, key, str(getattr(opts, key)))
    return prune_with(model, out, opts)


def prune_with(model, out, opts: PruneOptions) -> PruneResult:
    """:func:`prune` from a complete :class:`PruneOptions` (what the verb builds from its flags)."""
    rec = _run(str(model), out, opts)
    return PruneResult(Path(rec["out"]), rec)


def check_args(args) -> None:
    """Reject option values that would crash, hang or silently do nothing — before the model is loaded.

    Raises:
        ConfigError: naming the flag and its valid range; an importance option given with ``--magnitude``.
    """
    importance = {"--data": args.data, "--steps": args.steps, "--loss": args.loss,
                  "--importance-norm": args.importance_norm, "--min-heads-per-layer": args.min_heads_per_layer,
                  "--max-samples": args.max_samples}
    given = [flag for flag, v in importance.items() if v is not None]
    if args.magnitude is not None and given:
        raise ConfigError(f"{given[0]} belongs to head/FFN importance pruning; --magnitude zeroes the smallest "
                          f"weights and scores nothing, so drop {given[0]}")
    for key, default in (("steps", 1), ("loss", "auto"), ("importance_norm", "layer"),
                         ("min_heads_per_layer", 0), ("max_samples", 512)):
        if getattr(args, key) is None:
            setattr(args, key, default)
    for flag, value, minimum, note in (
            ("--batch-size", args.batch_size, 1, ""),
            ("--max-samples", args.max_samples, 1, "examples used to score importance"),
            ("--max-eval-samples", args.max_eval_samples, 1, "or leave it out for all"),
            ("--steps", args.steps, 1, ""),
            ("--min-heads-per-layer", args.min_heads_per_layer, 0, ""),
            ("--max-seq-len", args.max_seq_len, 2, "[CLS] and [SEP] take two tokens")):
        require_at_least(flag, value, minimum, note)
    if args.importance_norm not in ("layer", "none"):  # the CLI's choices; a Python caller's typo
        raise ConfigError(f"--importance-norm {args.importance_norm!r}: choose layer or none")
    for flag, v in (("--fraction", args.fraction), ("--ffn-fraction", args.ffn_fraction)):
        if not 0 <= v < 1:
            raise ConfigError(f"{flag} {v} must be in [0, 1) (the fraction of all "
                              f"{'heads' if flag == '--fraction' else 'FFN units'} to remove)")
    if args.magnitude is not None:
        if not 0 < args.magnitude < 1:
            raise ConfigError(f"--magnitude {args.magnitude} must be in (0, 1) (the fraction of encoder "
                              "weights to zero)")
        if args.fraction > 0 or args.ffn_fraction > 0:
            raise ConfigError("--magnitude (unstructured weight pruning) cannot be combined with --fraction / "
                              "--ffn-fraction (head/FFN pruning); run two prune commands, one after the other")
    elif args.fraction <= 0 and args.ffn_fraction <= 0:
        raise ConfigError(f"nothing to prune with --fraction {args.fraction:g} and --ffn-fraction "
                          f"{args.ffn_fraction:g}; give a share above 0 of heads (--fraction), FFN neurons "
                          f"(--ffn-fraction) or weights (--magnitude)")


def resolve_seq_len(max_seq_len, cfg: dict) -> int:
    """The sequence length to use: ``--max-seq-len`` when given (it must fit the model's position table;
    RoBERTa: 2 positions fewer), else the length the model was fine-tuned with (as ``evaluate`` and
    ``quantize --eval`` use), else 128 (or the model's positions, if fewer).

    Raises:
        ConfigError: ``--max-seq-len`` beyond the model's positions.
    """
    from ..checkpoint.read import check_seq_len, token_positions
    if max_seq_len is None:
        from ..checkpoint.modeldir import Meta
        trained = Meta.from_config(cfg).max_seq_len
        return min(trained if trained and trained >= 2 else 128, token_positions(cfg))
    check_seq_len(max_seq_len, cfg)
    return max_seq_len


def _task_eval_fn(args, task, adapter):
    """``(eval_fn, metric)``: the task metric of ``model`` on ``--eval`` (structured and magnitude modes)."""
    if adapter is None:
        raise ConfigError("--eval needs a task; pass --task NAME (or prune a fine-tuned model)")
    eval_ds = adapter.load(args.eval, args.max_eval_samples)
    metric = task.metrics[0]

    def eval_fn(m):
        return {metric: round(adapter.evaluate(m, eval_ds, 64)[metric], 6)}
    return eval_fn, metric


def _task_and_adapter(model_dir, cfg, task_name, max_seq_len, tok):
    from ..tasks import adapter_for, model_task
    from ..checkpoint.modeldir import Meta
    meta = Meta.from_config(cfg)
    name = task_name or meta.task
    if not name:
        return None, None
    task = model_task(name, meta, model_dir)
    adapter = adapter_for(task, tok, max_seq_len or meta.max_seq_len or 128)
    if hasattr(adapter, "use_model_labels"):  # a tagger's tag set, as it was fine-tuned
        from ..checkpoint.modeldir import ModelDir
        adapter.use_model_labels(ModelDir.open(model_dir))
    return task, adapter


def read_text_examples(path, tok, max_seq_len: int, max_samples=None) -> list:
    """Plain text, one example per non-empty line → encoded dicts (``input_ids``, ``token_type_ids``)."""
    from ..tokenizer import encode_texts
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--data {path} does not exist; pass a text or task file")
    lines = []
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                lines.append(line.strip())
                if max_samples and len(lines) >= max_samples:
                    break
    if not lines:
        raise DataError(f"--data {path} has no non-empty lines")
    return [{"input_ids": e.ids, "token_type_ids": e.type_ids}
            for e in encode_texts(tok, lines, None, max_seq_len)]


def _task_data(args, task, adapter):
    """``--data`` read as the task's own file (labels kept where present: the task loss then scores
    importance), or None for plain text. A ``.txt`` file is the task's format only for token
    classification (CoNLL); elsewhere it is plain text, one example per line. QA reads the answers when
    every question has one."""
    import sys
    if adapter is None or (str(args.data).endswith(".txt") and task.kind != "token_classification"):
        return None
    if task.kind == "qa":
        try:
            return adapter.load(args.data, args.max_samples, require_labels=True)
        except DataError:
            pass  # unanswered questions (or none): score them label-free
    try:
        return adapter.load(args.data, args.max_samples, require_labels=False)
    except DataError as e:
        if not str(args.data).endswith(".txt"):
            raise
        sys.stderr.write(f"bertforge prune: note: {args.data} is not a {task.name} file ({e}); reading it as "
                         f"plain text, one example per line, scored label-free\n")
        return None


def _batches(data, collate, batch_size):
    def gen():
        for s in range(0, len(data), batch_size):
            yield collate(data[s:s + batch_size])
    return gen


def fidelity_fn(model, data, collate, batch_size):
    """Label-free tracking, returned as ``(fn, metric)`` with ``fn(pruned) -> {metric: value}`` (0 =
    unchanged): ``kl_to_unpruned``, the mean KL(p_unpruned ‖ p_pruned) of a classifier's classes, of a
    tagger's tags per real token, or of extractive QA's start and end positions (padding excluded);
    ``mse_to_unpruned``, the mean squared change of a regression head's predictions; ``hidden_drift``,
    the relative squared drift ‖h − h₀‖² / ‖h₀‖² of a head-less encoder's last hidden state."""
    import torch
    from ..compress.prune import LABEL_KEYS, is_qa
    batches = [collate(data[s:s + batch_size]) for s in range(0, len(data), batch_size)]
    qa = is_qa(model)

    def outputs(m):
        m.eval()
        res = []
        with torch.no_grad():
            for b in batches:
                o = m(**{k: v for k, v in b.items() if k not in LABEL_KEYS})
                z = (o.logits if o.logits is not None else o.last_hidden_state).float()
                if qa:  # (B, 2, T): a distribution over the real positions
                    z = z.masked_fill(~b["attention_mask"].bool()[:, None, :], float("-inf"))
                res.append(z)
        return res

    ref = outputs(model)
    if model.head is None:
        metric = "hidden_drift"
    else:
        metric = "mse_to_unpruned" if ref[0].shape[-1] == 1 and not qa else "kl_to_unpruned"

    def fn(m):
        cur = outputs(m)
        if metric == "kl_to_unpruned":
            kls = []
            for r, c, b in zip(ref, cur, batches):
                lr, lc = torch.log_softmax(r, -1), torch.log_softmax(c, -1)
                kl = torch.sum(lr.exp() * torch.nan_to_num(lr - lc, nan=0.0, posinf=0.0, neginf=0.0), -1)
                if kl.dim() == 2 and not qa:  # tagger: real tokens only
                    kl = kl[b["attention_mask"].bool()]
                kls.append(kl.flatten())
            return {metric: _sig(max(0.0, float(torch.cat(kls).mean())))}  # KL ≥ 0 (float noise)
        if metric == "mse_to_unpruned":
            n = sum(r.numel() for r in ref)
            return {metric: _sig(sum(float(((c - r) ** 2).sum()) for r, c in zip(ref, cur)) / n)}
        num = sum(float(((c - r) ** 2).sum()) for r, c in zip(ref, cur))
        den = sum(float((r ** 2).sum()) for r in ref)
        return {metric: _sig(num / max(den, 1e-12))}
    return fn, metric


def _sig(x: float) -> float:
    """6 significant digits (a small drift must not round to 0)."""
    return float(f"{x:.6g}")


def write_history(out: Path, history: list, metric: str) -> None:
    from ..io import atomic_write_text
    cols = ["step", "heads_pruned", "heads_fraction", "ffn_pruned", "parameters", metric, "heads_per_layer"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(cols)
    for r in json_safe(history):  # an undefined metric (NaN) is an empty cell
        w.writerow([r.get(c) if c != "heads_per_layer" else " ".join(map(str, r[c])) for c in cols])
    atomic_write_text(out / "prune_history.csv", buf.getvalue())
    plot_curve(out / "prune_history.png", [r["heads_pruned"] for r in history],
               [r.get(metric) for r in history], metric)


def plot_curve(path: Path, x, y, metric: str, title: str = "head pruning (Michel et al. 2019)") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(x, y, marker="o")
    ax.set_xlabel("heads pruned")
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def _run(model_name: str, out, args) -> dict:
    import torch
    from ..checkpoint.modeldir import ModelDir
    from ..checkpoint.read import load_pretrained
    from ..compress import prune as P
    from ..io import atomic_write_text
    check_args(args)
    md = ModelDir.open(model_name)
    model_dir, cfg = md.path, md.config
    run_dir = RunDir(out, inputs=(model_dir,), overwrite=args.overwrite)
    args.max_seq_len = resolve_seq_len(args.max_seq_len, cfg)
    tok = md.tokenizer()
    model = load_pretrained(model_dir).eval()
    from ..engine.kernels import apply_kernels
    apply_kernels(model, "auto")  # speed only (bertforge.engine.kernels)
    if args.magnitude is None and not args.data:
        raise ConfigError("head/FFN pruning needs --data (a task file or plain text) to score importance")
    torch.manual_seed(args.seed)
    result: dict = {"model": str(model_dir), "out": str(run_dir.out)}
    history = []
    if args.magnitude is not None:
        _magnitude(args, model, model_dir, cfg, tok, result)
    else:
        history = _structured(args, model, model_dir, cfg, tok, result)
    result["parameters"] = P.count_parameters(model)
    with run_dir as tmp:
        model.save_pretrained(tmp, tokenizer_dir=model_dir)
        carry_declarations(model_dir, tmp)  # pooling, length, truncate_dim, prompts: what the dir declares
        if history:
            write_history(tmp, history, result["metric"])
        result["file_mb"] = round((tmp / "model.safetensors").stat().st_size / 2**20, 3)
        atomic_write_text(tmp / "prune.json", json.dumps(json_safe(result), indent=2, default=float,
                                                          allow_nan=False))
    return result


def _magnitude(args, model, model_dir, cfg, tok, result: dict) -> None:
    """Unstructured magnitude pruning of ``model`` in place; the metric on ``--eval`` before and after."""
    from ..compress import prune as P
    eval_fn = metric = None
    if args.eval:
        task, adapter = _task_and_adapter(model_dir, cfg, args.task, args.max_seq_len, tok)
        eval_fn, metric = _task_eval_fn(args, task, adapter)
    before = eval_fn(model) if eval_fn else None
    result["magnitude"] = P.magnitude_prune(model, args.magnitude)
    if eval_fn:
        after = eval_fn(model)
        result.update(metric=metric, eval={"unpruned": before[metric], "pruned": after[metric],
                                           "data": str(args.eval)})


def _structured(args, model, model_dir, cfg, tok, result: dict) -> list:
    """Head / FFN pruning of ``model`` in place by importance, in ``--steps`` rounds; the rounds' history."""
    import sys

    from ..compress import prune as P
    from ..data.collate import PadCollator
    from ..tokenizer import pad_id, special_tokens
    P.check_loss(model, args.loss)
    if args.fraction > 0:
        want, removable = P.reachable_head_fraction(model, args.fraction, args.min_heads_per_layer)
        if want == 0:
            total = sum(P.head_counts(model))
            raise ConfigError(f"--fraction {args.fraction:g} of the model's {total} heads rounds to 0 heads; "
                              f"pass {1 / total:.3g} or more to remove one")
        if want > removable:
            total = sum(P.head_counts(model))
            sys.stderr.write(f"bertforge prune: warning: --min-heads-per-layer {args.min_heads_per_layer} "
                             f"lets only {removable} of {total} heads go ({removable / total:.0%}), "
                             f"not the {want} (--fraction {args.fraction}) asked for\n")
    task, adapter = _task_and_adapter(model_dir, cfg, args.task, args.max_seq_len, tok)
    data = _task_data(args, task, adapter)
    if data is not None:
        collate = adapter.collator()
    else:
        data = read_text_examples(args.data, tok, args.max_seq_len, args.max_samples)
        collate = PadCollator(pad_id(tok))
    sp = special_tokens(tok)
    mask_id = tok.token_to_id(sp["mask"]) if "mask" in sp else None
    specials = [tok.token_to_id(sp[r]) for r in ("cls", "sep", "pad") if r in sp]
    if args.eval:
        eval_fn, metric = _task_eval_fn(args, task, adapter)
    else:
        n_ev = min(len(data), 256)
        eval_fn, metric = fidelity_fn(model, data[:n_ev], collate, args.batch_size)

    def log(rec):
        sys.stderr.write("bertforge prune: " + json.dumps(json_safe({k: rec[k] for k in rec
                                                                    if k != "heads_per_layer"})) + "\n")
    history = P.iterative_prune(model, _batches(data, collate, args.batch_size), args.fraction,
                                args.steps, args.ffn_fraction, args.loss, eval_fn,
                                args.min_heads_per_layer, args.seed, log=log,
                                mask_token_id=mask_id, special_ids=specials,
                                normalize=args.importance_norm == "layer")
    model.config.bertforge = {**model.config.bertforge, "pruning": {
        "method": "head importance |dL/dxi| (Michel et al. 2019)"
                  + (", per-layer L2-normalised" if args.importance_norm == "layer" else ", raw"),
        "fraction": args.fraction, "ffn_fraction": args.ffn_fraction, "steps": args.steps,
        "loss": history[-1].get("importance_loss", args.loss), "data": str(args.data)}}
    result.update(heads_per_layer=P.head_counts(model), ffn_per_layer=P.ffn_sizes(model),
                  metric=metric, history=[{k: v for k, v in r.items() if k != "heads_per_layer"}
                                          for r in history])
    return history


__all__ = ["PruneOptions", "PruneResult", "prune", "prune_with", "read_text_examples", "fidelity_fn", "plot_curve",
           "check_args", "resolve_seq_len"]
