"""Distil a teacher into a smaller student (KD, DistilBERT, BERT-PKD, TinyBERT, MiniLM).

Examples:
  bertforge distill --teacher runs/sst2 --student layers:0,2,4 --method kd --task sst2 \
      --train train.tsv --eval dev.tsv --out runs/sst2-3l
  bertforge distill --stage general --teacher minilm --student 4L-312H-12A-1200I --method tinybert \
      --corpus wiki.valid.raw emma.txt --out runs/tiny-general --max-steps 300
  bertforge distill --teacher runs/sst2 --student runs/tiny-general --method tinybert --task sst2 \
      --train train.tsv --eval dev.tsv --augment 4 --out runs/tiny-sst2
  bertforge distill --method static --teacher minilm --dim 256 --out runs/minilm-static
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ...errors import ConfigError
from ..names import DISTILL_METHODS, DISTILL_STAGES, DISTILL_TABLE_METHODS, LAYER_MAPS, Choices
from ._common import (add_recipe_args, add_train_args, build_recipe, check_cache_dir, check_flags_agree,
                      print_json, resolve_model_dir)
from ...pipelines.rundir import RunDir

#: the methods of :data:`bertforge.distill.distiller.EMBEDDING_METHODS` (sentence embeddings; docs/search.md)
EMBEDDING_METHODS = ("embedding_mse", "margin_mse")


def apply_kernels(model, kernels):
    """:func:`bertforge.engine.kernels.apply_kernels`, imported on first use (the parser loads without torch)."""
    from ...engine.kernels import apply_kernels as apply
    return apply(model, kernels)


def add_arguments(p) -> None:
    p.add_argument("--teacher", action="append",
                   help="teacher checkpoint dir or 'minilm'; repeat for several teachers (averaged soft targets); "
                        "default: the ones --recipe RUN/recipe.yaml records")
    p.add_argument("--student", help="shape (4L-312H-12A-1200I, 6L-768H), FAMILY:SHAPE for another family "
                                     "(modernbert:4L-384H-6A-576I), layers:0,2,4 (copied from the "
                                     "teacher) or a checkpoint dir (an earlier stage)")
    p.add_argument("--method", choices=Choices(DISTILL_METHODS + DISTILL_TABLE_METHODS,
                                               "bertforge.distill.distiller:METHODS"),
                   help="named loss set (default kd for --stage task, tinybert for --stage general); static: "
                        "a static embedding table (every vocabulary token through the teacher, PCA to --dim, "
                        "SIF/Zipf weights; no training)")
    p.add_argument("--dim", type=int, metavar="D", help="--method static: dimensions of the table (default 256)")
    p.add_argument("--sif-coefficient", type=float, metavar="A",
                   help="--method static: SIF weight a/(a+p(w)) coefficient a (default 1e-4)")
    p.add_argument("--remove-top", type=int, metavar="K",
                   help="--method static: skip the top K principal components (common-component removal; "
                        "default 8, at most the teacher's width − --dim; 0: model2vec's recipe)")
    p.add_argument("--stage", choices=DISTILL_STAGES, help="task (labelled data) or general (raw text)")
    p.add_argument("--task", help="task name for --stage task (default: the teacher's task)")
    p.add_argument("--train", help="labelled training file (--stage task)")
    p.add_argument("--eval", help="labelled evaluation file")
    p.add_argument("--corpus", nargs="+", help="text files (--stage general)")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-train-samples", type=int, metavar="N",
                   help="--stage task: use only the first N training records, as in finetune (rows; NER: "
                        "sentences, packed into fewer windows; QA: questions, a long context gives several "
                        "windows); --stage general: N sequences of --max-seq-len tokens spread evenly over the "
                        "corpus; the run prints how many items and optimizer steps that makes")
    p.add_argument("--temperature", type=float, help="soft-target temperature T (all logits losses)")
    p.add_argument("--alpha", type=float, help="kd: weight of the soft loss; 1−α goes to the hard labels")
    p.add_argument("--layer-map", help=f"{' | '.join(LAYER_MAPS)} | pairs like 1:2,2:4,3:6")
    p.add_argument("--augment", type=int, default=None, metavar="N",
                   help="TinyBERT augmentation: N augmented copies per training example (task stage)")
    p.add_argument("--augment-prob", type=float, help="per-word replacement probability (default 0.4)")
    p.add_argument("--augment-mlm", metavar="DIR",
                   help="masked LM whose top-K predictions replace single-piece words (TinyBERT §3.3): a "
                        "checkpoint with an MLM head and the teacher's tokenizer, e.g. the pretrained model "
                        "the teacher was fine-tuned from (default: nearest neighbours in the teacher's "
                        "embeddings for every word)")
    p.add_argument("--mlm-prob", type=float, help="general stage: MLM-corrupt inputs with this probability")
    p.add_argument("--no-cache", action="store_true", help="run the teacher every step (no disk cache)")
    p.add_argument("--cache-dir", help="where teacher outputs are cached (default: <out>/teacher_cache)")
    add_train_args(p)
    add_recipe_args(p)


def _distill_section(recipe) -> dict:
    d = dict(recipe.extra.get("distill") or {})
    known = {"method", "stage", "student", "losses", "temperature", "alpha", "layer_map", "augment",
             "cache", "mlm_probability", "teachers"}
    bad = set(d) - known
    if bad:
        raise ConfigError(f"unknown recipe keys distill.{sorted(bad)[0]}; valid: {', '.join(sorted(known))}")
    return d


def _fingerprint(teacher_dirs, items, max_len, shapes) -> dict:
    h = hashlib.sha1()
    for it in items:
        h.update(json.dumps(it["input_ids"]).encode())
    teach = []
    from ...checkpoint.read import weight_files
    for t in teacher_dirs:  # a changed teacher (any of its weight files, shards too) invalidates the cache
        files = weight_files(Path(t))
        teach.append([str(t), max(f.stat().st_mtime for f in files) if files else None])
    return {"teachers": teach, "data": h.hexdigest(), "max_len": max_len}


#: keys of the recipe's ``distill.augment`` mapping
AUGMENT_KEYS = {"copies", "prob", "top_k", "swap_prob", "mlm"}

def _check_augment_mlm(mlm_dir: str, teacher_dir) -> None:
    """ConfigError unless ``mlm_dir`` holds a masked LM (saved MLM head) with the teacher's vocabulary."""
    from ...checkpoint.read import MLM_HEADS, read_config, saved_head_name
    from ...tokenizer import load_tokenizer
    head = saved_head_name(read_config(mlm_dir))
    if head not in MLM_HEADS:
        raise ConfigError(f"--augment-mlm {mlm_dir} has {'a ' + head if head not in (None, 'base') else 'no'} "
                          f"head, not a masked-LM one; pass a checkpoint saved with an MLM head (e.g. a "
                          f"`bertforge pretrain` run or a *ForMaskedLM dir)")
    if load_tokenizer(mlm_dir).get_vocab() != load_tokenizer(teacher_dir).get_vocab():
        raise ConfigError(f"--augment-mlm {mlm_dir} has another vocabulary than teacher {teacher_dir}; its "
                          f"predictions are teacher word pieces, so pass a masked LM with the teacher's tokenizer")


