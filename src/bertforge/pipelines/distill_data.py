"""The teachers, the training data and the student of a distillation run (:mod:`bertforge.pipelines.distill`):
the teacher dirs checked before any model loads (:func:`resolve_teachers`), the teachers loaded with the head
the data needs and the stage's data (:func:`build_data`: labelled task examples, optionally augmented as in
TinyBERT §3.3, search pairs or triples, or corpus sequences), and the student (:func:`build_student_model`).

``opts`` is a :class:`bertforge.pipelines.distill.DistillOptions` (or the verb's parsed flags: the same
names) and ``settings`` the :class:`bertforge.pipelines.distill.Settings` checked from it and the recipe.
Loads without torch; every function imports what it needs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..checkpoint.modeldir import ModelDir, resolve
from ..errors import ConfigError

#: the methods of :data:`bertforge.distillation.distiller.EMBEDDING_METHODS` (sentence embeddings; docs/search.md)
EMBEDDING_METHODS = ("embedding_mse", "margin_mse", "inbatch_kl")


def apply_kernels(model, kernels):
    """:func:`bertforge.engine.kernels.apply_kernels`, imported on first use (this module loads without torch)."""
    from ..engine.kernels import apply_kernels as apply
    return apply(model, kernels)


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
    columns: int = 1           # texts per item: inbatch_kl's (query, positive, negatives…) rows
    #: a student dir with another vocabulary than the teacher's (pooled embedding methods only): its own
    #: tokenizer encodes every item a second time (``student`` of each item), and its dir gives the saved tokenizer
    student_dir: Optional[str] = None


# ------------------------------------------------------------------------------------------ teachers
def _check_augment_mlm(mlm_dir: str, teacher_dir) -> None:
    """ConfigError unless ``mlm_dir`` holds a masked LM (saved MLM head) with the teacher's vocabulary."""
    from ..checkpoint.read import MLM_HEADS
    mlm, teacher = ModelDir.open(mlm_dir), ModelDir.open(teacher_dir)
    head = mlm.head
    if head not in MLM_HEADS:
        raise ConfigError(f"--augment-mlm {mlm_dir} has {'a ' + head if head not in (None, 'base') else 'no'} "
                          f"head, not a masked-LM one; pass a checkpoint saved with an MLM head (e.g. a "
                          f"`bertforge pretrain` run or a *ForMaskedLM dir)")
    if mlm.tokenizer().get_vocab() != teacher.tokenizer().get_vocab():
        raise ConfigError(f"--augment-mlm {mlm_dir} has another vocabulary than teacher {teacher_dir}; its "
                          f"predictions are teacher word pieces, so pass a masked LM with the teacher's tokenizer")


def _check_vocabularies(teacher_dirs, student_spec, method: Optional[str] = None, stage: str = "task") -> bool:
    """Teachers and a student given as a checkpoint dir must share one vocabulary: the same input_ids are
    fed to all of them — except a student dir taught a pooled sentence embedding (``embedding_mse`` /
    ``margin_mse`` / ``inbatch_kl`` on ``--task retrieval`` data), which reads its own tokenization of the same texts. Returns
    whether the student's vocabulary is another one. Raises ConfigError (one line) before anything is loaded
    or written: a token-level method across vocabularies, or teachers of different vocabularies."""
    dirs = [Path(t) for t in teacher_dirs]
    if student_spec and Path(str(student_spec)).is_dir():
        dirs.append(Path(str(student_spec)))
    if len(dirs) < 2:
        return False
    ref = ModelDir.open(dirs[0])
    ref_size, ref_vocab = ref.config.get("vocab_size"), ref.tokenizer().get_vocab()
    for d in dirs[1:]:
        role = "student" if d == dirs[-1] and len(dirs) > len(teacher_dirs) else "teacher"
        md = ModelDir.open(d)
        size = md.config.get("vocab_size")
        if size != ref_size or md.tokenizer().get_vocab() != ref_vocab:
            sizes = f"{size} tokens" + (", other ids" if size == ref_size else "")
            if role == "student" and method in EMBEDDING_METHODS and stage == "task":
                return True  # pooled embeddings: each side reads its own tokens of the same text
            if role == "student" and method is not None:
                raise ConfigError(f"--method {method} ({stage} stage) compares token-level outputs, and student {d} "
                                  f"has a different vocabulary ({sizes}) than teacher {dirs[0]} ({ref_size} tokens); "
                                  f"build the --student from the teacher (a shape or layers:…), or compare pooled "
                                  f"sentence embeddings, which work across vocabularies: --method embedding_mse, "
                                  f"margin_mse or inbatch_kl with --task retrieval")
            fix = ("build the student from the teacher (--student 4L-312H-12A-1200I or layers:0,2,4) or use "
                   "checkpoints that share the teacher's tokenizer" if role == "student" else
                   "pass teachers that share one tokenizer (fine-tuned from the same checkpoint)")
            raise ConfigError(f"{role} {d} has a different vocabulary ({sizes}) than teacher {dirs[0]} "
                              f"({ref_size} tokens); distillation feeds the same input_ids to all — {fix}")
    return False


