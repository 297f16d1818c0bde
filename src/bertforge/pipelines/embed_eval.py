"""Models scored as sentence encoders from Python: :func:`embed_eval` (what ``bertforge embed-eval`` runs) —
on the embedded data, every model by the same code (:func:`bertforge.runtime.embedder.evaluate_embedders`).

Each model (a checkpoint dir run by PyTorch, an ``.onnx`` file run by ONNX Runtime, a static dir, or
``"minilm"``) is scored on: Spearman ρ between cosine similarities of pooled embeddings and the human ratings of
gensim's Lee 50-document corpus (Lee, Pincombe & Welsh 2005); 5-fold cross-validated logistic-regression
accuracy on the 200 Pang–Lee polarity sentences; latency (ms, p50/p90) at ``seq_len`` × ``batch_size``, measured
in interleaved rounds across all models; parameters; file size (MB = 10^6 bytes). With ``heldout`` (documents no
model was trained on) also the agreement with the ``reference`` model (Spearman ρ of pairwise passage cosines,
overlap@10 of nearest neighbours) and NDCG@10 / MRR@10 / Recall@1 of a retrieval set built from those documents.

    >>> import bertforge
    >>> r = bertforge.embed_eval({"teacher": "minilm", "student": "runs/demo/student-a"}, rounds=3)
    >>> [(m["name"], m["lee_spearman"], m["latency_ms"]) for m in r.models]
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..checkpoint.modeldir import resolve
from ..errors import ConfigError, require_at_least
from .options import options_from, python_names


@dataclass
class EmbedEvalOptions:
    """Options of :func:`embed_eval` — the flags of ``bertforge embed-eval`` with ``_`` for ``-``, same
    defaults. ``tokenizer``: a tokenizer dir for ``.onnx`` files whose folder has none; ``task`` + ``data``:
    also score each model's task head on a labelled file (``max_seq_len``, ``max_eval_samples``); ``heldout``:
    a text file of documents (blank line between documents) for teacher agreement and retrieval, against the
    model named ``reference`` (default the first); ``out``: also write the result to this JSON file."""

    tokenizer: Optional[str] = None
    seq_len: int = 128
    batch_size: int = 1
    rounds: int = 5
    iters: int = 10
    threads: Optional[int] = None
    lee_max_seq_len: int = 256
    task: Optional[str] = None
    data: Optional[str] = None
    max_seq_len: int = 128
    max_eval_samples: Optional[int] = None
    heldout: Optional[str] = None
    reference: Optional[str] = None
    out: Optional[str] = None
    overwrite: bool = False
    no_progress: bool = False


@dataclass
class EmbedEvalResult:
    """``models``: one row per model, in the order given (``name``, ``backend``, ``lee_spearman``,
    ``polarity_acc``, ``latency_ms`` (p50), ``params``, ``size_mb`` …); ``threads``: the intra-op threads they
    ran with."""

    models: list
    threads: int

    @property
    def record(self) -> dict:
        """The JSON object the verb prints (and ``out`` holds): ``{"models": [...], "threads": n}``."""
        return {"models": self.models, "threads": self.threads}


def parse_model_arg(spec: str) -> tuple:
    """``NAME=PATH`` → (NAME, PATH); ``PATH`` → (None, PATH)."""
    if "=" in spec:
        name, path = spec.split("=", 1)
        if not name or not path:
            raise ConfigError(f"--model {spec!r}: write NAME=PATH or just PATH")
        return name, path
    return None, spec


def embed_eval(models: Union[dict, list, str], **options) -> EmbedEvalResult:
    """Score ``models`` — ``{name: path}``, or a list of ``"[NAME=]PATH"`` strings (the name defaults to the
    path's) — as sentence encoders; ``options``: the fields of :class:`EmbedEvalOptions`.

    Raises:
        ConfigError: an option out of range, two models of one name, ``seq_len`` beyond a model's positions,
            a ``reference`` that names no model; BertforgeError: an ``out`` file that is refused (all before
            any model runs)."""
    if isinstance(models, (str, Path)):
        models = [str(models)]
    specs = [f"{n}={p}" for n, p in models.items()] if isinstance(models, dict) else [str(m) for m in models]
    opts = options_from(EmbedEvalOptions, "embed_eval", options)
    with python_names(EmbedEvalOptions):
        return embed_eval_with(specs, opts)


def embed_eval_with(models: list, args: EmbedEvalOptions) -> EmbedEvalResult:
    """:func:`embed_eval` from ``"[NAME=]PATH"`` strings and a complete :class:`EmbedEvalOptions` (what the verb
    builds from its flags)."""
    from ..runtime.bench import check_threads
    check_threads(args.threads)
    for k in ("seq_len", "batch_size", "rounds", "iters", "lee_max_seq_len", "max_seq_len", "max_eval_samples"):
        require_at_least(f"--{k.replace('_', '-')}", getattr(args, k), 1)
    if bool(args.task) != bool(args.data):
        raise ConfigError("--task and --data go together; pass both or neither")
    specs = [parse_model_arg(spec) for spec in models]
    if args.out:  # before any model is loaded: never into a model, run or checkpoint dir, nor over a file
        from .outputs import check_out_file
        paths = [resolve(str(path)) for _, path in specs]
        check_out_file(Path(args.out), [p if p.is_dir() else p.parent for p in paths], (args.data,),
                       args.overwrite, example="results.json")
    import torch

    from ..runtime.embedder import evaluate_embedders, load_embedder
    if args.threads:
        torch.set_num_threads(args.threads)
    embedders, seen = [], set()
    for name, path in specs:
        e = load_embedder(path, name, args.tokenizer)
        if e.name in seen:
            raise ConfigError(f"two models are named {e.name!r}; give them names with NAME=PATH")
        seen.add(e.name)
        if e.max_positions is not None and args.seq_len > e.max_positions:
            raise ConfigError(f"--seq-len {args.seq_len} exceeds the {e.max_positions} positions of model "
                              f"{e.name!r}; pass --seq-len {e.max_positions} or less")
        embedders.append(e)
    if args.reference and args.reference not in seen:
        raise ConfigError(f"--reference {args.reference!r} is none of the models ({', '.join(seen)}); pass one "
                          f"of their names")
    if args.heldout and not Path(args.heldout).is_file():
        raise ConfigError(f"--heldout {args.heldout} does not exist; pass a text file of documents")
    rows = evaluate_embedders(embedders, args.seq_len, args.batch_size, args.rounds, args.iters,
                              args.lee_max_seq_len, progress=not args.no_progress, task=args.task,
                              task_data=args.data, task_max_seq_len=args.max_seq_len,
                              task_max_samples=args.max_eval_samples, heldout=args.heldout,
                              reference=args.reference)
    result = EmbedEvalResult(rows, torch.get_num_threads())
    if args.out:
        from ..io import atomic_write_text
        atomic_write_text(Path(args.out), json.dumps(result.record, indent=2))
    return result


__all__ = ["EmbedEvalOptions", "EmbedEvalResult", "embed_eval", "embed_eval_with", "parse_model_arg"]
