"""Options and steps shared by the verbs.

Imports nothing heavy at module level (every verb's parser is built from it before torch may load)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...errors import BertforgeError
from ...pipelines.recipe import apply_train_flags, build_recipe, check_flags_agree, check_recipe  # noqa: F401
from ...pipelines.rundir import check_cache_dir, enclosing_output, holds_output  # noqa: F401

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
                   help="onnxruntime INT8: 7-bit weights, the same as --scheme u8s8-7bit (already the default for "
                        "an AVX2 CPU without VNNI, whose u8×s8 kernels saturate with 8-bit weights)")


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
