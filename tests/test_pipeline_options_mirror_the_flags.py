"""Each Python API options type names exactly the flags of its verb (``_`` for ``-``) with the flags' defaults,
so that a notebook and the command line mean the same by every option. The verb's positional essentials
(``--model``, ``--out`` … taken as arguments of the function) are the only flags without a field.

Independent truth: the verb's own argparse parser (``bertforge.cli.build_parser``)."""
from __future__ import annotations

import dataclasses

import pytest

from bertforge.cli import build_parser

#: verb command line with only its required flags → (options type, flags passed as the function's arguments)
CASES = {
    ("pretrain", "--out", "o"): ("bertforge.pipelines.pretrain:PretrainOptions", ()),
    ("prune", "--model", "m", "--out", "o"): ("bertforge.pipelines.prune:PruneOptions", ("model", "out")),
    ("translate", "train", "--out", "o"): ("bertforge.pipelines.translate:TranslateTrainOptions", ()),
    ("translate", "decode", "--model", "m", "--input", "i"): ("bertforge.pipelines.translate:TranslateOptions",
                                                              ("model", "input")),
    ("embed", "--model", "m", "--input", "i", "--out", "o"): ("bertforge.pipelines.embed_corpus:EmbedCorpusOptions",
                                                               ("model", "input", "out")),
    ("embed-eval", "--model", "m"): ("bertforge.pipelines.embed_eval:EmbedEvalOptions", ("model",)),
    ("serve-bench", "--model", "m"): ("bertforge.pipelines.serve_bench:ServeBenchOptions", ("model",)),
    ("demo",): ("bertforge.pipelines.demo:DemoOptions", ()),
}
GIVEN = {"out", "model", "input"}  # values the command lines above pass


@pytest.mark.parametrize("argv", list(CASES), ids=[" ".join(a[:2]) for a in CASES])
def test_options_are_the_verbs_flags_with_their_defaults(argv):
    import importlib
    path, positional = CASES[argv]
    mod, name = path.split(":")
    opts = getattr(importlib.import_module(mod), name)
    flags = {k: v for k, v in vars(build_parser().parse_args(list(argv))).items()
             if not k.startswith("_") and k not in ("verb", "translate_cmd")}
    fields = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
              for f in dataclasses.fields(opts)}
    assert set(flags) - set(positional) == set(fields) - set(positional), name
    for key, default in fields.items():
        if key not in GIVEN:
            assert flags[key] == default, (name, key, flags[key], default)
