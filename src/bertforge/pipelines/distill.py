"""Distillation from Python: :func:`distill` (what ``bertforge distill`` runs) — a teacher (or several,
their soft targets averaged) taught to a smaller student on the one Trainer (KD, Hinton et al. 2015 §2;
DistilBERT, Sanh et al. 2019 §2–3; BERT-PKD, Sun et al. 2019 §3; TinyBERT, Jiao et al. 2020 §3; MiniLM, Wang
et al. 2020 §3; embedding and margin distillation for search, Reimers & Gurevych 2020, Hofstätter et al.
2020), into a run folder that holds the student, ``recipe.yaml`` and ``metrics.jsonl``; or, with
``method="static"``, a static embedding table (:mod:`bertforge.pipelines.distill_static`). docs/distill.md.

    >>> import bertforge
    >>> r = bertforge.distill("runs/sst2", "layers:0,2,4", "runs/sst2-kd3", task="sst2", train="train.tsv",
    ...                       eval="dev.tsv", method="kd", temperature=2, alpha=0.5)
    >>> r.out, r.metrics["accuracy"], r.metrics["student_params"]

The steps: options → teachers → data → student → losses → run dir → distiller → train. Every check runs
before anything is written; the run folder is a :class:`~bertforge.pipelines.rundir.RunDir`. The teachers,
data and student are built in :mod:`bertforge.pipelines.distill_data`.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ConfigError
from .distill_data import Data, build_data, build_student_model, resolve_teachers
from .finetune import TrainResult
from .recipe import build_recipe, check_flags_agree
from .outputs import check_cache_dir
from .rundir import RunDir
from .options import options_from, python_names


@dataclass
class DistillOptions:
    """Options of :func:`distill` — the flags of ``bertforge distill`` with ``_`` for ``-``, same defaults
    (None: the recipe's, the teacher's or the method's). ``teacher``: one or more checkpoint dirs (or
    ``minilm``); ``corpus``: one or more text files; ``overrides``: recipe ``key=value`` strings
    (``distill.temperature=2``, ``train.lr=1e-4``)."""

    out: Optional[str] = None
    teacher: Optional[list] = None
    student: Optional[str] = None
    method: Optional[str] = None
    dim: Optional[int] = None
    sif_coefficient: Optional[float] = None
    remove_top: Optional[int] = None
    stage: Optional[str] = None
    task: Optional[str] = None
    train: Optional[str] = None
    eval: Optional[str] = None
    corpus: Optional[list] = None
    max_seq_len: Optional[int] = None
    max_train_samples: Optional[int] = None
    temperature: Optional[float] = None
    alpha: Optional[float] = None
    layer_map: Optional[str] = None
    augment: Optional[int] = None
    augment_prob: Optional[float] = None
    augment_mlm: Optional[str] = None
    mlm_prob: Optional[float] = None
    no_cache: bool = False
    cache_dir: Optional[str] = None
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


def distill(teacher, student, out, **options) -> TrainResult:
    """Distil ``teacher`` (a checkpoint dir or ``"minilm"``; a list for several teachers) into ``student``
    (a shape ``4L-312H-12A-1200I``, ``FAMILY:SHAPE``, ``layers:0,2,4`` copied from the teacher, or a
    checkpoint dir such as an earlier stage or a pruned model; None with ``method="static"`` or when the
    ``recipe`` records it), into the run folder ``out``; ``options``: the other fields of
    :class:`DistillOptions` (``task``/``train``/``eval`` for the task stage, ``corpus`` for the general one,
    ``method``, ``temperature``, ``alpha``, ``augment`` …, every Trainer option).

    Returns:
        :class:`TrainResult`: ``out`` and ``metrics`` — ``stage``, ``method``, ``student``, ``student_params``,
        ``teacher_params`` (all teachers together: the ensemble the student replaces; ``teacher_params_each``
        per teacher) and the Trainer's result (``step``, ``best``, the last evaluation's metrics …);
        for ``method="static"`` the table's record (``table`` shape, ``teacher_params`` …).

    Raises:
        ConfigError / DataError / CheckpointError: one line naming what to change (checked before anything
            is written; an unknown option before torch loads)."""
    teachers = [teacher] if isinstance(teacher, (str, Path)) else list(teacher or [])
    opts = options_from(DistillOptions, "distill", dict(student=student, out=out, **options),
                        teacher=[str(t) for t in teachers] or None)
    with python_names(DistillOptions):
        return distill_with(opts)


def distill_with(opts: DistillOptions) -> TrainResult:
    """:func:`distill` from a complete :class:`DistillOptions` (what the verb builds from its flags)."""
    _normalise(opts)
    if opts.method == "static":  # DISTILL_TABLE_METHODS: one embedding table, no training
        from .distill_static import run_static
        out, record = run_static(opts)
        return TrainResult(Path(out), record)
    from .distill_static import check_static_options
    check_static_options(opts)
    record = _run(opts)
    return TrainResult(Path(record.pop("out")), record)


def _normalise(opts: DistillOptions) -> None:
    """Paths as strings, one teacher or corpus file as a list of one (what the parsed flags hold)."""
    for name in ("teacher", "corpus"):
        value = getattr(opts, name)
        if isinstance(value, (str, Path)):
            setattr(opts, name, [value])
        if getattr(opts, name):
            setattr(opts, name, [str(v) for v in getattr(opts, name)])
    for name in ("out", "student", "train", "eval", "augment_mlm", "cache_dir", "recipe"):
        if isinstance(getattr(opts, name), Path):
            setattr(opts, name, str(getattr(opts, name)))


@dataclass
class Settings:
    """What the options and the recipe's ``distill`` section ask for, checked (options win)."""
    section: dict              # the recipe's distill section as given
    stage: str                 # "task" (labelled data) or "general" (raw text)
    method: str                # kd | distilbert | pkd | tinybert | minilm | embedding_mse | margin_mse | inbatch_kl
    student: str               # shape, layers:…, or a checkpoint dir
    temperature: Optional[float]
    alpha: Optional[float]
    augment: dict              # the recipe's distill.augment
    copies: int                # augmented copies per training example (0: none)
    augment_mlm: Optional[str]  # masked LM whose predictions replace words
    cross_vocabulary: bool = False  # a student dir of another vocabulary (pooled embedding methods only)


