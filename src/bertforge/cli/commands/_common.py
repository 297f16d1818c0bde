"""Options and steps shared by the verbs.

Imports nothing heavy at module level (every verb's parser is built from it before torch may load)."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...errors import BertforgeError, ConfigError, require_at_least
from ...pipelines.rundir import enclosing_output, holds_output

if TYPE_CHECKING:
    from ...config import Recipe


def resolve_model_dir(name: str) -> Path:
    """:func:`bertforge.checkpoint.read.resolve_model_dir` (``minilm``, a hub name or a checkpoint path → a
    dir), imported on first use so that the verbs' parsers load without torch."""
    from ...checkpoint.read import resolve_model_dir as resolve
    return resolve(name)


def add_recipe_args(p: argparse.ArgumentParser, default_recipe: Optional[str] = None) -> None:
    p.add_argument("--recipe", default=default_recipe,
                   help="YAML recipe (model/data/train/impl sections); a run's RUN/recipe.yaml alone re-runs it "
                        "(its inputs are recorded there and checked to be unchanged)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="recipe overrides with dotted keys, e.g. train.lr=3e-5 impl.dtype=bfloat16")


def add_int8_weight_args(p: argparse.ArgumentParser) -> None:
    """How INT8 weights are quantized (``quantize``, ``export --int8``)."""
    p.add_argument("--per-tensor", action="store_true",
                   help="one INT8 weight scale per matrix (default: per output channel)")
    p.add_argument("--reduce-range", action="store_true",
                   help="onnxruntime INT8: 7-bit weights; try it when INT8 accuracy drops on an x86 CPU "
                        "without VNNI, whose u8×s8 kernels can saturate with 8-bit weights")


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=float)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (impl.dtype=bfloat16)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out (the old one is kept until the new run finishes)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_recipe(args, extra_sections: tuple = ()) -> Recipe:
    """Recipe file, then ``key=value`` overrides, then explicit CLI flags (highest precedence)."""
    from ...config import load_recipe
    r = load_recipe(getattr(args, "recipe", None), getattr(args, "overrides", None) or [], extra_sections)
    apply_train_flags(r, args)
    return check_recipe(r)


def check_flags_agree(args, section: str, flags: dict) -> None:
    """ConfigError when a verb flag and a ``section.key=value`` override on the same line ask for different
    values (the README's rule; :func:`apply_train_flags` applies it to the train/data flags). ``flags``:
    recipe key → (flag name, value given or None)."""
    from ...config import _coerce, parse_override
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
    from ...config import parse_override
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
    from ...engine.train.precision import DTYPES, resolve_dtype
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
    from ...errors import require_number
    require_number("train.warmup_ratio", r.train.warmup_ratio, 0, 1)
    from ...engine.train.distributed import PARALLEL
    from ...engine.train.optim import lr_lambda
    lr_lambda(r.train.schedule, 1, 2)  # raises ConfigError naming the valid schedules
    if getattr(r.impl, "parallel", "ddp") not in PARALLEL:
        raise ConfigError(f"impl.parallel={r.impl.parallel!r}; choose one of {', '.join(PARALLEL)}")
    return r


def check_cache_dir(cache: Path, out: Path, inputs: tuple = (), *, reuse_hint: str, kind: str = "a cache",
                    is_cache=None, inside_out: bool = False) -> None:
    """Refuse a ``--cache-dir`` before anything is written when it is a file; is, contains or lies inside an
    input model dir or ``--out`` (with ``inside_out`` a dir below ``--out`` is fine, e.g. distill's default
    ``<out>/teacher_cache``); holds files that ``is_cache(dir)`` rejects; or is / lies inside another run,
    model, checkpoint or export dir, unless ``is_cache`` accepts it filled (an earlier distill run's
    ``teacher_cache`` may be reused). Cache files would otherwise land where bertforge promises not to write.

    Raises:
        ConfigError: one line naming the overlap and the fix (``reuse_hint``: what else may be passed).
    """
    if cache.exists() and not cache.is_dir():
        raise ConfigError(f"--cache-dir {cache} is a file; pass a directory (new, or {reuse_hint})")
    res, out_res = cache.resolve(), Path(out).resolve()
    for what, d in [("the input", Path(i).resolve()) for i in inputs] + [("--out", out_res)]:
        below_out = inside_out and d == out_res
        if d == res or res in d.parents or (d in res.parents and not below_out):
            raise ConfigError(f"--cache-dir {cache} overlaps {what} {d}; choose a directory outside it")
    if is_cache is not None and not is_cache(cache):
        raise ConfigError(f"--cache-dir {cache} holds files that are not {kind}; pass a new or empty directory, "
                          f"or {reuse_hint}")
    parent = res if (cache.is_dir() and holds_output(res)) else enclosing_output(res)
    reused = is_cache is not None and cache.is_dir() and any(cache.iterdir())
    if parent is not None and not (inside_out and parent == out_res) and not reused:
        raise ConfigError(f"--cache-dir {cache} lies inside {parent}, which holds a bertforge run or model; "
                          f"choose a directory outside it")


def check_out_file(out: Path, protected=(), inputs=(), overwrite: bool = False, flag: str = "--out",
                   example: str = "preds.jsonl") -> Path:
    """Refuse an output *file* path that is a directory, lies inside one of the ``protected`` dirs (the
    verb's input models) or inside any run, model, checkpoint or export dir, is one of the ``inputs`` files,
    or exists without ``overwrite``: a verb's output never replaces a checkpoint's, a run's or its input's
    files.

    Raises:
        BertforgeError: one line naming ``flag``, the path and the fix.
    """
    out = Path(out)
    if out.is_dir():
        res = out.resolve()
        taken = (any(Path(d).resolve() == res for d in protected) or holds_output(res)
                 or enclosing_output(res) is not None)  # a file there would be refused too
        hint = f"a file path outside it, such as {example}" if taken else f"a file path such as {out}/{example}"
        raise BertforgeError(f"{flag} {out} is a directory; pass {hint}")
    target = out.resolve()
    for d in protected:
        if Path(d).resolve() in target.parents:
            raise BertforgeError(f"{flag} {out} lies inside the model directory {d}; write elsewhere")
    parent = enclosing_output(target)
    if parent is not None:
        raise BertforgeError(f"{flag} {out} lies inside {parent}, which holds a bertforge run or model; "
                             f"write outside it")
    for i in inputs:
        if i and Path(i).exists() and Path(i).resolve() == target:
            raise BertforgeError(f"{flag} {out} is the input file; choose another {flag}")
    if out.exists() and not overwrite:
        raise BertforgeError(f"{flag} {out} exists; pass --overwrite to replace it, or another {flag}")
    return out


def check_out_files(out_dir: Path, names: tuple, overwrite: bool, inputs: tuple = (), flag: str = "--out") -> Path:
    """:func:`check_out_file` for each of the files ``names`` a verb writes into the folder ``out_dir``
    (``qa-split``, ``embedded-corpus``), after refusing an ``out_dir`` that is a file."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BertforgeError(f"{flag} {out_dir} is a file; pass a folder (new or empty)")
    for n in names:
        check_out_file(out_dir / n, inputs=inputs, overwrite=overwrite, flag=flag)
    return out_dir


def print_json(obj) -> None:
    """One JSON object on stdout (rank 0 only under torchrun); non-finite floats print as null."""
    from ...io import json_safe
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return
    sys.stdout.write(json.dumps(json_safe(obj), default=float, allow_nan=False) + "\n")
    sys.stdout.flush()