def resolve_teachers(opts, settings, recipe, inputs=None) -> list:
    """The teacher dirs, checked before any model is loaded: ``--max-seq-len`` fits every teacher, teachers
    and a student dir share one vocabulary, an ``--augment-mlm`` dir is a masked LM of that vocabulary.
    Without a length asked for, ``data.max_seq_len`` becomes the one the teacher was fine-tuned with."""
    from ..checkpoint.read import check_seq_len
    mds = [ModelDir.open(t) for t in opts.teacher]  # validates each dir before anything is written
    teacher_dirs = [md.path for md in mds]
    for md in mds:
        check_seq_len(opts.max_seq_len, md.config)
    settings.cross_vocabulary = _check_vocabularies(teacher_dirs, settings.student, settings.method, settings.stage)
    if opts.max_seq_len is None and "data.max_seq_len" not in recipe.given:
        # nothing asked for a length: the teacher's own (as it was fine-tuned)
        if mds[0].meta.max_seq_len:
            recipe.data.max_seq_len = mds[0].meta.max_seq_len
    if settings.augment_mlm and settings.stage == "task" and settings.copies:
        if inputs is not None:  # the recipe's masked LM: checked to be the one it recorded
            inputs.model_spec("--augment-mlm", opts.augment_mlm, fallback=settings.augment_mlm)
        settings.augment_mlm = str(Path(resolve(str(settings.augment_mlm))).resolve())
        _check_augment_mlm(settings.augment_mlm, teacher_dirs[0])
    return teacher_dirs


# ---------------------------------------------------------------------------------------------- data
def build_data(opts, settings, recipe, teacher_dirs, inputs=None) -> Data:
    """Load the teachers and the training data of the stage: labelled task examples (optionally augmented,
    TinyBERT §3.3) or corpus sequences. ``inputs`` (:class:`bertforge.pipelines.sources.Sources`) checks data
    files taken from the recipe and records them; data paths are recorded resolved."""
    from .sources import Sources
    inputs = inputs if inputs is not None else Sources(recipe, getattr(opts, "recipe", None))
    tok = ModelDir.open(teacher_dirs[0]).tokenizer()
    if settings.stage == "task":
        return _task_data(opts, settings, recipe, teacher_dirs, tok, inputs)
    return _corpus_data(opts, recipe, teacher_dirs, tok, inputs)