def _check_vocabularies(teacher_dirs, student_spec) -> None:
    """Teachers and a student given as a checkpoint dir must share one vocabulary: the same input_ids are
    fed to all of them. Raises ConfigError before anything is loaded or written."""
    from ...checkpoint.read import read_config
    from ...tokenizer import load_tokenizer
    dirs = [Path(t) for t in teacher_dirs]
    if student_spec and Path(str(student_spec)).is_dir():
        dirs.append(Path(str(student_spec)))
    if len(dirs) < 2:
        return
    ref_size = read_config(dirs[0]).get("vocab_size")
    ref_vocab = load_tokenizer(dirs[0]).get_vocab()
    for d in dirs[1:]:
        role = "student" if d == dirs[-1] and len(dirs) > len(teacher_dirs) else "teacher"
        size = read_config(d).get("vocab_size")
        if size != ref_size or load_tokenizer(d).get_vocab() != ref_vocab:
            sizes = f"{size} tokens" + (", other ids" if size == ref_size else "")
            fix = ("build the student from the teacher (--student 4L-312H-12A-1200I or layers:0,2,4) or use "
                   "checkpoints that share the teacher's tokenizer" if role == "student" else
                   "pass teachers that share one tokenizer (fine-tuned from the same checkpoint)")
            raise ConfigError(f"{role} {d} has a different vocabulary ({sizes}) than teacher {dirs[0]} "
                              f"({ref_size} tokens); distillation feeds the same input_ids to all — {fix}")


def _check_flags_used(args, entries: list, method: str, stage: str) -> None:
    """ConfigError for a CLI flag the chosen losses would ignore: ``--temperature`` without a soft-logit
    term, ``--alpha`` without a ``kd`` term (it weighs that term's hard-label CE), ``--layer-map`` without a
    layer-wise term that follows a map, ``--mlm-prob`` in the task stage."""
    from ...distill.distiller import follows_layer_map, reads_logits
    names = [e["loss"] for e in entries]
    listed = f"--method {method} ({stage} stage) trains {', '.join(names)}"
    if args.temperature is not None and not any(map(reads_logits, names)):
        raise ConfigError(f"--temperature softens teacher logits, but {listed}, none of which reads "
                          f"logits; drop --temperature")
    if args.alpha is not None and "kd" not in names:
        raise ConfigError(f"--alpha weighs the kd term against the hard-label loss, but {listed}; drop "
                          f"--alpha")
    if args.layer_map is not None and not any(map(follows_layer_map, entries)):
        raise ConfigError(f"--layer-map pairs student and teacher layers, but {listed}, none of them "
                          f"layer-wise with a named map; drop --layer-map or choose --method pkd, tinybert or minilm")
    if args.mlm_prob is not None and stage == "task":
        raise ConfigError("--mlm-prob corrupts the inputs of general (corpus) distillation; drop it for "
                          "--stage task")


def _applied(entry: dict, term, layer_map) -> dict:
    """A loss entry as the run applied it, for ``recipe.yaml``: the temperature/alpha that
    ``--temperature``/``--alpha`` set on the term, the ``--layer-map`` that replaced a named map."""
    from ...distill.distiller import follows_layer_map, reads_logits
    e = dict(entry)
    if reads_logits(e["loss"]):
        e["temperature"] = term.temperature
    if e["loss"] == "kd":
        e["alpha"] = term.alpha
    if layer_map is not None and follows_layer_map(e):
        e["layers"] = layer_map
    return e


@dataclass
class Options:
    """What the command line and the recipe's ``distill`` section ask for, checked (flags win)."""
    section: dict              # the recipe's distill section as given
    stage: str                 # "task" (labelled data) or "general" (raw text)
    method: str                # kd | distilbert | pkd | tinybert | minilm
    student: str               # shape, layers:…, or a checkpoint dir
    temperature: Optional[float]
    alpha: Optional[float]
    augment: dict              # the recipe's distill.augment
    copies: int                # augmented copies per training example (0: none)
    augment_mlm: Optional[str]  # masked LM whose predictions replace words


@dataclass
class Data:
    """The teachers loaded with the head the data needs, and the training/evaluation data."""
    teachers: list
    tokenizer: object          # the teacher's (teachers and student share one vocabulary)
    head: str
    head_config: dict
    items: list                # encoded training examples or corpus sequences
    base_collate: object       # pads a batch of ``items``
    eval_ds: object = None
    adapter: object = None
    task: object = None
    task_spec: Optional[dict] = None
    token_task: bool = False   # per-token logits (NER, QA)
    augment_record: Optional[dict] = None  # the augmentation applied, for recipe.yaml
    counts: Optional[dict] = None  # records read → training items (TaskAdapter.counts), for the plan line
    pooling: object = None     # embedding methods: the teacher's pooling (models.pooling.Pooling), the student's too
    cross_encoder: bool = False  # margin_mse: the teacher scores (query, passage) pairs


@dataclass
class Losses:
    """The loss terms the distiller trains, as the recipe lists them (``entries``) and built (``terms``)."""
    entries: list
    terms: list
    mlm_probability: float     # share of input tokens MLM-corrupted (general stage)