@dataclass
class Losses:
    """The loss terms the distiller trains, as the recipe lists them (``entries``) and built (``terms``)."""
    entries: list
    terms: list
    mlm_probability: float     # share of input tokens MLM-corrupted (general stage)


def _run(opts: DistillOptions) -> dict:
    """options → teachers → data → student → losses → run dir → distiller → train; returns the record the
    verb prints (``out`` first)."""
    from ..distillation.data import IndexedDataset
    from .sources import Sources, require
    recipe = build_recipe(opts, extra_sections=("distill",))
    prov = Sources(recipe, opts.recipe)  # the inputs the recipe recorded; those this run reads
    opts.teacher = require(prov.model_specs("--teacher", opts.teacher),
                           "no teacher given; pass --teacher DIR (a checkpoint dir, or 'minilm'), or --recipe "
                           "RUN/recipe.yaml of an earlier run")
    prov.model_spec("--student", opts.student, fallback=(recipe.extra.get("distill") or {}).get("student"))
    settings = read_settings(opts, recipe)
    if Path(settings.student).is_dir():  # recorded resolved: the recipe re-runs from any working directory
        settings.student = str(Path(settings.student).resolve())
    teacher_dirs = resolve_teachers(opts, settings, recipe, prov)
    data = build_data(opts, settings, recipe, teacher_dirs, prov)
    student = build_student_model(settings, data, teacher_dirs, recipe.train.seed, notes=not opts.resume)
    losses = choose_losses(opts, settings, data.teachers[0], teacher_dirs, student)
    use_cache = wants_teacher_cache(opts, settings, recipe, data, losses)
    collate = distill_collator(data, losses)
    # embedding_mse: every item is one independent text (a query or a passage): batches of similar length
    dataset = IndexedDataset(data.items, group_by_length=settings.method == "embedding_mse")
    record_run(opts, settings, recipe, data, losses, student, teacher_dirs)

    out = Path(opts.out)
    inputs = (*teacher_dirs, *([settings.student] if Path(settings.student).is_dir() else []))
    check_teacher_cache_dir(opts, out, inputs)
    run_dir = RunDir(out, inputs=inputs, overwrite=opts.overwrite, resume=opts.resume)
    sources = source_fingerprints(teacher_dirs, settings.student, prov, opts.teacher)
    if settings.augment_mlm:
        prov.record_model("--augment-mlm", settings.augment_mlm, settings.augment_mlm)
    prov.record(recipe)  # recipe.yaml: what the run read, so that the recipe alone re-runs it
    if opts.resume:
        from .resume_policy import check_resume
        check_resume(out, len(dataset), recipe.train, sources, recipe)  # before anything is written
    with run_dir as work:
        distiller, cache = build_distiller(opts, settings, recipe, data, losses, student, teacher_dirs, work,
                                           use_cache)
        result = train(distiller, dataset, collate, recipe, work, data, teacher_dirs, sources, opts.resume)
        if cache is not None:
            cache.flush()
        if hasattr(data.adapter, "configure_loss") and settings.stage == "task":  # multi-label: own thresholds
            from ..tasks.multilabel import save_thresholds
            result["thresholds"] = save_thresholds(work, data.adapter, recipe.data, data.eval_ds, result)
    each = [sum(p.numel() for p in t.parameters()) for t in data.teachers]
    return {"out": str(out), "stage": settings.stage, "method": settings.method, "student": settings.student,
            "student_params": sum(p.numel() for p in student.parameters()),
            "teacher_params": sum(each), "teacher_params_each": each, **result}


