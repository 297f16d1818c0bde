"""``bertforge <verb>`` — the command line.

Each verb is a module in :mod:`bertforge.cli.commands` defining ``add_arguments(parser)`` and
``run(args) -> int``; its docstring's first line is the help text. The verb is the module's name with ``-`` for
``_`` (``embed_eval.py`` → ``embed-eval``), except where :data:`_RENAMED` says otherwise. User errors
(:class:`~bertforge.errors.BertforgeError`) print ``bertforge: error: <message>`` on one line and exit 2.

Building the parser imports every command module but nothing heavy: a verb imports torch, numpy,
transformers … inside ``run`` (choices come from :mod:`bertforge.cli.names`), so ``--help``, ``--version`` and
argument errors answer at once (``tests/test_package_import.py`` checks ``sys.modules``).
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys

from .. import __version__
from ..errors import BertforgeError


#: command modules whose verb is not their name: users type the verb, so it stays when a module is renamed
_RENAMED = {"bundled_corpus": "embedded-corpus"}


def _verbs() -> dict:
    from . import commands
    out = {}
    for m in pkgutil.iter_modules(commands.__path__):
        if not m.name.startswith("_"):
            out[_RENAMED.get(m.name, m.name.replace("_", "-"))] = f"bertforge.cli.commands.{m.name}"
    return out


class _Parser(argparse.ArgumentParser):
    """Every verb's parser: no abbreviated options (``--thread`` is an error, not ``--threads``: a typo must not
    quietly pick an option), and usage errors in one line, exit 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse usage errors: one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bertforge", description="Pretrain, fine-tune, distill, prune, quantize and "
                                                   "benchmark BERT-family models.")
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb, modname in sorted(_verbs().items()):
        mod = importlib.import_module(modname)
        doc = (mod.__doc__ or verb).strip().splitlines()[0]
        # the module doc is wrapped by hand (its example commands one per line): shown as written
        p = sub.add_parser(verb, help=doc, description=(mod.__doc__ or "").strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


#: a ``section.key=value`` recipe override (as opposed to a path or an option value)
_OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.\w+)+=")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler's stop), raised in the main thread like Ctrl-C so that the same
    clean-up runs: staging and half-written dirs are removed, an earlier run stays as it was."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import signal
    import threading
    previous = None
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        previous = signal.signal(signal.SIGTERM, _on_sigterm)  # restored on return (main() as a library call)
    try:
        return _main(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv) -> int:
    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        # KEY=VALUE overrides may sit anywhere, even after a many-valued option such as --corpus A B
        overrides = [a for a in argv if _OVERRIDE.match(a)]
        args, rest = parser.parse_known_args([a for a in argv if not _OVERRIDE.match(a)])
        if isinstance(getattr(args, "overrides", None), list):
            loose = [a for a in rest if "=" in a and not a.startswith("-")]  # e.g. a malformed key: its
            args.overrides += overrides + loose                             # own error names it
            rest = [a for a in rest if a not in loose]
        else:
            rest = overrides + rest
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if not getattr(args, "_run", None):
            verbs = parser._subparsers._group_actions[0].choices
            raise BertforgeError(f"no verb given; run `bertforge VERB --help` for one of: {', '.join(verbs)}")
        for dest, value in vars(args).items():  # an empty path ("--out ''") would mean the cwd
            if not dest.startswith("_") and isinstance(value, str) and not value.strip():
                raise BertforgeError(f"--{dest.replace('_', '-')} is empty; pass a value")
        return int(args._run(args) or 0)
    except BertforgeError as e:
        if getattr(e, "reason", None):  # the engine's facts, advised in the CLI's flags
            from ..pipelines.resume_policy import word_error
            msg = " ".join(word_error(e).split())
        else:
            msg = " ".join(str(e).split())
        sys.stderr.write(f"bertforge: error: {msg}\n")
        return 2
    except Terminated:
        sys.stderr.write("bertforge: terminated\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write("bertforge: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