def run(args) -> int:
    """``bertforge distill``: options → teachers → data → student → losses → run dir → distiller → train.
    Every check runs before anything is written; the run dir is a :class:`RunDir`."""
    if args.method in DISTILL_TABLE_METHODS:
        return run_static(args)
    for flag, value in (("--dim", args.dim), ("--sif-coefficient", args.sif_coefficient),
                        ("--remove-top", args.remove_top)):
        if value is not None:
            raise ConfigError(f"{flag} is an option of --method static; drop it or add --method static")
    from ...distill.data import IndexedDataset
    from ...pipelines.sources import Sources, require
    recipe = build_recipe(args, extra_sections=("distill",))
    prov = Sources(recipe, args.recipe)  # the inputs --recipe recorded; those this run reads
    args.teacher = require(prov.model_specs("--teacher", args.teacher),
                           "no teacher given; pass --teacher DIR (a checkpoint dir, or 'minilm'), or --recipe "
                           "RUN/recipe.yaml of an earlier run")
    prov.model_spec("--student", args.student, fallback=(recipe.extra.get("distill") or {}).get("student"))
    opts = read_options(args, recipe)
    if Path(opts.student).is_dir():  # recorded resolved: the recipe re-runs from any working directory
        opts.student = str(Path(opts.student).resolve())
    teacher_dirs = resolve_teachers(args, opts, recipe, prov)
    data = build_data(args, opts, recipe, teacher_dirs, prov)
    student = build_student_model(opts, data, teacher_dirs, recipe.train.seed, notes=not args.resume)
    losses = choose_losses(args, opts, data.teachers[0], teacher_dirs, student)
    use_cache = wants_teacher_cache(args, opts, recipe, data, losses)
    collate = distill_collator(data, losses)
    # embedding_mse: every item is one independent text (a query or a passage): batches of similar length
    dataset = IndexedDataset(data.items, group_by_length=opts.method == "embedding_mse")
    record_run(args, opts, recipe, data, losses, student, teacher_dirs)

    out = Path(args.out)
    inputs = (*teacher_dirs, *([opts.student] if Path(opts.student).is_dir() else []))
    check_teacher_cache_dir(args, out, inputs)
    run_dir = RunDir(out, inputs=inputs, overwrite=args.overwrite, resume=args.resume)
    sources = source_fingerprints(teacher_dirs, opts.student, prov, args.teacher)
    if opts.augment_mlm:
        prov.record_model("--augment-mlm", opts.augment_mlm, opts.augment_mlm)
    prov.record(recipe)  # recipe.yaml: what the run read, so that --recipe alone re-runs it
    if args.resume:
        from ...pipelines.resume_policy import check_resume
        check_resume(out, len(dataset), recipe.train, sources, recipe)  # before anything is written
    with run_dir as work:
        distiller, cache = build_distiller(args, opts, recipe, data, losses, student, teacher_dirs, work,
                                           use_cache)
        result = train(distiller, dataset, collate, recipe, work, data, teacher_dirs, sources, args.resume)
        if cache is not None:
            cache.flush()
        if hasattr(data.adapter, "configure_loss") and opts.stage == "task":  # multi-label: own thresholds
            from ...tasks.multilabel import save_thresholds
            result["thresholds"] = save_thresholds(work, data.adapter, recipe.data, data.eval_ds, result)
    print_json({"out": str(out), "stage": opts.stage, "method": opts.method, "student": opts.student,
                "student_params": sum(p.numel() for p in student.parameters()),
                "teacher_params": sum(p.numel() for p in data.teachers[0].parameters()), **result})
    return 0


# ------------------------------------------------------------------------------------------- options
def read_options(args, recipe) -> Options:
    """Stage, method, student, temperature, alpha and augmentation from the flags over the recipe.

    Raises:
        ConfigError: a flag of the other stage, a missing or malformed student, T ≤ 0, α outside [0, 1],
            augmentation options that do not apply, an unknown recipe key.
    """
    ds = _distill_section(recipe)
    check_flags_agree(args, "distill", {
        "stage": ("--stage", args.stage), "method": ("--method", args.method), "student": ("--student", args.student),
        "temperature": ("--temperature", args.temperature), "alpha": ("--alpha", args.alpha),
        "mlm_probability": ("--mlm-prob", args.mlm_prob), "layer_map": ("--layer-map", args.layer_map)})
    stage = args.stage or ds.get("stage") or ("general" if args.corpus else "task")
    task_opts = [f for f, v in (("--task", args.task), ("--train", args.train), ("--eval", args.eval)) if v]
    if stage == "general" and task_opts:
        raise ConfigError(f"{task_opts[0]} belongs to --stage task (labelled data) and the general stage reads "
                          f"--corpus only; drop {task_opts[0]} or pass --stage task")
    if stage == "task" and args.corpus:
        raise ConfigError("--corpus (raw text) belongs to --stage general and the task stage reads --train "
                          "FILE; drop --corpus or pass --stage general")
    method = args.method or ds.get("method") or ("tinybert" if stage == "general" else "kd")
    if method == "margin_mse" and stage == "general":
        raise ConfigError("--method margin_mse distils score margins of (query, positive, negative) triples: pass "
                          "--task retrieval --train FILE, not --corpus")
    student_spec = args.student or ds.get("student")
    if not student_spec:
        raise ConfigError("no student given; pass --student 4L-312H-12A-1200I, layers:0,2,4 or a checkpoint dir")
    if Path(student_spec).is_file():
        raise ConfigError(f"--student {student_spec} is a file; pass a checkpoint dir, a shape like "
                          f"4L-312H-12A-1200I, or layers:0,2,4")
    temperature = args.temperature if args.temperature is not None else ds.get("temperature")
    alpha = args.alpha if args.alpha is not None else ds.get("alpha")
    if temperature is not None and not 0 < float(temperature) < float("inf"):
        raise ConfigError(f"--temperature {temperature} must be a finite number > 0 (soft targets are "
                          f"softmax(z / T))")
    if alpha is not None and not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"--alpha {alpha} must be in [0, 1] (weight of the soft loss)")
    if args.augment is not None and args.augment < 0:
        raise ConfigError(f"--augment {args.augment} must be ≥ 0 (augmented copies per example)")
    if stage == "general" and (args.augment or args.augment_prob is not None):
        raise ConfigError("--augment / --augment-prob rewrite labelled task examples and apply to --stage task "
                          "only; drop them for the general stage")
    if args.augment_prob is not None and not args.augment and not (ds.get("augment") or {}).get("copies"):
        raise ConfigError("--augment-prob sets the word-replacement rate of --augment N; pass --augment N too")
    aug_cfg = dict(ds.get("augment") or {})
    bad = set(aug_cfg) - AUGMENT_KEYS
    if bad:
        raise ConfigError(f"unknown recipe key distill.augment.{sorted(bad)[0]}; valid: "
                          f"{', '.join(sorted(AUGMENT_KEYS))}")
    n_aug = args.augment if args.augment is not None else aug_cfg.get("copies", 0)
    if args.augment_mlm and (stage == "general" or not n_aug):
        raise ConfigError("--augment-mlm picks the masked LM of --augment N (task stage); pass --augment N too"
                          if stage == "task" else "--augment-mlm applies to --stage task only; drop it")
    if not (student_spec.startswith("layers:") or Path(student_spec).exists()):
        if "/" in student_spec or "\\" in student_spec or student_spec.startswith("."):
            raise ConfigError(f"--student {student_spec}: no such checkpoint dir; give an existing dir (e.g. a "
                              f"pruned model), a shape like 4L-312H-12A-1200I, or layers:0,2,4")
        from ...config import FAMILIES
        from ...distill.student import parse_shape
        family, sep, shape = student_spec.partition(":")
        if sep and family.strip().lower() not in FAMILIES:
            raise ConfigError(f"--student {student_spec}: {family!r} is no model family; write FAMILY:SHAPE with "
                              f"one of {', '.join(FAMILIES)} (e.g. modernbert:4L-384H-6A-576I)")
        parse_shape(shape if sep else student_spec)  # a malformed shape is reported before any model is loaded
    return Options(section=ds, stage=stage, method=method, student=student_spec, temperature=temperature,
                   alpha=alpha, augment=aug_cfg, copies=n_aug, augment_mlm=args.augment_mlm or aug_cfg.get("mlm"))


