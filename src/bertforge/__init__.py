"""bertforge: one PyTorch library and CLI for the BERT family.

Pretrain (BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT), fine-tune, distill (KD, DistilBERT, PKD, TinyBERT,
MiniLM), prune, quantize and benchmark — on one encoder core, one Trainer and Hugging Face checkpoint
directories in and out.
"""
from types import ModuleType as _ModuleType

__version__ = "0.1.0"

#: public names → the module that defines them, imported on first use (PEP 562), so that `import bertforge`
#: (and the CLI's start-up, where Ctrl-C must already be handled) does not load torch up front
_LAZY = {"ModelConfig": ".config", "BertforgeError": ".errors", "load_pretrained": ".checkpoint.read",
         "save_pretrained": ".checkpoint.write", "Encoder": ".models.encoder", "TaskModel": ".task_model",
         "Features": ".models.output",
         # the Python API (pipelines/, docs/python.md)
         "quantize": ".pipelines.quantize", "export": ".pipelines.export", "evaluate": ".pipelines.evaluate",
         "embed": ".pipelines.embed", "finetune": ".pipelines.finetune", "pretrain": ".pipelines.pretrain",
         "prune": ".pipelines.prune", "translate": ".pipelines.translate",
         "translate_train": ".pipelines.translate", "embed_corpus": ".pipelines.embed_corpus",
         "embed_eval": ".pipelines.embed_eval", "serve_bench": ".pipelines.serve_bench",
         "predict": ".pipelines.predict", "retrieval_eval": ".pipelines.retrieval_eval", "bench": ".pipelines.bench",
         "ModelDir": ".checkpoint.modeldir",
         "bundle": ".pipelines.bundle", "bundle_verify": ".pipelines.bundle",
         # the HTTP server in a background thread (serve/background.py): the package bertforge.serve is callable
         "serve": ".serve"}

__all__ = ["ModelConfig", "BertforgeError", "Encoder", "Features", "TaskModel", "load_pretrained",
           "save_pretrained", "finetune", "distill", "quantize", "export", "evaluate", "embed", "pretrain", "prune",
           "translate", "translate_train", "embed_corpus", "embed_eval", "serve_bench", "serve", "predict",
           "retrieval_eval", "bench", "ModelDir", "bundle", "bundle_verify"]


class _DistillPackage(_ModuleType):
    """The class of ``bertforge.distill``, which is two things: the distillation subpackage (losses, layer maps,
    students, the distiller; ``bertforge.distill.distiller`` …) and, called, the Python API's distillation,
    :func:`bertforge.pipelines.distill.distill` (loaded on the first call). A lazy name cannot take the
    subpackage's place: importing any of its modules binds ``bertforge.distill`` to the package again."""

    def __call__(self, teacher, student, out, **options):
        """:func:`bertforge.pipelines.distill.distill`: ``teacher`` into ``student``, written to ``out``."""
        import importlib
        return importlib.import_module(".pipelines.distill", __name__).distill(teacher, student, out, **options)


from . import distill  # noqa: E402  (the subpackage: a docstring only, no torch)

distill.__class__ = _DistillPackage


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module = importlib.import_module(_LAZY[name], __name__)
        # a subpackage of the same name is itself the value (bertforge.serve: a package one can call)
        value = module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