# ------------------------------------------------------------------------------------------- options
#: values of ``distill.projection_init`` (see :func:`start_projections`)
PROJECTION_INITS = ("lstsq", "orthogonal", "random")

#: keys of the recipe's ``distill`` section
SECTION_KEYS = {"method", "stage", "student", "losses", "temperature", "alpha", "layer_map", "augment",
                "cache", "mlm_probability", "teachers", "mine_negatives", "projection_init"}

#: keys of the recipe's ``distill.augment`` mapping
AUGMENT_KEYS = {"copies", "prob", "top_k", "swap_prob", "mlm"}


def _distill_section(recipe) -> dict:
    d = dict(recipe.extra.get("distill") or {})
    bad = set(d) - SECTION_KEYS
    if bad:
        raise ConfigError(f"unknown recipe keys distill.{sorted(bad)[0]}; valid: {', '.join(sorted(SECTION_KEYS))}")
    return d


def read_settings(opts, recipe) -> Settings:
    """Stage, method, student, temperature, alpha and augmentation from the options over the recipe.

    Raises:
        ConfigError: an option of the other stage, an unknown method or stage, a missing or malformed
            student, T ≤ 0, α outside [0, 1], augmentation options that do not apply, an unknown recipe key.
    """
    ds = _distill_section(recipe)
    if ds.get("projection_init", "lstsq") not in PROJECTION_INITS:
        raise ConfigError(f"distill.projection_init={ds['projection_init']!r}: use lstsq (fit each sentence-embedding "
                          f"projection W to the teacher before training, the default), orthogonal (the frozen "
                          f"rotation nearest the teacher) or random")
    check_flags_agree(opts, "distill", {
        "stage": ("--stage", opts.stage), "method": ("--method", opts.method), "student": ("--student", opts.student),
        "temperature": ("--temperature", opts.temperature), "alpha": ("--alpha", opts.alpha),
        "mlm_probability": ("--mlm-prob", opts.mlm_prob), "layer_map": ("--layer-map", opts.layer_map)})
    stage = opts.stage or ds.get("stage") or ("general" if opts.corpus else "task")
    _check_stage_options(opts, stage)
    method = opts.method or ds.get("method") or ("tinybert" if stage == "general" else "kd")
    _check_method(method, stage)
    student_spec = opts.student or ds.get("student")
    if not student_spec:
        raise ConfigError("no student given; pass --student 4L-312H-12A-1200I, layers:0,2,4 or a checkpoint dir")
    if Path(student_spec).is_file():
        raise ConfigError(f"--student {student_spec} is a file; pass a checkpoint dir, a shape like "
                          f"4L-312H-12A-1200I, or layers:0,2,4")
    temperature = opts.temperature if opts.temperature is not None else ds.get("temperature")
    alpha = opts.alpha if opts.alpha is not None else ds.get("alpha")
    if temperature is not None and not 0 < float(temperature) < float("inf"):
        raise ConfigError(f"--temperature {temperature} must be a finite number > 0 (soft targets are "
                          f"softmax(z / T))")
    if alpha is not None and not 0.0 <= float(alpha) <= 1.0:
        raise ConfigError(f"--alpha {alpha} must be in [0, 1] (weight of the soft loss)")
    aug_cfg, n_aug = _augment_settings(opts, ds, stage)
    from ..checkpoint.modeldir import EMBEDDED, resolve
    if student_spec.lower() in EMBEDDED and not Path(student_spec).exists():  # the shipped all-MiniLM-L6-v2
        student_spec = str(resolve(student_spec))
    _check_student_spec(student_spec)
    return Settings(section=ds, stage=stage, method=method, student=student_spec, temperature=temperature,
                    alpha=alpha, augment=aug_cfg, copies=n_aug, augment_mlm=opts.augment_mlm or aug_cfg.get("mlm"))