# ------------------------------------------------------------------------------------------ teachers
def resolve_teachers(args, opts: Options, recipe, inputs=None) -> list:
    """The teacher dirs, checked before any model is loaded: ``--max-seq-len`` fits every teacher, teachers
    and a student dir share one vocabulary, an ``--augment-mlm`` dir is a masked LM of that vocabulary.
    Without a length asked for, ``data.max_seq_len`` becomes the one the teacher was fine-tuned with."""
    from ...checkpoint.read import check_seq_len, read_config
    teacher_dirs = [resolve_model_dir(t) for t in args.teacher]
    for t in teacher_dirs:
        check_seq_len(args.max_seq_len, read_config(t))  # validates the dir before anything is written
    _check_vocabularies(teacher_dirs, opts.student)
    if args.max_seq_len is None and "data.max_seq_len" not in recipe.given:
        # nothing asked for a length: the teacher's own (as it was fine-tuned)
        meta = read_config(teacher_dirs[0]).get("bertforge") or {}
        if meta.get("max_seq_len"):
            recipe.data.max_seq_len = int(meta["max_seq_len"])
    if opts.augment_mlm and opts.stage == "task" and opts.copies:
        if inputs is not None:  # the recipe's masked LM: checked to be the one it recorded
            inputs.model_spec("--augment-mlm", args.augment_mlm, fallback=opts.augment_mlm)
        opts.augment_mlm = str(Path(resolve_model_dir(str(opts.augment_mlm))).resolve())
        _check_augment_mlm(opts.augment_mlm, teacher_dirs[0])
    return teacher_dirs


# ---------------------------------------------------------------------------------------------- data
def build_data(args, opts: Options, recipe, teacher_dirs, inputs=None) -> Data:
    """Load the teachers and the training data of the stage: labelled task examples (optionally augmented,
    TinyBERT §3.3) or corpus sequences. ``inputs`` (:class:`bertforge.pipelines.sources.Sources`) checks data
    files taken from the recipe and records them; data paths are recorded resolved."""
    from ...tokenizer import load_tokenizer
    from ...pipelines.sources import Sources
    inputs = inputs if inputs is not None else Sources(recipe, getattr(args, "recipe", None))
    tok = load_tokenizer(teacher_dirs[0])
    if opts.stage == "task":
        return _task_data(args, opts, recipe, teacher_dirs, tok, inputs)
    return _corpus_data(args, recipe, teacher_dirs, tok, inputs)