def _task_data(opts, settings, recipe, teacher_dirs, tok, inputs) -> Data:
    """Teachers with the task's head (each checked to have it, with the task's label count) and the task's
    examples.

    Raises:
        ConfigError: no task or training file, a teacher without the task's head or with another label
            count, ``--augment`` for a token task.
    """
    from ..tasks import adapter_for, get_task, saved_task_spec, task_spec
    d = recipe.data
    teacher0 = ModelDir.open(teacher_dirs[0])
    meta = teacher0.meta
    d.task = opts.task or d.task or meta.task
    d.train = inputs.data_path("--train", opts.train or d.train, given=opts.train is not None)
    d.eval = inputs.data_path("--eval", opts.eval or d.eval, given=opts.eval is not None)
    if not d.task:
        raise ConfigError("--stage task needs --task NAME (the teacher does not record one)")
    if not d.train:
        raise ConfigError("--stage task needs --train FILE (labelled data)")
    # the teacher's column/label settings for its own task, under any given on this command line
    from ..tasks import apply_labels_file
    apply_labels_file(d, teacher0.config)
    spec = {**saved_task_spec(meta, d.task), **task_spec(d)}
    task = get_task(d.task, **spec)
    adapter = adapter_for(task, tok, d.max_seq_len)
    from ..tasks.multilabel import apply_hand_thresholds
    apply_hand_thresholds(adapter, d)  # checked before training; every evaluation uses them
    if task.kind == "retrieval":
        return _retrieval_data(settings, recipe, teacher_dirs, tok, task, adapter)
    if settings.method in EMBEDDING_METHODS:
        raise ConfigError(f"--method {settings.method} distils sentence embeddings: pass --task retrieval with "
                          f"(query, positive[, negative]) rows, or --stage general --corpus FILE (embedding_mse)")
    token_task = task.kind in ("token_classification", "qa")  # per-token logits (docs/ner_qa.md)
    if hasattr(adapter, "use_model_labels"):  # tag set as the teacher learnt it
        adapter.use_model_labels(teacher0)
    head, head_cfg = adapter.head, adapter.head_config()
    teachers = _task_teachers(teacher_dirs, task, head, head_cfg, recipe.impl.kernels)
    from ..data.readers import read_examples
    examples = [] if token_task else read_examples(d.train, task, d.max_train_samples)
    if settings.copies and token_task:
        raise ConfigError(f"--augment rewrites sentences and is not available for {task.kind} tasks; drop it")
    aug_record, n_read = None, len(examples)
    if settings.copies:
        examples, aug_record = _augment(opts, settings, examples, tok, teachers[0], recipe.train.seed)
    from ..data.collate import encode_examples
    if token_task:
        windows = adapter.load(d.train, d.max_train_samples)
        items, counts = list(windows), adapter.counts(windows)
    else:
        items = encode_examples(tok, examples, d.max_seq_len)
        counts = {"read": n_read, "read_unit": "examples", "items": len(items), "max_seq_len": d.max_seq_len,
                  "item_unit": "examples with augmented copies" if settings.copies else "examples"}
    base_collate = adapter.collator()
    eval_ds = adapter.load(d.eval, d.max_eval_samples) if d.eval else None
    return Data(teachers=teachers, tokenizer=tok, head=head, head_config=head_cfg, items=items,
                base_collate=base_collate, eval_ds=eval_ds, adapter=adapter, task=task, task_spec=spec,
                token_task=token_task, augment_record=aug_record, counts=counts)


def _task_teachers(teacher_dirs, task, head: str, head_cfg: dict, kernels) -> list:
    """The teachers loaded with the task's ``head``, each checked to have saved it (a teacher without it
    would teach from random weights) and to predict the task's number of labels."""
    from ..checkpoint.read import load_pretrained, require_saved_head
    for tdir in teacher_dirs:
        require_saved_head(ModelDir.open(tdir).config, head, f"teacher {tdir}", task.name,
                           f"fine-tune the teacher on {task.name} first (bertforge finetune) or pass --task")
    teachers = [apply_kernels(load_pretrained(t, head=head), kernels) for t in teacher_dirs]
    for t, tdir in zip(teachers, teacher_dirs):
        if getattr(t.head, "num_labels", None) != (task.num_labels or head_cfg.get("num_labels")):
            raise ConfigError(f"teacher {tdir} predicts {getattr(t.head, 'num_labels', '?')} labels but "
                              f"task {task.name} has {task.num_labels}; fine-tune the teacher on it first")
    return teachers


