"""Fine-tuning from Python: :func:`finetune` (what ``bertforge finetune`` runs) — a checkpoint trained on a
labelled task (GLUE-style classification and regression, multi-label, NER, QA, retrieval) by the one Trainer,
into a run folder that holds the model, ``recipe.yaml`` and ``metrics.jsonl``.

    >>> import bertforge
    >>> r = bertforge.finetune("minilm", "sst2", "train.tsv", "runs/sst2", eval="dev.tsv", epochs=1,
    ...                        max_train_samples=8000, max_seq_len=64, lr=5e-5)
    >>> r.out, r.metrics["accuracy"]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, DataError
from .recipe import build_recipe
from .rundir import RunDir
from .options import options_from, python_names


@dataclass
class FinetuneOptions:
    """Options of :func:`finetune` — the flags of ``bertforge finetune`` with ``_`` for ``-``, same defaults
    (None: the recipe's or the model's). ``overrides``: recipe ``key=value`` strings (``train.pos_weight=sqrt``)."""

    out: Optional[str] = None
    model: Optional[str] = None
    task: Optional[str] = None
    train: Optional[str] = None
    eval: Optional[str] = None
    max_seq_len: Optional[int] = None
    max_train_samples: Optional[int] = None
    epochs: Optional[float] = None
    max_steps: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    seed: Optional[int] = None
    bf16: bool = False
    resume: bool = False
    overwrite: bool = False
    no_progress: bool = False
    recipe: Optional[str] = None
    overrides: list = field(default_factory=list)
    matryoshka_dims: Optional[str] = None
    truncate_dim: Optional[int] = None
    hard_negatives: Optional[int] = None
    symmetric: bool = False
    pooling: Optional[str] = None


@dataclass
class TrainResult:
    """A training run's outcome: the run folder ``out`` (the final model, ``recipe.yaml``, ``metrics.jsonl``)
    and ``metrics``: the Trainer's result (``step``, ``best``, ``best_step``, the last evaluation's metrics …)."""

    out: Path
    metrics: dict


def finetune(model, task=None, train=None, out=None, **options) -> TrainResult:
    """Fine-tune ``model`` (a checkpoint dir or ``"minilm"``) on ``task`` (``sst2``, ``stsb``, ``conll2003``,
    ``squad``, ``goemotions``, ``retrieval`` … or a custom spec via ``overrides``; None: the task ``model`` was
    fine-tuned on) with the training file ``train`` (None: the task's own data, where it has some), into the
    run folder ``out``; ``options``: the other fields of :class:`FinetuneOptions`.

    Raises:
        ConfigError / DataError / CheckpointError: one line naming what to change (checked before anything
            is written)."""
    if out is None:
        raise ConfigError("finetune(): pass out, the run folder to write (e.g. out='runs/sst2')")
    opts = options_from(FinetuneOptions, "finetune", dict(model=model, task=task, train=train, out=out, **options))
    with python_names(FinetuneOptions):
        return finetune_with(opts)


def finetune_with(opts: FinetuneOptions) -> TrainResult:
    """:func:`finetune` from a complete :class:`FinetuneOptions` (what the verb builds from its flags)."""
    if isinstance(opts.matryoshka_dims, (list, tuple)):
        opts.matryoshka_dims = ",".join(str(d) for d in opts.matryoshka_dims)
    rec = _run(opts)
    out = Path(rec.pop("out"))
    return TrainResult(out, rec)


def setup(args, recipe, sources=None):
    """Resolve model, task and data (validated before anything is written). Inputs not given as flags come
    from the recipe (``sources``, :mod:`bertforge.pipelines.sources`: checked to be the ones it recorded)
    and are recorded in it, data paths resolved; the task (and a custom task's columns and labels) not given
    is the one the model was fine-tuned on (its ``config.json``)."""
    from ..checkpoint.modeldir import ModelDir
    from ..checkpoint.read import check_seq_len
    from ..tasks import adapter_for, get_task, saved_task_spec
    from .sources import Sources, require
    sources = sources if sources is not None else Sources(recipe, getattr(args, "recipe", None))
    d = recipe.data
    args.model = require(sources.model_spec("--model", args.model),
                         "no model given; pass --model DIR (a checkpoint dir, or 'minilm'), or --recipe "
                         "RUN/recipe.yaml of an earlier run")
    d.train = sources.data_path("--train", args.train or d.train, given=args.train is not None)
    d.eval = sources.data_path("--eval", args.eval or d.eval, given=args.eval is not None)
    md = ModelDir.open(args.model)
    model_dir, hf_cfg, meta = md.path, md.config, md.meta
    if not (args.task or d.task or meta.task) and getattr(args, "resume", False):
        meta = _resumed_meta(args.out) or meta  # --resume: the task the run in --out trains
    d.task = args.task or d.task or meta.task
    if not d.task:
        raise ConfigError("no task given; pass --task NAME (e.g. sst2) or data.task in the recipe")
    if not d.train:
        raise ConfigError("no training data given; pass --train FILE")
    for k, v in saved_task_spec(meta, d.task).items():  # a custom task's columns and labels, as trained
        if getattr(d, k, None) is None:
            setattr(d, k, v)
    _check_family(model_dir, hf_cfg)
    from ..tasks import apply_labels_file
    apply_labels_file(d, hf_cfg)
    task = get_task(d.task, d.text_columns, d.label_column, d.labels, d.metric, d.header, d.multi_label,
                    d.allow_empty_labels)
    tok = md.tokenizer()
    check_seq_len(d.max_seq_len, hf_cfg)
    adapter = adapter_for(task, tok, d.max_seq_len)
    from .defaults import default_pooling
    default_pooling(recipe, md, adapter.head)  # the dir's declared pooling unless model.pooling is given
    _configure_retrieval(args, recipe, adapter, md)
    from ..tasks.multilabel import apply_hand_thresholds
    apply_hand_thresholds(adapter, d)  # checked before training; every evaluation uses them
    if Path(d.train).is_dir():  # a BEIR dir is evaluation data (its test qrels), never a training set
        hint = f" such as {Path(d.train) / 'train.jsonl'}" if (Path(d.train) / "train.jsonl").is_file() else ""
        raise DataError(f"--train {d.train} is a directory; pass a training file (TSV, CSV or JSONL){hint}")
    train_ds = adapter.load(d.train, d.max_train_samples)
    eval_ds = adapter.load(d.eval, d.max_eval_samples) if d.eval else None
    return model_dir, task, tok, adapter, train_ds, eval_ds


#: finetune flag → key of the recipe's ``retrieval`` section (--task retrieval)
RETRIEVAL_FLAGS = {"matryoshka_dims": "matryoshka_dims", "truncate_dim": "truncate_dim",
                   "hard_negatives": "hard_negatives", "symmetric": "symmetric", "pooling": "pooling"}


def _configure_retrieval(args, recipe, adapter, md) -> None:
    """The retrieval flags over the recipe's ``retrieval`` section, checked against the model
    (:meth:`bertforge.tasks.retrieval.RetrievalAdapter.configure`) and recorded in ``recipe.yaml``. ConfigError
    for retrieval flags given with another task."""
    given = {key: getattr(args, flag, None) for flag, key in RETRIEVAL_FLAGS.items()
             if getattr(args, flag, None) is not None and getattr(args, flag, None) is not False}  # 0 is a value
    if not hasattr(adapter, "configure"):
        if given:
            flag = "--" + next(iter(given)).replace("_", "-")
            raise ConfigError(f"{flag} applies to --task retrieval only; drop it")
        return
    section = {**(recipe.extra.get("retrieval") or {}), **given}
    width = md.config.get("hidden_size") or md.config.get("dim")
    adapter.configure(section, int(width), md.pooling)
    recipe.extra["retrieval"] = section


def _resumed_meta(out):
    """The :class:`~bertforge.checkpoint.modeldir.Meta` (task, task_spec) of the run in ``out`` that
    ``--resume`` continues: its latest checkpoint's, else its final model's; None when there is none."""
    from ..checkpoint.modeldir import ModelDir
    from ..engine.train.checkpoint import latest_checkpoint
    from ..errors import CheckpointError
    ckpt = latest_checkpoint(Path(out) / "checkpoints") if out else None
    for d in ([ckpt] if ckpt else []) + ([Path(out)] if out else []):
        try:
            meta = ModelDir.open(d).meta
        except CheckpointError:
            continue
        if meta.task:
            return meta
    return None


def _check_family(model_dir, hf_cfg) -> None:
    from ..errors import CheckpointError
    from ..checkpoint.read import config_from_hf
    try:
        config_from_hf(hf_cfg)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}: {e}") from None


def _run(args) -> dict:
    from ..checkpoint.read import load_pretrained
    from ..tasks import task_spec
    from ..engine.train.trainer import Trainer
    from .report import CollapseWarning, print_training_plan
    from .resume_policy import check_batch_fits
    from .sources import Sources
    recipe = build_recipe(args, extra_sections=("retrieval",))
    inputs = Sources(recipe, args.recipe)
    model_dir, task, tok, adapter, train_ds, eval_ds = setup(args, recipe, inputs)
    from .defaults import apply_task_defaults, collapse_hints
    apply_task_defaults(recipe, task, args)  # its benchmark's lr / loss weighting unless the run set them
    check_batch_fits(recipe.train.batch_size, len(train_ds))  # before the model loads or anything is written
    out = Path(args.out)
    run_dir = RunDir(out, inputs=(model_dir,), overwrite=args.overwrite, resume=args.resume)
    sources = {"--model": inputs.record_model("--model", args.model, model_dir)}
    inputs.record(recipe)  # recipe.yaml: what the run read, so that --recipe alone re-runs it
    if args.resume:
        from .resume_policy import check_resume
        check_resume(out, len(train_ds), recipe.train, sources, recipe)  # before the model is built
    with run_dir as work:
        from ..engine.train.rng import set_seed
        set_seed(recipe.train.seed)  # a fresh head starts from the same weights in every run and rank
        # on --resume the checkpoint's weights replace these: no note about a head that starts fresh
        model = load_pretrained(model_dir, head=adapter.head, notes=not args.resume, **adapter.head_config(),
                                **recipe.model)
        model.config.bertforge = {**model.config.bertforge, "task": task.name, "task_spec": task_spec(recipe.data),
                                  "max_seq_len": recipe.data.max_seq_len}
        adapter.prepare_model(model, train_ds)  # e.g. retrieval: pooling and loss settings, mined hard negatives
        if recipe.train.metric_for_best is None and eval_ds is not None:
            recipe.train.metric_for_best = task.metrics[0]
        multi = hasattr(adapter, "configure_loss")  # a multi-label task (tasks/multilabel.py)
        if multi:
            model.config.bertforge["loss"] = adapter.configure_loss(model, train_ds, recipe.train.pos_weight,
                                                                    recipe.train.focal_gamma)
        eval_fn = CollapseWarning("finetune", task, lambda m: adapter.evaluate(m, eval_ds),
                                  step=lambda: trainer.step, hints=collapse_hints(recipe, task)) \
            if eval_ds is not None else None
        trainer = Trainer(model, train_ds, adapter.collator(), recipe, work, eval_fn=eval_fn,
                          save_fn=lambda m, dst: (m.save_pretrained(dst, tokenizer_dir=model_dir),
                                                  adapter.finish_dir(m, dst)), sources=sources)
        print_training_plan("finetune", adapter.counts(train_ds), trainer)
        result = trainer.fit(resume=args.resume)
        if multi:
            from ..tasks.multilabel import save_thresholds
            result["thresholds"] = save_thresholds(work, adapter, recipe.data, eval_ds, result)
    return {"out": str(out), **result}


__all__ = ["FinetuneOptions", "TrainResult", "finetune", "finetune_with", "setup"]
