"""When a run folder may be resumed, and how the CLI words the training engine's errors.

``--resume`` continues the latest checkpoint of ``--out``. The engine (:mod:`bertforge.engine.train.checkpoint`)
refuses a checkpoint whose data position would mean something else (another seed, training-set size, batch
size, accumulation or process layout, or other source model files); the CLI adds its policy on top, before
a verb builds its model: the run must be of the same verb, and must keep what the model is and what it
learns from (:data:`_FIXED`), while limits, logging and speed settings (:data:`_RESUMABLE`) may change.

The engine's errors state facts in the library's terms and carry a ``reason``; :func:`word_error` turns
those into the CLI's messages, whose advice names the CLI's flags (``--resume``, ``--out``,
``--batch-size`` …).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..engine.train.checkpoint import check_state, latest_checkpoint, read_state
from ..errors import BertforgeError, CheckpointError, ConfigError

#: recipe values a resumed run may change (limits, logging, speed) without changing what it trains on
_RESUMABLE = ("train.max_steps", "train.epochs", "train.max_minutes", "train.eval_every", "train.save_every",
              "train.keep_checkpoints", "train.log_every", "train.load_best_at_end", "impl.")


#: recipe values a resumed run may not change: what the model is and what it learns from (the data's
#: size, batch and seed are checked against the checkpoint state; the model dirs by fingerprint)
_FIXED = ("model.", "data.task", "data.max_seq_len", "data.text_columns", "data.label_column", "data.labels",
          "data.header", "distill.", "pretrain.")
_FIXED_EXCEPT = ("distill.teachers", "distill.student", "pretrain.max_eval_sequences")


def _saved_recipe(out_dir) -> Optional[dict]:
    """The run's ``recipe.yaml`` as a dict; None when it is missing or unreadable."""
    try:
        import yaml
        old = yaml.safe_load((Path(out_dir) / "recipe.yaml").read_text(encoding="utf-8"))
    except Exception:
        return None
    return old if isinstance(old, dict) else None


def _recipe_changes(old: dict, new: dict, limit: int = 3, fixed: bool = False) -> str:
    """``"key old → new, …"`` for the (at most ``limit``) values that differ between a run's saved recipe
    ``old`` and this run's ``new`` (``fixed``: only the :data:`_FIXED` ones, else all but the
    :data:`_RESUMABLE` ones) among the keys both record; paths are compared resolved; "" when nothing that
    matters differs."""
    def same_path(v):  # "data/x.txt" and "/abs/data/x.txt" name one file: compare them resolved
        if isinstance(v, (list, tuple)):
            return [same_path(x) for x in v]
        return str(Path(v).resolve()) if isinstance(v, str) and v and Path(v).exists() else v

    def flat(d, prefix=""):
        out = {}
        for k, v in (d or {}).items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                out.update(flat(v, key + "."))
            else:
                out[key] = same_path(v)
        return out
    a, b = flat(old), flat(new)
    keep = ((lambda k: k.startswith(_FIXED) and not k.startswith(_FIXED_EXCEPT)) if fixed
            else (lambda k: not k.startswith(_RESUMABLE)))
    # a key only one side records is a setting another bertforge version added or stopped recording
    # (pretrain.max_ngram, model.embedding_size of an E = H family): not a change the user made
    diffs = [f"{k} {a.get(k)!r} → {b.get(k)!r}" for k in sorted(set(a) & set(b))
             if a.get(k) != b.get(k) and keep(k)]
    return ", ".join(diffs[:limit]) + (f" (+{len(diffs) - limit} more)" if len(diffs) > limit else "")


#: the recipe section each training verb adds (a recipe without one is a fine-tuning run's)
_VERB_SECTIONS = {"pretrain": "pretrain", "distill": "distill", "translate": "translate train"}


def _run_verb(sections) -> str:
    return next((verb for sec, verb in _VERB_SECTIONS.items() if sec in sections), "finetune")


def _check_state(path: Path, state: dict, n_examples: int, cfg, sources: Optional[dict] = None, out_dir=None,
                 recipe=None) -> None:
    """CheckpointError unless checkpoint ``path`` (its ``state``) can be continued by this run. With
    ``recipe``, first against ``out_dir/recipe.yaml``: the same verb and the same :data:`_FIXED` values
    (another model, task or sequence length also changes the data size); then the same source model files,
    seed, data size (a mismatch names the recipe values that differ, the likely cause), batch and
    accumulation."""
    old = _saved_recipe(out_dir) if recipe is not None else None
    new = recipe.to_dict() if old is not None else None
    if old is not None:
        if _run_verb(old) != _run_verb(new):
            raise CheckpointError(f"--resume: {out_dir} is a `bertforge {_run_verb(old)}` run, not a `bertforge "
                                  f"{_run_verb(new)}` one; resume it with `bertforge {_run_verb(old)}`, or start "
                                  f"a new --out")
        changed = _recipe_changes(old, new, fixed=True)
        if changed:
            raise CheckpointError(f"--resume: {path} was written by a run with other options ({changed}); resume "
                                  f"with the options the run was started with, or start a new --out")
    expected = {"seed": cfg.seed, "n_examples": n_examples, "batch_size": cfg.batch_size,
                "grad_accum_steps": cfg.grad_accum_steps}
    try:
        check_state(path, state, expected, sources)
    except CheckpointError as e:
        raise CheckpointError(_mismatch_message(e, old, new)) from None


