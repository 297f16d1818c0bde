"""``bertforge <verb>`` — the command line.

Each verb is a module in :mod:`bertforge.commands` defining ``add_arguments(parser)`` and
``run(args) -> int``; its docstring's first line is the help text. User errors
(:class:`~bertforge.errors.BertforgeError`) print ``bertforge: error: <message>`` on one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from .errors import BertforgeError


def _verbs() -> dict:
    from . import commands
    out = {}
    for m in pkgutil.iter_modules(commands.__path__):
        if not m.name.startswith("_"):
            out[m.name.replace("_", "-")] = f"bertforge.commands.{m.name}"
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse usage errors: one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bertforge", description="Pretrain, fine-tune, distill, prune, quantize and "
                                                   "benchmark BERT-family models.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb, modname in sorted(_verbs().items()):
        mod = importlib.import_module(modname)
        doc = (mod.__doc__ or verb).strip().splitlines()[0]
        p = sub.add_parser(verb, help=doc, description=(mod.__doc__ or "").strip())
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    # KEY=VALUE overrides may sit on either side of options (argparse collects only the first run)
    if rest and isinstance(getattr(args, "overrides", None), list) and all(
            "=" in a and not a.startswith("-") for a in rest):
        args.overrides += rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except BertforgeError as e:
        msg = " ".join(str(e).split())
        sys.stderr.write(f"bertforge: error: {msg}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("bertforge: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