def _check_stage_options(opts, stage: str) -> None:
    """ConfigError for an unknown stage, or data options of the other stage."""
    if stage not in ("task", "general"):  # DISTILL_STAGES
        raise ConfigError(f"unknown stage {stage!r}; choose task (labelled data) or general (raw text)")
    task_opts = [f for f, v in (("--task", opts.task), ("--train", opts.train), ("--eval", opts.eval)) if v]
    if stage == "general" and task_opts:
        raise ConfigError(f"{task_opts[0]} belongs to --stage task (labelled data) and the general stage reads "
                          f"--corpus only; drop {task_opts[0]} or pass --stage task")
    if stage == "task" and opts.corpus:
        raise ConfigError("--corpus (raw text) belongs to --stage general and the task stage reads --train "
                          "FILE; drop --corpus or pass --stage general")


def _check_method(method: str, stage: str) -> None:
    """ConfigError for a method no registry entry names (:data:`bertforge.distillation.distiller.METHODS`, user
    entries included), and for margin_mse / inbatch_kl on raw text."""
    from ..distillation.distiller import METHODS
    if method not in METHODS:
        raise ConfigError(f"unknown distillation method {method!r}; choose one of {', '.join(METHODS)} or static")
    if method in _READS_ROWS and stage == "general":
        raise ConfigError(f"--method {method} distils {_READS_ROWS[method]}: pass --task retrieval --train FILE"
                          f"{' of (query, positive[, negative]) rows' if method == 'inbatch_kl' else ''}, not --corpus")


#: methods that read (query, positive[, negative]) rows, never raw text: what each distils
_READS_ROWS = {"margin_mse": "score margins of (query, positive, negative) triples",
               "inbatch_kl": "each query's scores over a batch of passages"}


def _augment_settings(opts, ds: dict, stage: str) -> tuple:
    """(the recipe's ``distill.augment`` mapping, augmented copies per example), checked against the
    stage and the other augmentation options."""
    if opts.augment is not None and opts.augment < 0:
        raise ConfigError(f"--augment {opts.augment} must be ≥ 0 (augmented copies per example)")
    if stage == "general" and (opts.augment or opts.augment_prob is not None):
        raise ConfigError("--augment / --augment-prob rewrite labelled task examples and apply to --stage task "
                          "only; drop them for the general stage")
    if opts.augment_prob is not None and not opts.augment and not (ds.get("augment") or {}).get("copies"):
        raise ConfigError("--augment-prob sets the word-replacement rate of --augment N; pass --augment N too")
    aug_cfg = dict(ds.get("augment") or {})
    bad = set(aug_cfg) - AUGMENT_KEYS
    if bad:
        raise ConfigError(f"unknown recipe key distill.augment.{sorted(bad)[0]}; valid: "
                          f"{', '.join(sorted(AUGMENT_KEYS))}")
    n_aug = opts.augment if opts.augment is not None else aug_cfg.get("copies", 0)
    if opts.augment_mlm and (stage == "general" or not n_aug):
        raise ConfigError("--augment-mlm picks the masked LM of --augment N (task stage); pass --augment N too"
                          if stage == "task" else "--augment-mlm applies to --stage task only; drop it")
    return aug_cfg, n_aug


def _check_student_spec(student_spec: str) -> None:
    """A student that is neither ``layers:…`` nor an existing dir must be a shape (``FAMILY:SHAPE`` with a
    known family): a malformed one is reported before any model is loaded."""
    if student_spec.startswith("layers:") or Path(student_spec).exists():
        return
    if "/" in student_spec or "\\" in student_spec or student_spec.startswith("."):
        raise ConfigError(f"--student {student_spec}: no such checkpoint dir; give an existing dir (e.g. a "
                          f"pruned model), a shape like 4L-312H-12A-1200I, or layers:0,2,4")
    from ..config import FAMILIES
    from ..distillation.student import parse_shape
    family, sep, shape = student_spec.partition(":")
    if sep and family.strip().lower() not in FAMILIES:
        raise ConfigError(f"--student {student_spec}: {family!r} is no model family; write FAMILY:SHAPE with "
                          f"one of {', '.join(FAMILIES)} (e.g. modernbert:4L-384H-6A-576I)")
    if family.strip().lower() == "mobilebert":  # its defaults are the teacher's: checked when the student is built
        return
    parse_shape(shape if sep else student_spec)