def _retrieval_data(settings, recipe, teacher_dirs, tok, task, adapter) -> Data:
    """Search distillation data (docs/search.md) from a (query, positive[, negative]) file: for
    ``embedding_mse`` every distinct text of it (queries, positives, negatives) is one example (Reimers &
    Gurevych 2020 distil on sentences); for ``margin_mse`` every (query, positive, negative) triple is one,
    with the teacher's score margin from a cross-encoder teacher (a saved one-logit sequence classifier,
    scoring each pair), a bi-encoder teacher (its own pooled embeddings) or ``scores`` in the file
    (Hofstätter et al. 2020); for ``inbatch_kl`` every row is one, all its columns (query, positive,
    negatives…) embedded by a bi-encoder teacher (Lin et al. 2021). ``distill.mine_negatives=K`` gives every
    row K negatives the teacher mines. Teachers are the encoders with the pooling their dirs declare.

    Raises:
        ConfigError: another method than embedding_mse / margin_mse / inbatch_kl; margin_mse rows without a
            negative; a cross-encoder teacher for embedding_mse or inbatch_kl.
    """
    from ..data.collate import PadCollator
    from ..checkpoint.read import load_pretrained
    from ..tasks.retrieval import read_pairs
    from ..tokenizer import pad_id
    d = recipe.data
    if settings.method not in EMBEDDING_METHODS:
        raise ConfigError(f"--task retrieval distils an embedding model: pass --method embedding_mse, "
                          f"margin_mse or inbatch_kl (not {settings.method})")
    teacher0 = ModelDir.open(teacher_dirs[0])
    cfg0 = teacher0.config
    cross = teacher0.head == "sequence_classification" and len(cfg0.get("id2label") or {0: 0}) == 1
    if cross and settings.method in ("embedding_mse", "inbatch_kl"):
        raise ConfigError(f"--method {settings.method} reads a bi-encoder's embeddings and teacher {teacher_dirs[0]} "
                          f"is a cross-encoder (one-logit classifier); use --method margin_mse with it")
    pooling = teacher0.pooling
    adapter.configure({}, int(cfg0.get("hidden_size") or cfg0.get("dim")), pooling)
    pairs = read_pairs(d.train, d.max_train_samples)
    columns = 1
    if settings.method == "embedding_mse":
        texts = list(dict.fromkeys(t for e in pairs for t in (e.query, e.positive, *e.negatives)))
        items = [{"input_ids": ids, "token_type_ids": [0] * len(ids)} for ids in adapter._encode(texts)]
        base_collate, unit = PadCollator(pad_id(tok)), "texts"
    else:
        mine = int(settings.section.get("mine_negatives") or 0)
        if mine and not cross:  # the bi-encoder teacher ranks the passages; its best wrong ones are the negatives
            pairs = _teacher_negatives(pairs, teacher_dirs[0], tok, d.max_seq_len, pooling, mine)
        if settings.method == "inbatch_kl":  # one item per row: (query, positive, negatives…) as C columns
            items, unit, columns = list(adapter.load_examples(pairs)), "rows", 2 + len(pairs[0].negatives)
        else:
            items, unit = _margin_triples(pairs, d, tok, adapter, cross), "triples"
        base_collate = adapter.collator()
    if cross:
        teachers = [apply_kernels(load_pretrained(t, head="sequence_classification", strict_head=True),
                                  recipe.impl.kernels) for t in teacher_dirs]
    else:
        teachers = [apply_kernels(load_pretrained(t, head="base"), recipe.impl.kernels) for t in teacher_dirs]
    student_dir = None
    if getattr(settings, "cross_vocabulary", False):  # the student reads its own tokens of the same texts
        student_dir = settings.student
        adapter = _student_columns(items, task, student_dir, pooling, d, settings.method, pairs)
        base_collate = StudentColumns(base_collate, PadCollator(pad_id(adapter.tok))
                                      if settings.method == "embedding_mse" else adapter.collator())
    eval_ds = adapter.load(d.eval, d.max_eval_samples) if d.eval else None
    return Data(teachers=teachers, tokenizer=tok, head="base", head_config={}, items=items,
                base_collate=base_collate, eval_ds=eval_ds, adapter=adapter, task=task, task_spec={},
                counts={"read": len(pairs), "read_unit": "pairs", "items": len(items), "item_unit": unit,
                        "max_seq_len": d.max_seq_len}, pooling=pooling, cross_encoder=cross, student_dir=student_dir,
                columns=columns)


