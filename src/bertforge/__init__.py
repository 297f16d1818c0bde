"""bertforge: one PyTorch library and CLI for the BERT family.

Pretrain (BERT, RoBERTa, ALBERT, ELECTRA, SpanBERT), fine-tune, distill (KD, DistilBERT, PKD, TinyBERT,
MiniLM), prune, quantize and benchmark — on one encoder core, one Trainer and Hugging Face checkpoint
directories in and out.
"""
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
         "distill": ".pipelines.distill",
         # the HTTP server in a background thread (server/background.py; the package is bertforge.server)
         "serve": ".server.background", "ServerHandle": ".server.background"}

__all__ = ["ModelConfig", "BertforgeError", "Encoder", "Features", "TaskModel", "load_pretrained",
           "save_pretrained", "finetune", "distill", "quantize", "export", "evaluate", "embed", "pretrain", "prune",
           "translate", "translate_train", "embed_corpus", "embed_eval", "serve_bench", "serve", "predict",
           "retrieval_eval", "bench", "ModelDir", "bundle", "bundle_verify"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