# -------------------------------------------------------------------------------------------- losses
def choose_losses(opts, settings: Settings, teacher, teacher_dirs, student) -> Losses:
    """The loss terms: an explicit ``method`` option's own, else the recipe's ``losses`` list, else the
    method's; checked against the teacher (MLM terms need its MLM head) and against the options that tune
    them.

    Raises:
        ConfigError: no term left without an MLM head; an option no term reads; an mlm term with no masking.
    """
    from ..distillation.distiller import MLM_LOSSES, build_terms, has_mlm_head, method_terms
    from ..errors import require_number
    ds, stage, method = settings.section, settings.stage, settings.method
    # an explicit --method names its own loss terms (Hinton KD, DistilBERT, …); a recipe's losses list is the
    # recipe's method, so it applies only when --method is not given
    overridden = bool(opts.method and ds.get("losses") and ds.get("method") != opts.method)
    entries = ds["losses"] if (ds.get("losses") and not overridden) else method_terms(method, stage)
    if overridden:
        sys.stderr.write(f"bertforge distill: note: --method {opts.method} replaces the recipe's losses list"
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
                        temperature=settings.temperature, alpha=settings.alpha,
                        layer_map=opts.layer_map or ds.get("layer_map"))
    _check_options_used(opts, entries, method, stage)
    for term in terms:  # what the models lack for a term (e.g. feature maps of another width), before any output
        problem = term.feature.check(term.loss, student, teacher) if term.feature.check is not None else None
        if problem:
            raise ConfigError(problem)
    # masked-LM terms read MLM-corrupted inputs: BERT's 15% unless set (Devlin et al. 2019 §3.1; Sanh et al. §3)
    reads_mlm = stage == "general" and any(e.get("loss") in MLM_LOSSES for e in entries)
    mlm_p = opts.mlm_prob if opts.mlm_prob is not None else ds.get("mlm_probability",
                                                                    0.15 if reads_mlm else 0.0)
    require_number("--mlm-prob / distill.mlm_probability", mlm_p, 0, 1, open_high=True,
                   note="the fraction of input tokens corrupted")
    mlm_p = float(mlm_p)
    if mlm_p == 0 and any(e.get("loss") == "mlm" for e in entries):
        raise ConfigError("the mlm term predicts masked tokens, but --mlm-prob / distill.mlm_probability is 0; "
                          "set it above 0 (BERT: 0.15) or drop the mlm term")
    return Losses(entries=entries, terms=terms, mlm_probability=mlm_p)


def _check_options_used(opts, entries: list, method: str, stage: str) -> None:
    """ConfigError for an option the chosen losses would ignore: ``temperature`` without a soft-logit term,
    ``alpha`` without a ``kd`` term (it weighs that term's hard-label CE), ``layer_map`` without a layer-wise
    term that follows a map, ``mlm_prob`` in the task stage."""
    from ..distillation.distiller import HARD_LABEL_LOSSES, follows_layer_map, reads_logits
    names = [e["loss"] for e in entries]
    listed = f"--method {method} ({stage} stage) trains {', '.join(names)}"
    if opts.temperature is not None and not any(map(reads_logits, names)):
        raise ConfigError(f"--temperature softens teacher logits, but {listed}, none of which reads "
                          f"logits; drop --temperature")
    if opts.alpha is not None and not set(HARD_LABEL_LOSSES) & set(names):
        raise ConfigError(f"--alpha weighs the kd (or inbatch_kl) term against the hard-label loss, but {listed}; "
                          f"drop --alpha")
    if opts.layer_map is not None and not any(map(follows_layer_map, entries)):
        raise ConfigError(f"--layer-map pairs student and teacher layers, but {listed}, none of them "
                          f"layer-wise with a named map; drop --layer-map or choose --method pkd, tinybert or minilm")
    if opts.mlm_prob is not None and stage == "task":
        raise ConfigError("--mlm-prob corrupts the inputs of general (corpus) distillation; drop it for "
                          "--stage task")


