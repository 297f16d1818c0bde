"""Fine-tune a checkpoint on a labelled task (GLUE, custom CSV/TSV/JSONL, NER, QA).

Example:
  bertforge finetune --model minilm --task sst2 --train train.tsv --eval dev.tsv --out runs/sst2 \
      --epochs 1 --batch-size 32 --lr 5e-5 --max-seq-len 64 --max-train-samples 8000
"""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError, DataError
from ..names import TASK_NAMES
from ._common import add_recipe_args, add_train_args, build_recipe, print_json, resolve_model_dir
from ...pipelines.rundir import RunDir

#: what ``--max-train-samples`` counts, per kind of task (the help text and docs/ner_qa.md say the same)
MAX_TRAIN_SAMPLES_HELP = ("use only the first N training records: rows (classification, regression), sentences "
                          "(NER: packed into fewer windows of --max-seq-len tokens) or questions (QA: a long "
                          "context gives several windows); the run prints how many windows and optimizer "
                          "steps that makes before training")


def add_arguments(p) -> None:
    p.add_argument("--model", help="checkpoint dir (HF layout) or 'minilm' (embedded); default: the one "
                                   "--recipe RUN/recipe.yaml records")
    p.add_argument("--task", help=f"task name ({', '.join(TASK_NAMES)} or custom)")
    p.add_argument("--train", help="training file (TSV/CSV/JSONL) or hub dataset name")
    p.add_argument("--eval", help="evaluation file")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-train-samples", type=int, metavar="N", help=MAX_TRAIN_SAMPLES_HELP)
    g = p.add_argument_group("--task retrieval (recipe section retrieval.*; docs/search.md)")
    g.add_argument("--matryoshka-dims", metavar="D,D,…",
                   help="Matryoshka representation learning: the loss summed over these nested embedding dims "
                        "(e.g. 384,256,128,64; each ≤ the model's width)")
    g.add_argument("--truncate-dim", type=int, metavar="D",
                   help="the embedding dim the saved dir serves (sentence-transformers' truncate_dim)")
    g.add_argument("--hard-negatives", type=int, metavar="N",
                   help="mine N hard negatives per query with the model itself before training")
    g.add_argument("--symmetric", action="store_true",
                   help="symmetric in-batch-negatives loss (query→passage and passage→query)")
    g.add_argument("--pooling", choices=("mean", "cls", "max"),
                   help="pooling of the embedding (default: the model dir's, else mean)")
    add_train_args(p)
    add_recipe_args(p)


def setup(args, recipe, sources=None):
    """Resolve model, task and data (validated before anything is written). Inputs not given as flags come
    from the recipe (``sources``, :mod:`bertforge.cli.commands._sources`: checked to be the ones it recorded)
    and are recorded in it, data paths resolved; the task (and a custom task's columns and labels) not given
    is the one the model was fine-tuned on (its ``config.json``)."""
    from ...checkpoint.read import check_seq_len, read_config
    from ...tasks import adapter_for, get_task, saved_task_spec
    from ...tokenizer import load_tokenizer
    from ._sources import Sources, require
    sources = sources if sources is not None else Sources(recipe, getattr(args, "recipe", None))
    d = recipe.data
    args.model = require(sources.model_spec("--model", args.model),
                         "no model given; pass --model DIR (a checkpoint dir, or 'minilm'), or --recipe "
                         "RUN/recipe.yaml of an earlier run")
    d.train = sources.data_path("--train", args.train or d.train, given=args.train is not None)
    d.eval = sources.data_path("--eval", args.eval or d.eval, given=args.eval is not None)
    model_dir = resolve_model_dir(args.model)
    hf_cfg = read_config(model_dir)
    meta = hf_cfg.get("bertforge") or {}
    if not (args.task or d.task or meta.get("task")) and getattr(args, "resume", False):
        meta = _resumed_meta(args.out) or meta  # --resume: the task the run in --out trains
    d.task = args.task or d.task or meta.get("task")
    if not d.task:
        raise ConfigError("no task given; pass --task NAME (e.g. sst2) or data.task in the recipe")
    if not d.train:
        raise ConfigError("no training data given; pass --train FILE")
    for k, v in saved_task_spec(meta, d.task).items():  # a custom task's columns and labels, as trained
        if getattr(d, k, None) is None:
            setattr(d, k, v)
    _check_family(model_dir, hf_cfg)
    from ...tasks import apply_labels_file
    apply_labels_file(d, hf_cfg)
    task = get_task(d.task, d.text_columns, d.label_column, d.labels, d.metric, d.header, d.multi_label,
                    d.allow_empty_labels)
    tok = load_tokenizer(model_dir)
    check_seq_len(d.max_seq_len, hf_cfg)
    adapter = adapter_for(task, tok, d.max_seq_len)
    _configure_retrieval(args, recipe, adapter, model_dir, hf_cfg)
    from ...tasks.multilabel import apply_hand_thresholds
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