def _task_data(args, opts: Options, recipe, teacher_dirs, tok, inputs) -> Data:
    """Teachers with the task's head (each checked to have it, with the task's label count) and the task's
    examples.

    Raises:
        ConfigError: no task or training file, a teacher without the task's head or with another label
            count, ``--augment`` for a token task.
    """
    from ...tasks import adapter_for, get_task, saved_task_spec, task_spec
    from ...checkpoint.read import load_pretrained, read_config, require_saved_head
    d = recipe.data
    meta = read_config(teacher_dirs[0]).get("bertforge") or {}
    d.task = args.task or d.task or meta.get("task")
    d.train = inputs.data_path("--train", args.train or d.train, given=args.train is not None)
    d.eval = inputs.data_path("--eval", args.eval or d.eval, given=args.eval is not None)
    if not d.task:
        raise ConfigError("--stage task needs --task NAME (the teacher does not record one)")
    if not d.train:
        raise ConfigError("--stage task needs --train FILE (labelled data)")
    # the teacher's column/label settings for its own task, under any given on this command line
    from ...tasks import apply_labels_file
    apply_labels_file(d, read_config(teacher_dirs[0]))
    spec = {**saved_task_spec(meta, d.task), **task_spec(d)}
    task = get_task(d.task, **spec)
    adapter = adapter_for(task, tok, d.max_seq_len)
    from ...tasks.multilabel import apply_hand_thresholds
    apply_hand_thresholds(adapter, d)  # checked before training; every evaluation uses them
    if task.kind == "retrieval":
        return _retrieval_data(opts, recipe, teacher_dirs, tok, task, adapter)
    if opts.method in EMBEDDING_METHODS:
        raise ConfigError(f"--method {opts.method} distils sentence embeddings: pass --task retrieval with "
                          f"(query, positive[, negative]) rows, or --stage general --corpus FILE (embedding_mse)")
    token_task = task.kind in ("token_classification", "qa")  # per-token logits (docs/ner_qa.md)
    if hasattr(adapter, "use_model_labels"):  # tag set as the teacher learnt it
        adapter.use_model_labels(teacher_dirs[0])
    head, head_cfg = adapter.head, adapter.head_config()
    for tdir in teacher_dirs:  # a teacher without this task's head would teach from random weights
        require_saved_head(read_config(tdir), head, f"teacher {tdir}", task.name,
                           f"fine-tune the teacher on {task.name} first (bertforge finetune) or pass --task")
    teachers = [apply_kernels(load_pretrained(t, head=head), recipe.impl.kernels) for t in teacher_dirs]
    for t, tdir in zip(teachers, teacher_dirs):
        if getattr(t.head, "num_labels", None) != (task.num_labels or head_cfg.get("num_labels")):
            raise ConfigError(f"teacher {tdir} predicts {getattr(t.head, 'num_labels', '?')} labels but "
                              f"task {task.name} has {task.num_labels}; fine-tune the teacher on it first")
    from ...data.readers import read_examples
    examples = [] if token_task else read_examples(d.train, task, d.max_train_samples)
    if opts.copies and token_task:
        raise ConfigError(f"--augment rewrites sentences and is not available for {task.kind} tasks; drop it")
    aug_record, n_read = None, len(examples)
    if opts.copies:
        examples, aug_record = _augment(args, opts, examples, tok, teachers[0], recipe.train.seed)
    from ...data.collate import encode_examples
    if token_task:
        windows = adapter.load(d.train, d.max_train_samples)
        items, counts = list(windows), adapter.counts(windows)
    else:
        items = encode_examples(tok, examples, d.max_seq_len)
        counts = {"read": n_read, "read_unit": "examples", "items": len(items), "max_seq_len": d.max_seq_len,
                  "item_unit": "examples with augmented copies" if opts.copies else "examples"}
    base_collate = adapter.collator()
    eval_ds = adapter.load(d.eval, d.max_eval_samples) if d.eval else None
    return Data(teachers=teachers, tokenizer=tok, head=head, head_config=head_cfg, items=items,
                base_collate=base_collate, eval_ds=eval_ds, adapter=adapter, task=task, task_spec=spec,
                token_task=token_task, augment_record=aug_record, counts=counts)


def _retrieval_data(opts: Options, recipe, teacher_dirs, tok, task, adapter) -> Data:
    """Search distillation data (docs/search.md) from a (query, positive[, negative]) file: for
    ``embedding_mse`` every distinct text of it (queries, positives, negatives) is one example (Reimers &
    Gurevych 2020 distil on sentences); for ``margin_mse`` every (query, positive, negative) triple is one,
    with the teacher's score margin from a cross-encoder teacher (a saved one-logit sequence classifier,
    scoring each pair), a bi-encoder teacher (its own pooled embeddings) or ``scores`` in the file
    (Hofstätter et al. 2020). Teachers are the encoders with the pooling their dirs declare.

    Raises:
        ConfigError: another method than embedding_mse / margin_mse; margin_mse rows without a negative;
            a cross-encoder teacher for embedding_mse.
    """
    from ...data.collate import PadCollator
    from ...checkpoint.read import load_pretrained, read_config, saved_head_name
    from ...models.pooling import read_pooling
    from ...tasks.retrieval import PairExample, read_pairs
    from ...tokenizer import encode_texts, pad_id
    d = recipe.data
    if opts.method not in EMBEDDING_METHODS:
        raise ConfigError(f"--task retrieval distils an embedding model: pass --method embedding_mse or "
                          f"margin_mse (not {opts.method})")
    cfg0 = read_config(teacher_dirs[0])
    cross = saved_head_name(cfg0) == "sequence_classification" and len(cfg0.get("id2label") or {0: 0}) == 1
    if cross and opts.method == "embedding_mse":
        raise ConfigError(f"--method embedding_mse copies a bi-encoder's embeddings and teacher {teacher_dirs[0]} "
                          f"is a cross-encoder (one-logit classifier); use --method margin_mse with it")
    pooling = read_pooling(teacher_dirs[0])
    adapter.configure({}, int(cfg0.get("hidden_size") or cfg0.get("dim")), pooling)
    pairs = read_pairs(d.train, d.max_train_samples)
    if opts.method == "embedding_mse":
        texts = list(dict.fromkeys(t for e in pairs for t in (e.query, e.positive, *e.negatives)))
        items = [{"input_ids": ids, "token_type_ids": [0] * len(ids)} for ids in adapter._encode(texts)]
        base_collate, unit = PadCollator(pad_id(tok)), "texts"
    else:
        if not pairs[0].negatives:
            raise ConfigError(f"--method margin_mse needs (query, positive, negative) rows and {d.train} has no "
                              f"negative; add a \"negative\" to every row (e.g. mined: finetune --hard-negatives)")
        triples = [PairExample(e.query, e.positive, (n,), e.id, None if e.scores is None else
                               (e.scores[0], e.scores[1 + k])) for e in pairs for k, n in enumerate(e.negatives)]
        enc = adapter.load_examples(triples)
        items = list(enc)
        if cross:  # the cross-encoder reads [CLS] query [SEP] passage [SEP] for the positive and the negative
            for it, e in zip(items, triples):
                both = encode_texts(tok, [e.query, e.query], [e.positive, e.negatives[0]], d.max_seq_len)
                it["pair_input_ids"] = [x.ids for x in both]
                it["pair_token_type_ids"] = [x.type_ids for x in both]
        base_collate, unit = adapter.collator(), "triples"
    if cross:
        teachers = [apply_kernels(load_pretrained(t, head="sequence_classification", strict_head=True),
                                  recipe.impl.kernels) for t in teacher_dirs]
    else:
        teachers = [apply_kernels(load_pretrained(t, head="base"), recipe.impl.kernels) for t in teacher_dirs]
    eval_ds = adapter.load(d.eval, d.max_eval_samples) if d.eval else None
    return Data(teachers=teachers, tokenizer=tok, head="base", head_config={}, items=items,
                base_collate=base_collate, eval_ds=eval_ds, adapter=adapter, task=task, task_spec={},
                counts={"read": len(pairs), "read_unit": "pairs", "items": len(items), "item_unit": unit,
                        "max_seq_len": d.max_seq_len}, pooling=pooling, cross_encoder=cross)