def wants_teacher_cache(opts, settings: Settings, recipe, data: Data, losses: Losses) -> bool:
    """Whether the teacher's outputs are cached on disk: they pay off only when examples are seen again
    (more than one epoch) with fixed inputs (no MLM corruption) and per-example logits (no token task)."""
    tr = recipe.train
    seen = (tr.max_steps * tr.batch_size * tr.grad_accum_steps) if tr.max_steps else tr.epochs * len(data.items)
    use = not opts.no_cache and settings.section.get("cache", True) and losses.mlm_probability == 0 \
        and seen > len(data.items)
    if settings.stage == "task" and data.token_task:
        use = False  # the teacher cache stores (C,) logits per example; token tasks have (T, C)
    return use


def distill_collator(data: Data, losses: Losses):
    """Pads a batch and, in the general stage, MLM-corrupts it for the masked-LM terms."""
    from ..distillation.data import DistillCollator
    from ..tokenizer import special_tokens
    tok = data.tokenizer
    sp = special_tokens(tok)
    mlm_p = losses.mlm_probability
    return DistillCollator(data.base_collate, mlm_p, tok.token_to_id(sp.get("mask", "[MASK]")) if mlm_p else None,
                           data.teachers[0].config.vocab_size,
                           tuple(tok.token_to_id(sp[r]) for r in ("cls", "sep", "pad") if r in sp))


# ----------------------------------------------------------------------------------------- recording
def _applied(entry: dict, term, layer_map) -> dict:
    """A loss entry as the run applied it, for ``recipe.yaml``: the temperature/alpha that the
    ``temperature``/``alpha`` options set on the term, the ``layer_map`` that replaced a named map."""
    from ..distillation.distiller import HARD_LABEL_LOSSES, follows_layer_map, reads_logits
    e = dict(entry)
    if reads_logits(e["loss"]):
        e["temperature"] = term.temperature
    if e["loss"] in HARD_LABEL_LOSSES:
        e["alpha"] = term.alpha
    if layer_map is not None and follows_layer_map(e):
        e["layers"] = layer_map
    return e


def record_run(opts, settings: Settings, recipe, data: Data, losses: Losses, student, teacher_dirs) -> None:
    """What this run used, in the student's ``config.json`` and in ``recipe.yaml`` (so that the recipe alone
    repeats it; options win over the section)."""
    ds, terms = settings.section, losses.terms
    teachers = [str(Path(t).resolve()) for t in teacher_dirs]
    student.config.bertforge = {**student.config.bertforge, "max_seq_len": recipe.data.max_seq_len,
                                "distill": {"method": settings.method, "stage": settings.stage, "teachers": teachers,
                                            "losses": [{"loss": t.loss, "weight": t.weight, "pairs": t.pairs,
                                                        "temperature": t.temperature, "alpha": t.alpha}
                                                       for t in terms]}}
    if data.task is not None:
        student.config.bertforge["task"] = data.task.name
        student.config.bertforge["task_spec"] = data.task_spec
    section = {**ds, "method": settings.method, "stage": settings.stage, "student": settings.student,
               "teachers": teachers, "losses": [_applied(e, t, opts.layer_map or ds.get("layer_map"))
                                                for e, t in zip(losses.entries, terms)]}
    if settings.stage == "general":
        section["mlm_probability"] = losses.mlm_probability
    for key, value in (("temperature", settings.temperature), ("alpha", settings.alpha),
                       ("augment", data.augment_record)):
        if value is not None:
            section[key] = value
        elif key == "augment":
            section.pop("augment", None)
    recipe.extra["distill"] = section


def check_teacher_cache_dir(opts, out: Path, inputs: tuple) -> None:
    """``cache_dir``: not with ``no_cache``, and a place :func:`~bertforge.pipelines.rundir.check_cache_dir`
    accepts."""
    if opts.cache_dir is None:
        return
    if opts.no_cache:
        raise ConfigError("--cache-dir names a teacher cache and --no-cache turns it off; pass one of them")
    from ..distillation.cache import is_cache_dir
    check_cache_dir(Path(opts.cache_dir), out, inputs, reuse_hint="an earlier distill run's teacher_cache",
                    kind="a teacher cache", is_cache=is_cache_dir, inside_out=True)