def _student_columns(items: list, task, student_dir, pooling, d, method: str, pairs) -> object:
    """Give every item a ``student`` encoding of the same texts with the student's tokenizer (embedding_mse:
    one text; margin_mse: the (query, positive, negative) columns; inbatch_kl: the row's columns); returns the
    student's adapter, which
    evaluates the student with its own tokenizer."""
    from ..tasks import adapter_for
    from ..tasks.retrieval import PairExample
    adapter = adapter_for(task, ModelDir.open(student_dir).tokenizer(), d.max_seq_len)
    cfg = ModelDir.open(student_dir).config
    adapter.configure({}, int(cfg.get("hidden_size") or cfg.get("dim")), pooling)  # it embeds as the teacher
    if method == "embedding_mse":
        texts = list(dict.fromkeys(t for e in pairs for t in (e.query, e.positive, *e.negatives)))
        own = [{"input_ids": ids, "token_type_ids": [0] * len(ids)} for ids in adapter._encode(texts)]
    else:
        rows = pairs if method == "inbatch_kl" else [PairExample(e.query, e.positive, (n,), e.id)
                                                     for e in pairs for n in e.negatives]
        own = [{k: v for k, v in it.items() if k in ("input_ids", "token_type_ids")}
               for it in adapter.load_examples(rows)]
    for it, mine in zip(items, own):
        it["student"] = mine
    return adapter


class StudentColumns:
    """Wrap a collator for a student of another vocabulary: the batch of the items' teacher encodings plus
    ``student_input_ids`` / ``student_attention_mask`` / ``student_token_type_ids`` padded by ``student``
    (the student's own collator) from each item's ``student`` encoding."""

    def __init__(self, base, student):
        self.base, self.student = base, student

    def __call__(self, items: list) -> dict:
        batch = self.base([{k: v for k, v in it.items() if k != "student"} for it in items])
        own = self.student([it["student"] for it in items])
        for k in ("input_ids", "attention_mask", "token_type_ids"):
            if k in own:
                batch[f"student_{k}"] = own[k]
        return batch


def _teacher_negatives(pairs, teacher_dir, tok, max_seq_len: int, pooling, n: int) -> list:
    """``pairs`` with ``n`` hard negatives each (any given ones replaced), mined by the teacher: for every
    query, the ``n`` distinct passages of the file the teacher scores highest after its own positive
    (:func:`bertforge.tasks.retrieval.mine_hard_negatives`; the recipe key ``distill.mine_negatives``)."""
    from ..checkpoint.read import load_pretrained
    from ..tasks.retrieval import PairExample, embed_texts, mine_hard_negatives
    teacher = apply_kernels(load_pretrained(teacher_dir, head="base", notes=False), "auto")
    docs = list(dict.fromkeys(e.positive for e in pairs))
    index = {t: i for i, t in enumerate(docs)}
    mode, norm = getattr(pooling, "mode", "mean"), bool(getattr(pooling, "normalize", False))
    qe = embed_texts(teacher, tok, [e.query for e in pairs], max_seq_len, mode, norm)
    de = embed_texts(teacher, tok, docs, max_seq_len, mode, norm)
    mined = mine_hard_negatives(qe, de, [index[e.positive] for e in pairs], n)
    return [PairExample(e.query, e.positive, tuple(docs[j] for j in m), e.id) for e, m in zip(pairs, mined)]


def _margin_triples(pairs, d, tok, adapter, cross: bool) -> list:
    """margin_mse items: one per (query, positive, negative) triple, its teacher scores kept; for a
    cross-encoder teacher each also holds both (query, passage) pairs encoded as
    ``[CLS] query [SEP] passage [SEP]`` (``pair_input_ids``, ``pair_token_type_ids``)."""
    from ..tasks.retrieval import PairExample
    from ..tokenizer import encode_texts
    if not pairs[0].negatives:
        raise ConfigError(f"--method margin_mse needs (query, positive, negative) rows and {d.train} has no "
                          f"negative; add a \"negative\" to every row, or let the teacher mine them: distill.mine_negatives=K")
    triples = [PairExample(e.query, e.positive, (n,), e.id, None if e.scores is None else
                           (e.scores[0], e.scores[1 + k])) for e in pairs for k, n in enumerate(e.negatives)]
    items = list(adapter.load_examples(triples))
    if cross:  # the cross-encoder reads [CLS] query [SEP] passage [SEP] for the positive and the negative
        for it, e in zip(items, triples):
            both = encode_texts(tok, [e.query, e.query], [e.positive, e.negatives[0]], d.max_seq_len)
            it["pair_input_ids"] = [x.ids for x in both]
            it["pair_token_type_ids"] = [x.type_ids for x in both]
    return items


