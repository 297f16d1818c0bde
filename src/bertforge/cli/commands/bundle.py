"""Bundle models into one torch-free folder (standard ONNX, answers inside the graph), or verify a bundle.

Writes OUT/manifest.json and OUT/NAME/{model.onnx, tokenizer.json}: pooling, Matryoshka truncation, L2
normalisation, softmax / sigmoid, saved thresholds and NER tags run inside the graph; golden inputs and their
outputs in the manifest. Run it with bertforge_lite (lite/) or in a browser (web/); see docs/bundle.md.

Examples:
  bertforge bundle --model runs/student-int8 --out runs/student-bundle
  bertforge bundle --model emb=runs/student-int8 --model sst2=runs/sst2 --out runs/bundle --fused
  bertforge bundle verify runs/student-bundle
"""
from __future__ import annotations

from ._common import print_json


def add_arguments(p) -> None:
    p.add_argument("action", nargs="*", metavar="verify B",
                   help="`verify B`: re-check bundle B (file hashes, golden inputs) instead of writing one")
    p.add_argument("--model", action="append", default=[], metavar="[NAME=]DIR",
                   help="a model dir to bundle (repeat; NAME defaults to the dir's name)")
    p.add_argument("--out", help="the bundle folder to write")
    p.add_argument("--fused", action="store_true",
                   help="also keep the fused x86 graph (ONNX Runtime contrib ops) as NAME/model.fused.onnx")
    p.add_argument("--threads", type=int, default=1, help="verify: ONNX Runtime threads (default 1)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def run(args) -> int:
    from ...errors import ConfigError
    if args.action:
        if args.action[0] != "verify" or len(args.action) != 2:
            raise ConfigError(f"unexpected {' '.join(args.action)!r}; write `bertforge bundle verify B` or "
                              f"`bertforge bundle --model DIR --out B`")
        if args.model or args.out:
            raise ConfigError("`bundle verify B` checks a bundle; drop --model / --out")
        from ...pipelines.bundle import verify
        print_json({"bundle": args.action[1], "ok": True, "max_abs_diff": verify(args.action[1], args.threads)})
        return 0
    if not args.model or not args.out:
        raise ConfigError("bundle needs --model DIR and --out B (or `bundle verify B`)")
    from ...pipelines.bundle import bundle_with
    res = bundle_with(args.model, args.out, fused=args.fused, overwrite=args.overwrite)
    print_json({"out": str(res.out), "models": {n: {k: e[k] for k in ("kind", "precision", "dim", "max_length",
                                                                       "parity", "outputs")}
                                                 for n, e in res.manifest["models"].items()}})
    return 0
