"""Fine-tune a checkpoint on a labelled task (GLUE, custom CSV/TSV/JSONL, NER, QA).

Example:
  bertforge finetune --model minilm --task sst2 --train train.tsv --eval dev.tsv --out runs/sst2 \
      --epochs 1 --batch-size 32 --lr 5e-5 --max-seq-len 64 --max-train-samples 8000
"""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..names import TASK_NAMES
from ._common import add_recipe_args, add_train_args, build_recipe, print_json, resolve_model_dir
from ._rundir import RunDir

#: what ``--max-train-samples`` counts, per kind of task (the help text and docs/ner_qa.md say the same)
MAX_TRAIN_SAMPLES_HELP = ("use only the first N training records: rows (classification, regression), sentences "
                          "(NER: packed into fewer windows of --max-seq-len tokens) or questions (QA: a long "
                          "context gives several windows); the run prints how many windows and optimizer "
                          "steps that makes before training")


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint dir (HF layout) or 'minilm' (embedded)")
    p.add_argument("--task", help=f"task name ({', '.join(TASK_NAMES)} or custom)")
    p.add_argument("--train", help="training file (TSV/CSV/JSONL) or hub dataset name")
    p.add_argument("--eval", help="evaluation file")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-train-samples", type=int, metavar="N", help=MAX_TRAIN_SAMPLES_HELP)
    add_train_args(p)
    add_recipe_args(p)


def setup(args, recipe):
    """Resolve model, task and data (validated before anything is written)."""
    from ..hf import check_seq_len, read_config
    from ..tasks import adapter_for, get_task
    from ..tokenizer import load_tokenizer
    d = recipe.data
    d.task = args.task or d.task
    d.train = args.train or d.train
    d.eval = args.eval or d.eval
    if not d.task:
        raise ConfigError("no task given; pass --task NAME (e.g. sst2) or data.task in the recipe")
    if not d.train:
        raise ConfigError("no training data given; pass --train FILE")
    model_dir = resolve_model_dir(args.model)
    hf_cfg = read_config(model_dir)
    _check_family(model_dir, hf_cfg)
    task = get_task(d.task, d.text_columns, d.label_column, d.labels, d.metric, d.header)
    tok = load_tokenizer(model_dir)
    check_seq_len(d.max_seq_len, hf_cfg)
    adapter = adapter_for(task, tok, d.max_seq_len)
    train_ds = adapter.load(d.train, d.max_train_samples)
    eval_ds = adapter.load(d.eval, d.max_eval_samples) if d.eval else None
    return model_dir, task, tok, adapter, train_ds, eval_ds


def _check_family(model_dir, hf_cfg) -> None:
    from ..errors import CheckpointError
    from ..hf import config_from_hf
    try:
        config_from_hf(hf_cfg)
    except CheckpointError as e:
        raise CheckpointError(f"{model_dir}: {e}") from None


def run(args) -> int:
    from ..hf import load_pretrained
    from ..tasks import task_spec
    from ..train.trainer import Trainer
    from ._report import CollapseWarning, print_training_plan
    from ._resume_policy import check_batch_fits
    recipe = build_recipe(args)
    model_dir, task, tok, adapter, train_ds, eval_ds = setup(args, recipe)
    check_batch_fits(recipe.train.batch_size, len(train_ds))  # before the model loads or anything is written
    out = Path(args.out)
    run_dir = RunDir(out, inputs=(model_dir,), overwrite=args.overwrite, resume=args.resume)
    from ..io import dir_fingerprint
    sources = {"--model": dir_fingerprint(model_dir)}
    if args.resume:
        from ._resume_policy import check_resume
        check_resume(out, len(train_ds), recipe.train, sources, recipe)  # before the model is built
    with run_dir as work:
        from ..train.rng import set_seed
        set_seed(recipe.train.seed)  # a fresh head starts from the same weights in every run and rank
        model = load_pretrained(model_dir, head=adapter.head, **adapter.head_config(), **recipe.model)
        model.config.bertforge = {**model.config.bertforge, "task": task.name, "task_spec": task_spec(recipe.data),
                                  "max_seq_len": recipe.data.max_seq_len}
        if recipe.train.metric_for_best is None and eval_ds is not None:
            recipe.train.metric_for_best = task.metrics[0]
        eval_fn = CollapseWarning("finetune", task, lambda m: adapter.evaluate(m, eval_ds),
                                  step=lambda: trainer.step) if eval_ds is not None else None
        trainer = Trainer(model, train_ds, adapter.collator(), recipe, work, eval_fn=eval_fn,
                          save_fn=lambda m, dst: m.save_pretrained(dst, tokenizer_dir=model_dir), sources=sources)
        print_training_plan("finetune", adapter.counts(train_ds), trainer)
        result = trainer.fit(resume=args.resume)
    print_json({"out": str(out), **result})
    return 0