def _configure_retrieval(args, recipe, adapter, model_dir, hf_cfg) -> None:
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
    from ...models.pooling import read_pooling
    section = {**(recipe.extra.get("retrieval") or {}), **given}
    width = hf_cfg.get("hidden_size") or hf_cfg.get("dim")
    adapter.configure(section, int(width), read_pooling(model_dir))
    recipe.extra["retrieval"] = section


def _resumed_meta(out) -> dict:
    """The ``bertforge`` section (task, task_spec) of the ``config.json`` of the run in ``out`` that
    ``--resume`` continues: its latest checkpoint's, else its final model's; {} when there is none."""
    import json

    from ...engine.train.checkpoint import latest_checkpoint
    ckpt = latest_checkpoint(Path(out) / "checkpoints") if out else None
    for d in ([ckpt] if ckpt else []) + ([Path(out)] if out else []):
        try:
            meta = json.loads((d / "config.json").read_text(encoding="utf-8")).get("bertforge") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if meta.get("task"):
            return meta
    return {}


def _check_family(model_dir, hf_cfg) -> None:
    from ...errors import CheckpointError
    from ...checkpoint.read import config_from_hf
    try:
        config_from_hf(hf_cfg)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}: {e}") from None


def run(args) -> int:
    from ...checkpoint.read import load_pretrained
    from ...tasks import task_spec
    from ...engine.train.trainer import Trainer
    from ._report import CollapseWarning, print_training_plan
    from ._resume_policy import check_batch_fits
    from ._sources import Sources
    recipe = build_recipe(args, extra_sections=("retrieval",))
    inputs = Sources(recipe, args.recipe)
    model_dir, task, tok, adapter, train_ds, eval_ds = setup(args, recipe, inputs)
    check_batch_fits(recipe.train.batch_size, len(train_ds))  # before the model loads or anything is written
    out = Path(args.out)
    run_dir = RunDir(out, inputs=(model_dir,), overwrite=args.overwrite, resume=args.resume)
    sources = {"--model": inputs.record_model("--model", args.model, model_dir)}
    inputs.record(recipe)  # recipe.yaml: what the run read, so that --recipe alone re-runs it
    if args.resume:
        from ._resume_policy import check_resume
        check_resume(out, len(train_ds), recipe.train, sources, recipe)  # before the model is built
    with run_dir as work:
        from ...engine.train.rng import set_seed
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
                                  step=lambda: trainer.step) if eval_ds is not None else None
        trainer = Trainer(model, train_ds, adapter.collator(), recipe, work, eval_fn=eval_fn,
                          save_fn=lambda m, dst: (m.save_pretrained(dst, tokenizer_dir=model_dir),
                                                  adapter.finish_dir(m, dst)), sources=sources)
        print_training_plan("finetune", adapter.counts(train_ds), trainer)
        result = trainer.fit(resume=args.resume)
        if multi:
            from ...tasks.multilabel import save_thresholds
            result["thresholds"] = save_thresholds(work, adapter, recipe.data, eval_ds, result)
    print_json({"out": str(out), **result})
    return 0