def _augment(opts, settings, examples: list, tok, teacher, seed: int) -> tuple:
    """TinyBERT's data augmentation (Jiao et al. 2020 §3.3): ``settings.copies`` rewritten copies of every
    example. Returns (examples with the copies, the settings applied for recipe.yaml)."""
    from ..distillation.augment import augment_examples, default_augmenter
    from ..checkpoint.read import load_pretrained
    aug_cfg = settings.augment
    record = {**aug_cfg, "copies": settings.copies, "prob": opts.augment_prob if opts.augment_prob is not None
              else aug_cfg.get("prob", 0.4)}
    mlm_model = None
    if settings.augment_mlm:
        mlm_model = apply_kernels(load_pretrained(settings.augment_mlm), "auto")  # speed only
        record["mlm"] = settings.augment_mlm
    else:
        record.pop("mlm", None)
        sys.stderr.write("bertforge distill: note: --augment without --augment-mlm replaces every word "
                         "by its nearest neighbours in the teacher's embeddings; TinyBERT draws "
                         "single-piece words from a masked LM's predictions: pass --augment-mlm DIR\n")
    augmenter = default_augmenter(tok, teacher, corpus_examples=examples, p=record["prob"],
                                  k=aug_cfg.get("top_k", 15), swap_prob=aug_cfg.get("swap_prob", 0.0),
                                  seed=seed, mlm_model=mlm_model)
    return augment_examples(examples, augmenter, settings.copies), record


def _has_mlm_head(md) -> bool:
    """Whether the dir ``md`` was saved with a masked-LM head — not an embedding dir (declared pooling): such a
    dir's config may name ``…ForMaskedLM`` (all-mpnet-base-v2) while it holds the encoder only."""
    from ..checkpoint.read import MLM_HEADS
    return md.head in MLM_HEADS and not md.pooling.declared


def _corpus_data(opts, recipe, teacher_dirs, tok, inputs) -> Data:
    """Teachers (a pretraining checkpoint with its MLM head) and fixed-length sequences of the corpus."""
    from ..data.collate import PadCollator
    from ..distillation.data import corpus_sequences
    from ..distillation.distiller import has_mlm_head, mlm_head_name
    from ..checkpoint.read import load_pretrained
    from ..tokenizer import pad_id
    d = recipe.data
    corpus = opts.corpus or d.corpus
    if not corpus:
        raise ConfigError("--stage general needs --corpus FILE [FILE …] (raw text)")
    corpus = d.corpus = inputs.data_paths("--corpus", corpus, given=opts.corpus is not None)
    # a pretraining checkpoint (BertForPreTraining: MLM + NSP, ALBERT's MLM + SOP…) teaches with its MLM head
    # (a sentence-transformers dir whose config names a masked LM it holds no head of loads as its encoder)
    teachers = [apply_kernels(load_pretrained(t, head=mlm_head_name() if _has_mlm_head(ModelDir.open(t)) else None),
                              recipe.impl.kernels) for t in teacher_dirs]
    head = mlm_head_name() if has_mlm_head(teachers[0]) else "base"
    pooling = None
    if getattr(opts, "method", None) == "embedding_mse":  # the student embeds as the teacher: no MLM head
        head, pooling = "base", ModelDir.open(teacher_dirs[0]).pooling
    items = corpus_sequences(corpus, tok, d.max_seq_len, d.max_train_samples)
    return Data(teachers=teachers, tokenizer=tok, head=head, head_config={}, items=items,
                base_collate=PadCollator(pad_id(tok)),
                counts={"read": len(items), "read_unit": "sequences", "items": len(items), "item_unit": "sequences",
                        "max_seq_len": d.max_seq_len}, pooling=pooling)


# ------------------------------------------------------------------------------------------- student
def build_student_model(settings, data: Data, teacher_dirs, seed: int, notes: bool = True):
    """The student (:func:`bertforge.distillation.student.build_student`), seeded so that its fresh weights are
    the same in every run and on every rank; its head follows the teacher's. ``notes``: say which weights
    start fresh (not on ``--resume``, whose checkpoint replaces them)."""
    from ..distillation.student import build_student
    from ..engine.train.rng import set_seed
    set_seed(seed)
    return build_student(settings.student, data.teachers[0], head=data.head, head_config=data.head_config,
                         teacher_dir=str(teacher_dirs[0]), notes=notes)


__all__ = ["Data", "EMBEDDING_METHODS", "build_data", "build_student_model", "resolve_teachers"]