def _mismatch_message(e: CheckpointError, old: Optional[dict] = None, new: Optional[dict] = None) -> str:
    """The CLI's message for the engine's ``source_changed`` / ``state_mismatch`` refusal ``e``; ``old`` and
    ``new`` recipes, when known, name the likely cause of another training-set size."""
    f = e.facts
    path = f["path"]
    if e.reason == "source_changed":
        flag, was, now = f["name"], f["was"], f["now"]
        same = Path(was.get("path", "")) == Path(now.get("path", ""))
        return (f"--resume: {path} was written by a run started from {flag} {was.get('path')}"
                f"{', whose files have changed since' if same else ''}; resume with the {flag} the run started "
                f"from, or start a new --out")
    key, saved, now = f["key"], f["saved"], f["now"]
    if key == "global_micro_batch":
        return (f"--resume: {path} was written by {f.get('world_size')} processes with pre-built batches; resume "
                f"with the same number of processes")
    what = "training examples" if key == "n_examples" else key
    fix = "the same training data" if key == "n_examples" else f"train.{key}={saved}"
    cause = _recipe_changes(old, new) if (key == "n_examples" and old is not None) else ""
    return (f"--resume: {path} was written with {saved} {what} but this run has {now}"
            + (f" (the run was started with other options: {cause})" if cause else "")
            + f"; resume with {fix}, or start a new --out")


def check_batch_fits(batch_size: int, n_examples: int) -> None:
    """ConfigError when one (global micro-)batch is larger than the training set: every row would repeat
    examples. Verbs call it before loading a model; the Trainer checks again."""
    if batch_size > n_examples:
        raise ConfigError(_batch_message(batch_size, n_examples))


def _batch_message(batch_size: int, n_examples: int) -> str:
    return (f"train.batch_size {batch_size} exceeds the {n_examples} training examples; pass --batch-size "
            f"{n_examples} or less, or more data")


def check_resume(out_dir, n_examples: int, train_cfg, sources: Optional[dict] = None, recipe=None) -> None:
    """Validate ``--resume`` before a verb builds its model: the latest checkpoint in ``out_dir`` must have
    been written for the same number of training examples, batch size, accumulation and seed (else the
    data position would point elsewhere) and, for each entry of ``sources`` (flag → :func:`bertforge.io.
    dir_fingerprint`), from a model dir with the same files (else, e.g., a frozen teacher or the tokenizer
    saved with the result would silently change), and ``recipe`` must keep the run's verb, model, task,
    sequence length and distillation/pretraining options (:data:`_FIXED`).

    Raises:
        CheckpointError: a mismatch (the message names the setting to restore) or an unreadable state.
    """
    path = latest_checkpoint(Path(out_dir) / "checkpoints")
    if path is not None:
        _check_state(path, read_state(path), n_examples, train_cfg, sources=sources, out_dir=out_dir,
                     recipe=recipe)


def word_error(e: BertforgeError) -> str:
    """The CLI's message for error ``e``: the engine's errors with a ``reason`` get advice in the CLI's flags;
    every other message is printed as it is."""
    f, reason = getattr(e, "facts", {}), getattr(e, "reason", None)
    if reason in ("state_mismatch", "source_changed"):
        return _mismatch_message(e)
    if reason == "incomplete":
        return (f"checkpoint {f['path']} has no {f['missing']}; resume from another checkpoint or run without "
                f"--resume")
    if reason == "past_end":
        return (f"--resume: {f['path']} is at step {f['step']}, past this run's {f['total']} steps "
                f"(train.max_steps / --max-steps, or train.epochs); pass more steps to train further, or use the "
                f"run as it is")
    if reason == "batch_exceeds_data":
        return _batch_message(f["batch_size"], f["n_examples"])
    if reason == "non_finite_loss":
        return (f"loss became {f['what']} at step {f['step']}; lower train.lr or use impl.dtype=float32 and "
                f"--resume (last good checkpoint: {f['last'] or 'none yet'})")
    if reason == "rank0_write_failed":
        return "rank 0 could not write a checkpoint (see its message); free space or choose a writable --out"
    return str(e)


__all__ = ["check_resume", "check_batch_fits", "word_error"]