def source_fingerprints(teacher_dirs, student_spec: str, inputs=None, teacher_specs=None) -> dict:
    """The input model dirs by flag, fingerprinted, so that a resumed run refuses other ones; ``inputs``
    (:class:`bertforge.pipelines.sources.Sources`) records them for ``recipe.yaml`` too (``teacher_specs``:
    the teachers as given, ``minilm`` or a hub id kept by name)."""
    from .sources import Sources, numbered
    inputs = inputs if inputs is not None else Sources(None)
    specs = list(teacher_specs or teacher_dirs)
    sources = {numbered("--teacher", i, len(teacher_dirs)): inputs.record_model(
        numbered("--teacher", i, len(teacher_dirs)), spec, t) for i, (spec, t) in enumerate(zip(specs, teacher_dirs))}
    if Path(student_spec).is_dir():
        sources["--student"] = inputs.record_model("--student", student_spec, student_spec)
    return sources


# ----------------------------------------------------------------------------------- distiller, train
def _fingerprint(teacher_dirs, items, max_len) -> dict:
    """What the teacher cache was filled from: the teachers' weight files (path, newest mtime), the
    training items' input_ids (SHA-1) and the length; a cache with another fingerprint is refilled."""
    h = hashlib.sha1()
    for it in items:
        h.update(json.dumps(it["input_ids"]).encode())
    teach = []
    from ..checkpoint.read import weight_files
    for t in teacher_dirs:  # a changed teacher (any of its weight files, shards too) invalidates the cache
        files = weight_files(Path(t))
        teach.append([str(t), max(f.stat().st_mtime for f in files) if files else None])
    return {"teachers": teach, "data": h.hexdigest(), "max_len": max_len}


def build_distiller(opts, settings: Settings, recipe, data: Data, losses: Losses, student, teacher_dirs,
                    work: Path, use_cache: bool) -> tuple:
    """The :class:`~bertforge.distillation.distiller.Distiller` (student + frozen teachers + projections W, an
    earlier stage's W loaded where the shapes match) and its teacher cache (or None)."""
    from ..distillation.distiller import Distiller
    from ..distillation.progressive import ProgressiveDistiller
    # MobileBERT's progressive transfer: one layer per stage, then the rest (distillation/progressive.py)
    cls = ProgressiveDistiller if settings.method == "mobilebert" else Distiller
    distiller = cls(student, data.teachers, losses.terms)
    if data.pooling is not None:  # sentence embeddings: pooled as the teacher pools; margins by its similarity
        distiller.pooling, distiller.cross_encoder = data.pooling.mode, data.cross_encoder
        distiller.normalize = bool(data.pooling.normalize) and not data.cross_encoder
        distiller.margin_sim = "cos" if (data.pooling.normalize and not data.cross_encoder) else "dot"
        distiller.columns = data.columns
        if data.adapter is not None:
            data.adapter.settings.similarity = (distiller.margin_sim if settings.method in ("margin_mse", "inbatch_kl")
                                                else "cos")
    fresh = sorted(distiller.proj)
    if Path(settings.student).is_dir():  # an earlier stage's W (TinyBERT: general → task)
        from ..distillation.distiller import PROJECTIONS_FILE
        fresh = sorted(set(distiller.proj) - set(distiller.load_projections(settings.student)))
        if fresh and (Path(settings.student) / PROJECTIONS_FILE).is_file() and not opts.resume:
            sys.stderr.write(f"bertforge distill: note: {settings.student}/{PROJECTIONS_FILE} has no W of this "
                             f"shape for {', '.join(fresh)} (another teacher width or loss); "
                             f"initialised fresh\n")
    cache = None
    if use_cache:
        from ..distillation.cache import TeacherCache
        max_len = recipe.data.max_seq_len
        root = Path(opts.cache_dir) if opts.cache_dir else work / "teacher_cache"
        shapes = distiller.cache_shapes(max_len)
        fp = _fingerprint(teacher_dirs, data.items, max_len)
        if data.pooling is not None:  # the cached embeddings are pooled (and normalised or not) this way
            fp["pooling"] = [distiller.pooling, distiller.normalize]
        cache = TeacherCache(root, len(data.items), shapes, fp)
        distiller.cache = cache
    if fresh and not opts.resume:
        start_projections(distiller, fresh, data, recipe, settings)
    return distiller, cache


#: training texts the linear-probe start of a fresh embedding projection is fitted on (distill.projection_init)
PROJECTION_FIT_TEXTS = 1024