def _augment(args, opts: Options, examples: list, tok, teacher, seed: int) -> tuple:
    """TinyBERT's data augmentation (Jiao et al. 2020 §3.3): ``opts.copies`` rewritten copies of every
    example. Returns (examples with the copies, the settings applied for recipe.yaml)."""
    from ...distill.augment import augment_examples, default_augmenter
    from ...checkpoint.read import load_pretrained
    aug_cfg = opts.augment
    record = {**aug_cfg, "copies": opts.copies, "prob": args.augment_prob if args.augment_prob is not None
              else aug_cfg.get("prob", 0.4)}
    mlm_model = None
    if opts.augment_mlm:
        mlm_model = apply_kernels(load_pretrained(opts.augment_mlm), "auto")  # speed only
        record["mlm"] = opts.augment_mlm
    else:
        record.pop("mlm", None)
        sys.stderr.write("bertforge distill: note: --augment without --augment-mlm replaces every word "
                         "by its nearest neighbours in the teacher's embeddings; TinyBERT draws "
                         "single-piece words from a masked LM's predictions: pass --augment-mlm DIR\n")
    augmenter = default_augmenter(tok, teacher, corpus_examples=examples, p=record["prob"],
                                  k=aug_cfg.get("top_k", 15), swap_prob=aug_cfg.get("swap_prob", 0.0),
                                  seed=seed, mlm_model=mlm_model)
    return augment_examples(examples, augmenter, opts.copies), record


def _corpus_data(args, recipe, teacher_dirs, tok, inputs) -> Data:
    """Teachers (a pretraining checkpoint with its MLM head) and fixed-length sequences of the corpus."""
    from ...data.collate import PadCollator
    from ...distill.data import corpus_sequences
    from ...distill.distiller import has_mlm_head, mlm_head_name
    from ...checkpoint.read import MLM_HEADS, load_pretrained, read_config, saved_head_name
    from ...tokenizer import pad_id
    d = recipe.data
    corpus = args.corpus or d.corpus
    if not corpus:
        raise ConfigError("--stage general needs --corpus FILE [FILE …] (raw text)")
    corpus = d.corpus = inputs.data_paths("--corpus", corpus, given=args.corpus is not None)
    # a pretraining checkpoint (BertForPreTraining: MLM + NSP, ALBERT's MLM + SOP…) teaches with its MLM head
    teachers = [apply_kernels(load_pretrained(t, head=mlm_head_name() if saved_head_name(read_config(t)) in MLM_HEADS
                                              else None), recipe.impl.kernels) for t in teacher_dirs]
    head = mlm_head_name() if has_mlm_head(teachers[0]) else "base"
    pooling = None
    if getattr(args, "method", None) == "embedding_mse":  # the student embeds as the teacher: no MLM head
        from ...models.pooling import read_pooling
        head, pooling = "base", read_pooling(teacher_dirs[0])
    items = corpus_sequences(corpus, tok, d.max_seq_len, d.max_train_samples)
    return Data(teachers=teachers, tokenizer=tok, head=head, head_config={}, items=items,
                base_collate=PadCollator(pad_id(tok)),
                counts={"read": len(items), "read_unit": "sequences", "items": len(items), "item_unit": "sequences",
                        "max_seq_len": d.max_seq_len}, pooling=pooling)


# ------------------------------------------------------------------------------------------- student
def build_student_model(opts: Options, data: Data, teacher_dirs, seed: int, notes: bool = True):
    """The student (:func:`bertforge.distill.student.build_student`), seeded so that its fresh weights are
    the same in every run and on every rank; its head follows the teacher's. ``notes``: say which weights
    start fresh (not on ``--resume``, whose checkpoint replaces them)."""
    from ...distill.student import build_student
    from ...engine.train.rng import set_seed
    set_seed(seed)
    return build_student(opts.student, data.teachers[0], head=data.head, head_config=data.head_config,
                         teacher_dir=str(teacher_dirs[0]), notes=notes)


# -------------------------------------------------------------------------------------------- losses
def choose_losses(args, opts: Options, teacher, teacher_dirs, student) -> Losses:
    """The loss terms: an explicit ``--method``'s own, else the recipe's ``losses`` list, else the method's;
    checked against the teacher (MLM terms need its MLM head) and against the flags that tune them.

    Raises:
        ConfigError: no term left without an MLM head; a flag no term reads; an mlm term with no masking.
    """
    from ...distill.distiller import MLM_LOSSES, build_terms, has_mlm_head, method_terms
    from ...errors import require_number
    ds, stage, method = opts.section, opts.stage, opts.method
    # an explicit --method names its own loss terms (Hinton KD, DistilBERT, …); a recipe's losses list is the
    # recipe's method, so it applies only when --method is not given
    overridden = bool(args.method and ds.get("losses") and ds.get("method") != args.method)
    entries = ds["losses"] if (ds.get("losses") and not overridden) else method_terms(method, stage)
    if overridden:
        sys.stderr.write(f"bertforge distill: note: --method {args.method} replaces the recipe's losses list"
                         f"{' (method ' + str(ds['method']) + ')' if ds.get('method') else ''}\n")
    if stage == "general" and not has_mlm_head(teacher):  # the student's head follows the teacher's
        dropped = [e for e in entries if e.get("loss") in MLM_LOSSES]
        entries = [e for e in entries if e.get("loss") not in MLM_LOSSES]
        if dropped and not entries:
            raise ConfigError(f"--method {method} in the general stage needs an MLM head on the teacher, and "
                              f"{teacher_dirs[0]} has none; use --method tinybert or minilm")
        if dropped:
            sys.stderr.write(f"bertforge distill: warning: {teacher_dirs[0]} has no MLM head, so the "
                             f"{' and '.join(e['loss'] for e in dropped)} term(s) of --method {method} are "
                             f"dropped; training uses {', '.join(e.get('loss', '?') for e in entries)} only\n")
    terms = build_terms(entries, student.config.num_hidden_layers, teacher.config.num_hidden_layers,
                        temperature=opts.temperature, alpha=opts.alpha,
                        layer_map=args.layer_map or ds.get("layer_map"))
    _check_flags_used(args, entries, method, stage)
    # masked-LM terms read MLM-corrupted inputs: BERT's 15% unless set (Devlin et al. 2019 §3.1; Sanh et al. §3)
    reads_mlm = stage == "general" and any(e.get("loss") in MLM_LOSSES for e in entries)
    mlm_p = args.mlm_prob if args.mlm_prob is not None else ds.get("mlm_probability",
                                                                    0.15 if reads_mlm else 0.0)
    require_number("--mlm-prob / distill.mlm_probability", mlm_p, 0, 1, open_high=True,
                   note="the fraction of input tokens corrupted")
    mlm_p = float(mlm_p)
    if mlm_p == 0 and any(e.get("loss") == "mlm" for e in entries):
        raise ConfigError("the mlm term predicts masked tokens, but --mlm-prob / distill.mlm_probability is 0; "
                          "set it above 0 (BERT: 0.15) or drop the mlm term")
    return Losses(entries=entries, terms=terms, mlm_probability=mlm_p)


