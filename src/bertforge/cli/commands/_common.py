"""Options and steps shared by the verbs.

Imports nothing heavy at module level (every verb's parser is built from it before torch may load)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

from ...checkpoint.modeldir import resolve  # noqa: F401  a model name → its path (torch-free)
from ...pipelines.outputs import check_cache_dir, check_out_file, check_out_files  # noqa: F401
from ...pipelines.recipe import apply_train_flags, build_recipe, check_flags_agree, check_recipe  # noqa: F401


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


def print_json(obj) -> None:
    """One JSON object on stdout (rank 0 only under torchrun); non-finite floats print as null."""
    from ...io import json_safe
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return
    sys.stdout.write(json.dumps(json_safe(obj), default=float, allow_nan=False) + "\n")
    sys.stdout.flush()
