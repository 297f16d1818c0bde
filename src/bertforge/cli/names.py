"""The names the command line offers (``choices``, help texts), importable without torch.

``bertforge --help``, ``--version`` and argument errors answer before any heavy import (torch, numpy,
transformers load only in the verb that runs), so the verbs' parsers take their choices from here instead
of from the registries. Each tuple copies the keys of one registry, in its order; the registry stays the
one place where a thing is defined and registered, and ``tests/test_package_import.py`` fails when a tuple
and its registry differ. An entry added to a registry from the user's own code (``OBJECTIVES["mlm40"] = …``,
docs/extending.md) is a valid choice too: see :class:`Choices`. This module imports only ``sys``.
"""
import sys

#: keys of :data:`bertforge.tasks.TASKS` (``custom`` is built by :func:`bertforge.tasks.get_task`)
TASK_NAMES = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte", "wnli",
              "conll2003", "ner", "squad", "squad_v2",
              "goemotions", "retrieval")

#: keys of :data:`bertforge.objectives.pretrain.OBJECTIVES` (``pretrain --objective``)
OBJECTIVE_NAMES = ("bert", "roberta", "albert", "electra", "spanbert", "modernbert")

#: keys of :data:`bertforge.objectives.pretrain.SIZES` (``pretrain --size``)
SIZE_NAMES = ("tiny", "small", "base")

#: keys of :data:`bertforge.distillation.distiller.METHODS` (``distill --method``)
DISTILL_METHODS = ("kd", "distilbert", "pkd", "tinybert", "minilm", "mobilebert", "embedding_mse", "margin_mse",
                  "inbatch_kl")

#: ``distill --method`` choices that train no network and so have no loss set in ``METHODS``:
#: ``static`` (:mod:`bertforge.distillation.static`, one embedding table)
DISTILL_TABLE_METHODS = ("static",)

#: the stages every method of :data:`bertforge.distillation.distiller.METHODS` defines (``distill --stage``)
DISTILL_STAGES = ("task", "general")

#: keys of :data:`bertforge.distillation.mapping.STRATEGIES` (``distill --layer-map``)
LAYER_MAPS = ("uniform", "pkd_skip", "pkd_last", "last")

#: :data:`bertforge.runtime.base.BACKENDS` (``bench --backend``)
BACKENDS = ("auto", "torch", "onnxruntime", "transformers")

#: :data:`bertforge.metrics.retrieval.INDEX_KINDS` (``retrieval-eval --index``; ``exact`` is numpy search)
INDEX_KINDS = ("flat", "hnsw", "ivf")

#: :data:`bertforge.compress.int8.TARGETS` (``quantize --target``: the CPU kinds an INT8 graph is made for)
INT8_TARGETS = ("avx2", "vnni", "amx", "arm64")

#: keys of :data:`bertforge.compress.int8.SCHEMES` (``quantize --scheme``)
INT8_SCHEMES = ("u8s8", "u8s8-7bit", "u8u8", "s8s8-static")

#: :data:`bertforge.compress.int8.CALIBRATION_METHODS` (``quantize --calibration``)
CALIBRATION_METHODS = ("minmax", "percentile", "entropy")



class Choices(tuple):
    """Names for an argparse ``choices=``: the light ``names``, plus the keys of the registry ``registry``
    (``"module:attribute"``) when that module is already imported — as it is when user code has added an
    entry to it. Never imports the registry: an unknown name is refused before torch loads."""

    def __new__(cls, names, registry: str):
        self = super().__new__(cls, names)
        self.registry = registry
        return self

    def _loaded(self) -> tuple:
        module, attr = self.registry.split(":")
        table = getattr(sys.modules.get(module), attr, None)
        return tuple(k for k in (table or ()) if not tuple.__contains__(self, k))

    def __contains__(self, value) -> bool:
        return tuple.__contains__(self, value) or value in self._loaded()

    def __iter__(self):
        yield from tuple.__iter__(self)
        yield from self._loaded()


__all__ = ["Choices", "TASK_NAMES", "OBJECTIVE_NAMES", "SIZE_NAMES", "DISTILL_METHODS", "DISTILL_TABLE_METHODS",
           "DISTILL_STAGES", "LAYER_MAPS", "BACKENDS", "INDEX_KINDS"]