def wants_teacher_cache(args, opts: Options, recipe, data: Data, losses: Losses) -> bool:
    """Whether the teacher's outputs are cached on disk: they pay off only when examples are seen again
    (more than one epoch) with fixed inputs (no MLM corruption) and per-example logits (no token task)."""
    tr = recipe.train
    seen = (tr.max_steps * tr.batch_size * tr.grad_accum_steps) if tr.max_steps else tr.epochs * len(data.items)
    use = not args.no_cache and opts.section.get("cache", True) and losses.mlm_probability == 0 \
        and seen > len(data.items)
    if opts.stage == "task" and data.token_task:
        use = False  # the teacher cache stores (C,) logits per example; token tasks have (T, C)
    return use


def distill_collator(data: Data, losses: Losses):
    """Pads a batch and, in the general stage, MLM-corrupts it for the masked-LM terms."""
    from ...distill.data import DistillCollator
    from ...tokenizer import special_tokens
    tok = data.tokenizer
    sp = special_tokens(tok)
    mlm_p = losses.mlm_probability
    return DistillCollator(data.base_collate, mlm_p, tok.token_to_id(sp.get("mask", "[MASK]")) if mlm_p else None,
                           data.teachers[0].config.vocab_size,
                           tuple(tok.token_to_id(sp[r]) for r in ("cls", "sep", "pad") if r in sp))


# ----------------------------------------------------------------------------------------- recording
def record_run(args, opts: Options, recipe, data: Data, losses: Losses, student, teacher_dirs) -> None:
    """What this run used, in the student's ``config.json`` and in ``recipe.yaml`` (so that ``--recipe
    RUN/recipe.yaml`` repeats it; CLI flags win over the section)."""
    ds, terms = opts.section, losses.terms
    teachers = [str(Path(t).resolve()) for t in teacher_dirs]
    student.config.bertforge = {**student.config.bertforge, "max_seq_len": recipe.data.max_seq_len,
                                "distill": {"method": opts.method, "stage": opts.stage, "teachers": teachers,
                                            "losses": [{"loss": t.loss, "weight": t.weight, "pairs": t.pairs,
                                                        "temperature": t.temperature, "alpha": t.alpha}
                                                       for t in terms]}}
    if data.task is not None:
        student.config.bertforge["task"] = data.task.name
        student.config.bertforge["task_spec"] = data.task_spec
    section = {**ds, "method": opts.method, "stage": opts.stage, "student": opts.student, "teachers": teachers,
               "losses": [_applied(e, t, args.layer_map or ds.get("layer_map"))
                          for e, t in zip(losses.entries, terms)]}
    if opts.stage == "general":
        section["mlm_probability"] = losses.mlm_probability
    for key, value in (("temperature", opts.temperature), ("alpha", opts.alpha), ("augment", data.augment_record)):
        if value is not None:
            section[key] = value
        elif key == "augment":
            section.pop("augment", None)
    recipe.extra["distill"] = section


def check_teacher_cache_dir(args, out: Path, inputs: tuple) -> None:
    """``--cache-dir``: not with ``--no-cache``, and a place :func:`check_cache_dir` accepts."""
    if args.cache_dir is None:
        return
    if args.no_cache:
        raise ConfigError("--cache-dir names a teacher cache and --no-cache turns it off; pass one of them")
    from ...distill.cache import is_cache_dir
    check_cache_dir(Path(args.cache_dir), out, inputs, reuse_hint="an earlier distill run's teacher_cache",
                    kind="a teacher cache", is_cache=is_cache_dir, inside_out=True)


def source_fingerprints(teacher_dirs, student_spec: str, inputs=None, teacher_specs=None) -> dict:
    """The input model dirs by flag, fingerprinted, so that ``--resume`` refuses other ones; ``inputs``
    (:class:`bertforge.pipelines.sources.Sources`) records them for ``recipe.yaml`` too (``teacher_specs``:
    the teachers as given, ``minilm`` or a hub id kept by name)."""
    from ...pipelines.sources import Sources, numbered
    inputs = inputs if inputs is not None else Sources(None)
    specs = list(teacher_specs or teacher_dirs)
    sources = {numbered("--teacher", i, len(teacher_dirs)): inputs.record_model(
        numbered("--teacher", i, len(teacher_dirs)), spec, t) for i, (spec, t) in enumerate(zip(specs, teacher_dirs))}
    if Path(student_spec).is_dir():
        sources["--student"] = inputs.record_model("--student", student_spec, student_spec)
    return sources


