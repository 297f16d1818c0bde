"""A run's recipe from its sources: the recipe file, ``key=value`` overrides and the explicit options of a
training job (highest precedence), then the checks every training job makes (:func:`check_recipe`).

The options object is the verb's parsed flags or a pipeline's options dataclass: both name the options alike
(``epochs``, ``max_steps``, ``batch_size``, ``lr``, ``seed``, ``bf16``, ``max_seq_len``, ``max_train_samples``,
``no_progress``, ``recipe``, ``overrides``).
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from ..errors import ConfigError, require_at_least

if TYPE_CHECKING:
    from ..config import Recipe


def build_recipe(args, extra_sections: tuple = ()) -> Recipe:
    """Recipe file, then ``key=value`` overrides, then explicit CLI flags (highest precedence)."""
    from ..config import load_recipe
    r = load_recipe(getattr(args, "recipe", None), getattr(args, "overrides", None) or [], extra_sections)
    apply_train_flags(r, args)
    return check_recipe(r)


def check_flags_agree(args, section: str, flags: dict) -> None:
    """ConfigError when a verb flag and a ``section.key=value`` override on the same line ask for different
    values (the README's rule; :func:`apply_train_flags` applies it to the train/data flags). ``flags``:
    recipe key → (flag name, value given or None)."""
    from ..config import _coerce, parse_override
    asked = {k.strip(): v.strip() for k, v in map(parse_override, getattr(args, "overrides", None) or [])}
    for key, (flag, value) in flags.items():
        raw = asked.get(f"{section}.{key}")
        if value is None or raw is None:
            continue
        other = _coerce(raw)
        same = other == value or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                  and isinstance(other, (int, float)) and float(other) == float(value))
        if not same:
            raise ConfigError(f"{flag} {value} conflicts with {section}.{key}={raw}; pass one of them")


def apply_train_flags(r: Recipe, args) -> None:
    """The explicit flags of :func:`add_train_args` onto a recipe (they outrank its file and overrides):
    --epochs/--max-steps/--batch-size/--lr/--seed, --max-seq-len/--max-train-samples, --no-progress (or
    ``$BERTFORGE_NO_PROGRESS``) and ``--bf16`` → ``impl.dtype=bfloat16``, a ConfigError when a ``key=value``
    override on the same line asks for another dtype (neither silently wins); likewise ``--lr 1e-4`` with
    ``train.lr=3e-5``, and so on for each flag."""
    from ..config import parse_override
    asked = {k.strip(): v.strip() for k, v in map(parse_override, getattr(args, "overrides", None) or [])}
    for section, keys in (("train", ("epochs", "max_steps", "batch_size", "lr", "seed")),
                          ("data", ("max_seq_len", "max_train_samples"))):
        for k in keys:
            v = getattr(args, k, None)
            if v is None:
                continue
            sec = getattr(r, section)
            if f"{section}.{k}" in asked and getattr(sec, k) != v:  # the override's parsed value
                raise ConfigError(f"--{k.replace('_', '-')} {v:g} conflicts with {section}.{k}="
                                  f"{asked[f'{section}.{k}']}; pass one of them")
            setattr(sec, k, v)
    if getattr(args, "bf16", False):
        if asked.get("impl.dtype", "bfloat16") != "bfloat16":
            raise ConfigError(f"--bf16 conflicts with impl.dtype={asked['impl.dtype']}; pass one of them")
        r.impl.dtype = "bfloat16"
    if getattr(args, "no_progress", False) or os.environ.get("BERTFORGE_NO_PROGRESS"):
        r.impl.progress = False


def check_recipe(r: Recipe) -> Recipe:
    """The checks every training command makes on its final recipe (one-line ConfigError each): dtype (``auto``
    resolved), batch size, gradient accumulation, learning rate, epochs, step and length limits, schedule,
    parallel mode."""
    from ..engine.train.precision import DTYPES, resolve_dtype
    if r.impl.dtype not in DTYPES:
        raise ConfigError(f"impl.dtype={r.impl.dtype!r}; choose one of {', '.join(DTYPES)}")
    r.impl.dtype = resolve_dtype(r.impl.dtype, r.impl.device)  # the saved recipe records what ran
    for k in ("batch_size", "grad_accum_steps"):
        if getattr(r.train, k) < 1:
            raise ConfigError(f"train.{k} must be ≥ 1 (got {getattr(r.train, k)})")
    if not 0 < r.train.lr < math.inf:  # also refuses nan
        raise ConfigError(f"train.lr must be a finite number > 0 (got {r.train.lr})")
    if r.train.epochs is not None and not 0 < r.train.epochs < math.inf:
        raise ConfigError(f"--epochs / train.epochs must be a finite number > 0 (got {r.train.epochs})")
    for flag, value, minimum, note in (
            ("--max-steps / train.max_steps", r.train.max_steps, 1, "omit it to train for --epochs"),
            ("--max-seq-len / data.max_seq_len", r.data.max_seq_len, 2, ""),
            ("--max-train-samples / data.max_train_samples", r.data.max_train_samples, 1, ""),
            ("data.max_eval_samples", r.data.max_eval_samples, 1, ""),
            ("train.log_every", r.train.log_every, 1, "steps between loss log lines"),
            ("train.eval_every", r.train.eval_every, 1, "omit it to evaluate once per epoch"),
            ("train.save_every", r.train.save_every, 1, "omit it to save once per epoch"),
            ("train.keep_checkpoints", r.train.keep_checkpoints, 1, ""),
            ("train.warmup_steps", r.train.warmup_steps, 0, ""),
            ("impl.threads", r.impl.threads, 1, "omit it to use every core"),
            ("impl.num_workers", r.impl.num_workers, 0, "")):
        require_at_least(flag, value, minimum, note)
    from ..errors import require_number
    require_number("train.warmup_ratio", r.train.warmup_ratio, 0, 1)
    from ..engine.train.distributed import PARALLEL
    from ..engine.train.optim import lr_lambda
    lr_lambda(r.train.schedule, 1, 2)  # raises ConfigError naming the valid schedules
    if getattr(r.impl, "parallel", "ddp") not in PARALLEL:
        raise ConfigError(f"impl.parallel={r.impl.parallel!r}; choose one of {', '.join(PARALLEL)}")
    return r


__all__ = ["build_recipe", "check_flags_agree", "apply_train_flags", "check_recipe"]