def start_projections(distiller, fresh: list, data: Data, recipe, settings: Settings) -> None:
    """The recipe key ``distill.projection_init``: ``lstsq`` (the default) sets each fresh sentence-embedding
    projection W to the least-squares fit of the teacher's pooled embeddings from the student's on the first
    :data:`PROJECTION_FIT_TEXTS` training texts (:meth:`~bertforge.distillation.distiller.Distiller.fit_projections`,
    LP-FT); ``orthogonal`` sets it to the frozen semi-orthogonal W nearest the teacher (Procrustes), so that the
    student's own cosine geometry follows the teacher's; ``random`` keeps the drawn W. Other projections (hidden
    states, attention) stay as drawn."""
    how = settings.section.get("projection_init", "lstsq")
    if how == "random":
        return
    from ..distillation.data import IndexedDataset
    items = IndexedDataset(data.items)
    n, bs = min(len(items), PROJECTION_FIT_TEXTS), recipe.train.batch_size
    collate = distill_collator(data, Losses([], [], 0.0))
    batches = (collate([items[i] for i in range(s, min(s + bs, n))]) for s in range(0, n, bs))
    fitted = distiller.fit_projections(batches, names=set(fresh), orthogonal=how == "orthogonal")
    if fitted:
        what = "as the frozen rotation nearest the teacher" if how == "orthogonal" else "by least squares"
        sys.stderr.write(f"bertforge distill: projection W of {', '.join(fitted)} fitted to the teacher {what} on "
                         f"{n} training texts (distill.projection_init=lstsq | orthogonal | random)\n")


def _embedding_files(data: Data, student, dst, teacher_dir) -> None:
    """An embedding student's dir is an embedding dir: the teacher's pooling, in the sentence-transformers
    layout (:func:`bertforge.models.pooling.write_pooling`), and what else the teacher's dir declares
    (prompts, ``truncate_dim`` where the student is that wide: :func:`~bertforge.checkpoint.layout.carry_declarations`)."""
    if data.pooling is None:
        return
    from ..checkpoint.layout import carry_declarations
    from ..models.pooling import write_pooling
    write_pooling(dst, data.pooling.mode, data.pooling.normalize, hidden_size=student.config.hidden_size,
                  max_seq_length=data.pooling.max_seq_length)
    if data.pooling.declared:
        carry_declarations(teacher_dir, dst, hidden_size=student.config.hidden_size)


def train(distiller, dataset, collate, recipe, work: Path, data: Data, teacher_dirs, sources: dict,
          resume: bool) -> dict:
    """Train on the one Trainer, scoring the student on the task's evaluation data; each checkpoint is the
    student (HF layout, the teacher's tokenizer — the student's own when its vocabulary is another) plus the
    projections W."""
    from ..engine.train.trainer import Trainer
    from .report import CollapseWarning, print_training_plan
    if data.eval_ds is not None and recipe.train.metric_for_best is None:
        recipe.train.metric_for_best = data.task.metrics[0]
    if "train.no_duplicates" not in recipe.given:  # no distillation loss scores in-batch negatives
        recipe.train.no_duplicates = False
    eval_fn = CollapseWarning("distill", data.task, lambda m: data.adapter.evaluate(m.student, data.eval_ds),
                              step=lambda: trainer.step) if data.eval_ds is not None else None
    trainer = Trainer(distiller, dataset, collate, recipe, work, eval_fn=eval_fn,
                      save_fn=lambda m, dst: (m.student.save_pretrained(dst, tokenizer_dir=data.student_dir
                                                                        or teacher_dirs[0]),
                                              m.save_projections(dst),
                                              _embedding_files(data, m.student, dst, teacher_dirs[0])),
                      sources=sources)
    if hasattr(distiller, "set_schedule"):  # progressive transfer: its stages split the run's steps
        distiller.set_schedule(trainer.total_steps, recipe.train.grad_accum_steps)
        stages = distiller.num_layers + 1
        if trainer.total_steps < stages:
            sys.stderr.write(f"bertforge distill: warning: progressive transfer has {stages} stages (one per student "
                             f"layer, then all layers) but this run has {trainer.total_steps} optimizer steps, so "
                             f"stages {trainer.total_steps + 1}…{stages} never run; give at least {stages} steps "
                             f"(--max-steps or more --epochs)\n")
    if data.counts:
        print_training_plan("distill", data.counts, trainer)
    return trainer.fit(resume=resume)


__all__ = ["DistillOptions", "TrainResult", "distill", "distill_with"]