# ----------------------------------------------------------------------------------- distiller, train
def build_distiller(args, opts: Options, recipe, data: Data, losses: Losses, student, teacher_dirs, work: Path,
                    use_cache: bool) -> tuple:
    """The :class:`~bertforge.distill.distiller.Distiller` (student + frozen teachers + projections W, an
    earlier stage's W loaded where the shapes match) and its teacher cache (or None)."""
    from ...distill.distiller import Distiller
    distiller = Distiller(student, data.teachers, losses.terms)
    if data.pooling is not None:  # sentence embeddings: pooled as the teacher pools; margins by its similarity
        distiller.pooling, distiller.cross_encoder = data.pooling.mode, data.cross_encoder
        distiller.normalize = bool(data.pooling.normalize) and not data.cross_encoder
        distiller.margin_sim = "cos" if (data.pooling.normalize and not data.cross_encoder) else "dot"
        if data.adapter is not None:
            data.adapter.settings.similarity = distiller.margin_sim if opts.method == "margin_mse" else "cos"
    if Path(opts.student).is_dir():  # an earlier stage's W (TinyBERT: general → task)
        from ...distill.distiller import PROJECTIONS_FILE
        fresh = sorted(set(distiller.proj) - set(distiller.load_projections(opts.student)))
        if fresh and (Path(opts.student) / PROJECTIONS_FILE).is_file() and not args.resume:
            sys.stderr.write(f"bertforge distill: note: {opts.student}/{PROJECTIONS_FILE} has no W of this "
                             f"shape for {', '.join(fresh)} (another teacher width or loss); "
                             f"initialised fresh\n")
    cache = None
    if use_cache:
        from ...distill.cache import TeacherCache
        max_len = recipe.data.max_seq_len
        root = Path(args.cache_dir) if args.cache_dir else work / "teacher_cache"
        shapes = distiller.cache_shapes(max_len)
        fp = _fingerprint(teacher_dirs, data.items, max_len, shapes)
        if data.pooling is not None:  # the cached embeddings are pooled (and normalised or not) this way
            fp["pooling"] = [distiller.pooling, distiller.normalize]
        cache = TeacherCache(root, len(data.items), shapes, fp)
        distiller.cache = cache
    return distiller, cache


def _embedding_files(data: Data, student, dst) -> None:
    """An embedding student's dir is an embedding dir: the teacher's pooling, in the sentence-transformers
    layout (:func:`bertforge.models.pooling.write_pooling`)."""
    if data.pooling is None:
        return
    from ...models.pooling import write_pooling
    write_pooling(dst, data.pooling.mode, data.pooling.normalize, hidden_size=student.config.hidden_size,
                  max_seq_length=data.pooling.max_seq_length)


def train(distiller, dataset, collate, recipe, work: Path, data: Data, teacher_dirs, sources: dict,
          resume: bool) -> dict:
    """Train on the one Trainer, scoring the student on the task's evaluation data; each checkpoint is the
    student (HF layout, the teacher's tokenizer) plus the projections W."""
    from ...engine.train.trainer import Trainer
    from ...pipelines.report import CollapseWarning, print_training_plan
    if data.eval_ds is not None and recipe.train.metric_for_best is None:
        recipe.train.metric_for_best = data.task.metrics[0]
    eval_fn = CollapseWarning("distill", data.task, lambda m: data.adapter.evaluate(m.student, data.eval_ds),
                              step=lambda: trainer.step) if data.eval_ds is not None else None
    trainer = Trainer(distiller, dataset, collate, recipe, work, eval_fn=eval_fn,
                      save_fn=lambda m, dst: (m.student.save_pretrained(dst, tokenizer_dir=teacher_dirs[0]),
                                              m.save_projections(dst), _embedding_files(data, m.student, dst)),
                      sources=sources)
    if data.counts:
        print_training_plan("distill", data.counts, trainer)
    return trainer.fit(resume=resume)


# ------------------------------------------------------------------------------------------- static
def run_static(args) -> int:
    """``distill --method static``: the teacher's vocabulary → a static embedding dir
    (:mod:`bertforge.distill.static`). Every check — one teacher with a tokenizer, ``--dim`` within its
    width, no flag of the training methods — runs before anything is written."""
    from ...distill.static import REMOVE_TOP, check_teacher_tokenizer, distill_static
    from ...checkpoint.read import load_pretrained
    from ...models.static import save_static, static_config
    from ...tokenizer import load_tokenizer, pad_id
    if not args.teacher or len(args.teacher) != 1:
        raise ConfigError("--method static distils one teacher; pass --teacher DIR once")
    training = {"--student": args.student, "--stage": args.stage, "--task": args.task, "--train": args.train,
                "--eval": args.eval, "--corpus": args.corpus, "--augment": args.augment, "--recipe": args.recipe,
                "--resume": args.resume, "--layer-map": args.layer_map, "--temperature": args.temperature}
    used = [f for f, v in training.items() if v]
    if used or args.overrides:
        raise ConfigError(f"{(used or ['KEY=VALUE overrides'])[0]} is an option of the training methods; "
                          f"--method static takes --teacher, --dim, --sif-coefficient, --remove-top, --batch-size "
                          f"and --out")
    teacher_dir = resolve_model_dir(args.teacher[0])
    if not teacher_dir.is_dir():
        raise ConfigError(f"--teacher {args.teacher[0]} is not a checkpoint directory; pass the dir of a "
                          f"sentence encoder (config.json, weights, tokenizer) or 'minilm'")
    check_teacher_tokenizer(teacher_dir)
    dim = 256 if args.dim is None else args.dim
    a = 1e-4 if args.sif_coefficient is None else args.sif_coefficient
    if not 0 < a < 1:
        raise ConfigError(f"--sif-coefficient {a}: pass a value in (0, 1) (model2vec: 1e-4)")
    remove_top = REMOVE_TOP if args.remove_top is None else args.remove_top
    if remove_top < 0:
        raise ConfigError(f"--remove-top {remove_top}: pass a number of components ≥ 0 (0: none removed)")
    teacher = load_pretrained(teacher_dir, notes=False)
    if not 1 <= dim <= teacher.config.hidden_size:
        raise ConfigError(f"--dim {dim} is not in 1 … {teacher.config.hidden_size} (the teacher's "
                          f"{teacher.config.hidden_size} dimensions); pass a dimension in that range")
    tok = load_tokenizer(teacher_dir)
    run_dir = RunDir(args.out, inputs=(teacher_dir,), overwrite=args.overwrite)
    if args.seed is not None:
        import torch
        torch.manual_seed(args.seed)
    with run_dir as work:
        table, rec = distill_static(teacher, tok, dim, a, batch_size=args.batch_size or 1024,
                                    progress=not (args.no_progress or os.environ.get("BERTFORGE_NO_PROGRESS")),
                                    remove_top=remove_top)
        rec["teacher"] = str(teacher_dir)
        save_static(work, table, teacher_dir, static_config(table.shape[0], dim, pad_id(tok), rec))
    print_json({"out": str(run_dir.out), "method": "static", "teacher": str(teacher_dir),
                "table": list(table.shape), "teacher_params": sum(p.numel() for p in teacher.parameters()),
                **{k: v for k, v in rec.items() if k not in ("method", "teacher")}})
    return 0
