"""Pretraining from Python: :func:`pretrain` (what ``bertforge pretrain`` runs) — an encoder trained from raw
text with one of the classic objectives (BERT MLM + NSP, RoBERTa, ALBERT MLM + SOP, ELECTRA, SpanBERT,
ModernBERT), into a run folder that is a Hugging Face checkpoint (ELECTRA: the discriminator, its generator in
``generator/``) plus ``recipe.yaml`` and ``metrics.jsonl``.

Trains (or reuses) a tokenizer, tokenizes and caches the corpus (:mod:`bertforge.data.corpus`), builds
FULL-SENTENCES / DOC-SENTENCES / NSP / SOP sequences, masks them (static ×K or dynamic; token, whole-word or
span) and trains on the one Trainer.

    >>> import bertforge
    >>> r = bertforge.pretrain("roberta", "wiki.valid.raw", "runs/roberta-tiny", size="tiny", max_steps=300)
    >>> r.out, r.metrics["train_sequences"], r.metrics["step"]
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from ..checkpoint.modeldir import resolve
from ..errors import BertforgeError, ConfigError, DataError, require_at_least
from .finetune import TrainResult
from .outputs import check_cache_dir
from .recipe import apply_train_flags, check_flags_agree, check_recipe
from .rundir import RunDir
from .options import options_from, python_names


@dataclass
class PretrainOptions:
    """Options of :func:`pretrain` — the flags of ``bertforge pretrain`` with ``_`` for ``-``, same defaults
    (None: the recipe's, the ``size``'s or the objective's). ``corpus``: text files or HF hub dataset names;
    ``tokenizer``: a kind trained on the corpus (``wordpiece``, ``wordpiece-cased``, ``bpe``, ``unigram``) or a
    checkpoint dir / ``"minilm"`` whose tokenizer is reused; ``overrides``: recipe ``key=value`` strings
    (``pretrain.mlm_probability=0.2``)."""

    objective: Optional[str] = None
    corpus: Optional[list] = None
    out: Optional[str] = None
    size: Optional[str] = None
    tokenizer: Optional[str] = None
    vocab_size: Optional[int] = None
    max_seq_len: Optional[int] = None
    masking: Optional[str] = None
    dupe_factor: Optional[int] = None
    whole_word: bool = False
    doc_sep: Optional[str] = None
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


def pretrain(objective, corpus: Union[str, Path, list, None], out, **options) -> TrainResult:
    """Pretrain a model with ``objective`` (``bert``, ``roberta``, ``albert``, ``electra``, ``spanbert``,
    ``modernbert``; None: the one ``recipe`` records) on ``corpus`` (a text file, a hub dataset name, or a list
    of them) into the run folder ``out``; ``options``: the other fields of :class:`PretrainOptions`.

    Returns:
        :class:`~bertforge.pipelines.finetune.TrainResult`: ``out`` and ``metrics`` — ``objective``,
        ``train_sequences``, ``corpus_tokens`` and the Trainer's result (``step``, ``best``, ``best_step`` and
        the last held-out evaluation: MLM / RTD accuracy against the unigram baseline, when the corpus yields
        held-out sentences).

    Raises:
        ConfigError / DataError / CheckpointError: one line naming what to change (checked before the run
            folder is written)."""
    if isinstance(corpus, (str, Path)):
        corpus = [corpus]
    opts = options_from(PretrainOptions, "pretrain", dict(objective=objective, out=out, **options),
                        corpus=None if corpus is None else [str(c) for c in corpus])
    with python_names(PretrainOptions):
        return pretrain_with(opts)


def pretrain_with(opts: PretrainOptions) -> TrainResult:
    """:func:`pretrain` from a complete :class:`PretrainOptions` (what the verb builds from its flags)."""
    return _run(opts)


def build_pretrain_recipe(args):
    """Shape defaults (``size``) < the objective's optimizer constants < recipe file < KEY=VALUE overrides
    < explicit options. ``args``: a :class:`PretrainOptions` (or the verb's flags); its ``objective`` is set
    from the recipe when not given."""
    from ..config import deep_merge, load_recipe
    from ..objectives.pretrain import OBJECTIVES, SIZES
    if not args.objective:  # a run's recipe records its objective
        saved = load_recipe(args.recipe, [], extra_sections=("pretrain",)).extra.get("pretrain") or {}
        args.objective = saved.get("objective")
        if not args.objective:
            raise ConfigError("no objective given; pass --objective (one of " + ", ".join(sorted(OBJECTIVES))
                              + "), or --recipe RUN/recipe.yaml of an earlier pretrain run")
        if args.objective not in OBJECTIVES:
            raise ConfigError(f"{args.recipe}: pretrain.objective={args.objective!r}; choose one of "
                              f"{', '.join(sorted(OBJECTIVES))}")
    for flag, value, table in (("--objective", args.objective, OBJECTIVES), ("--size", args.size, SIZES)):
        if value is not None and value not in table:  # the CLI's choices; a Python caller's typo
            raise ConfigError(f"{flag} {value!r}: choose one of {', '.join(sorted(table))}")
    defaults = deep_merge(SIZES[args.size or "tiny"], {"train": dict(OBJECTIVES[args.objective].train)})
    r = load_recipe(args.recipe, args.overrides or [], extra_sections=("pretrain",), defaults=defaults)
    if args.size and args.recipe:
        _check_size_against_recipe(args.size, args.recipe)
    apply_train_flags(r, args)
    sec = r.extra.setdefault("pretrain", {})
    pairs = (("tokenizer", "tokenizer"), ("vocab_size", "vocab_size"), ("masking", "masking"),
             ("dupe_factor", "dupe_factor"), ("doc_sep", "doc_sep"))
    check_flags_agree(args, "pretrain", {k: (f"--{a.replace('_', '-')}", getattr(args, a, None)) for a, k in pairs}
                      | {"whole_word": ("--whole-word", True if args.whole_word else None)})
    for a, k in pairs:
        v = getattr(args, a, None)
        if v is not None:
            sec[k] = v
    if args.whole_word:
        sec["whole_word"] = True
    sec["objective"] = args.objective
    r.data.corpus = [str(c) for c in (args.corpus or r.data.corpus or [])]
    if not r.data.corpus:
        raise ConfigError("no corpus given; pass --corpus FILE [FILE …] (raw text), or --recipe RUN/recipe.yaml "
                          "of an earlier pretrain run")
    seen: dict = {}
    for c in r.data.corpus:  # a file given twice would silently count its text twice
        key = str(Path(c).resolve()) if Path(c).exists() else c
        if key in seen:
            raise ConfigError(f"--corpus lists {c} twice (also as {seen[key]}); give each file once")
        seen[key] = c
    require_at_least("--max-seq-len / data.max_seq_len", r.data.max_seq_len, 8,
                     "a pretraining sequence holds [CLS], two segments and [SEP]")
    return check_recipe(r)


def _check_size_against_recipe(size: str, path: str) -> None:
    """ConfigError when ``--size`` and a recipe file both set a shape key (model, data or train) to different
    values: the recipe would silently win (a recipe only for ``pretrain.*`` options combines freely)."""
    import yaml
    from ..objectives.pretrain import SIZES
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}  # load_recipe has validated it
    for section, values in SIZES[size].items():
        for key, value in values.items():
            mine = (raw.get(section) or {}).get(key, value)
            if mine != value:
                raise ConfigError(f"--size {size} sets {section}.{key}={value} but --recipe {path} sets "
                                  f"{section}.{key}={mine}; drop --size (the recipe sets the shape) or the "
                                  f"recipe's value")


def get_tokenizer(spec, kind_default: str, corpus: list, vocab_size: int, cache_dir: Path):
    """A trained (cached) tokenizer of kind ``spec``, or the tokenizer of a checkpoint dir."""
    from ..data.tokenizers_train import KINDS, check_trained_size, check_vocab_size, train_tokenizer
    from ..tokenizer import load_tokenizer
    spec = spec or kind_default
    if spec not in KINDS:
        d = resolve(spec)
        if not d.is_dir():
            raise ConfigError(f"--tokenizer {spec!r} is neither a kind ({', '.join(KINDS)}) nor a checkpoint "
                              f"dir; pass one of those kinds, a dir holding tokenizer.json, or 'minilm'")
        return load_tokenizer(d)
    from tokenizers import Tokenizer

    from ..data.corpus import iter_corpus_lines, reach_hub_sources, source_meta
    meta = source_meta(corpus)
    for c, (_, size, _) in zip(corpus, meta):
        if size == 0 and Path(c).is_file():
            raise DataError(f"corpus file {c} is empty; pass text files with sentences")
    key = hashlib.sha256(json.dumps([spec, vocab_size, meta]).encode()).hexdigest()[:16]
    path = cache_dir / f"tokenizer-{spec}-{vocab_size}-{key}.json"
    check_vocab_size(spec, vocab_size)
    if path.is_file():
        tok = Tokenizer.from_file(str(path))
        check_trained_size(tok, spec, vocab_size)  # cached by a version that let it grow past vocab_size
        return tok
    reach_hub_sources(corpus)  # an offline or misspelt dataset name fails here, before training
    tok = train_tokenizer(spec, iter_corpus_lines(corpus), vocab_size)
    from ..io import atomic_write_text
    atomic_write_text(path, tok.to_str())
    return tok


def _tokenizer(args, recipe, inputs):
    """``(tokenizer, pretrain options, trained, tok_inputs, cache dir)``: the options of the objective resolved
    (recorded in ``recipe``), and the tokenizer trained on the corpus (cached) or read from a checkpoint dir
    (``tok_inputs``: that dir, which neither ``out`` nor the cache may lie in)."""
    from ..data.corpus import default_cache_dir
    from ..data.tokenizers_train import KINDS
    from ..objectives.pretrain import OBJECTIVES, resolve_options
    opts = resolve_options(args.objective, {k: v for k, v in recipe.extra["pretrain"].items()
                                            if k != "objective"})
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    trained = opts.get("tokenizer") in (None, *KINDS)
    if not trained:  # a checkpoint's tokenizer: checked when the recipe's, recorded (a dir resolved)
        spec = inputs.model_spec("--tokenizer", args.tokenizer, fallback=str(opts["tokenizer"]))
        tok_dir = resolve(spec)
        if tok_dir.is_dir():
            inputs.record_model("--tokenizer", spec, tok_dir)
            if Path(spec).is_dir():
                opts["tokenizer"] = str(Path(spec).resolve())
    recipe.extra["pretrain"] = {k: v for k, v in opts.items() if k not in ("family", "head")}
    tok_inputs = (Path(opts["tokenizer"]),) if not trained and Path(str(opts["tokenizer"])).is_dir() else ()
    check_cache_dir(cache, Path(args.out), tok_inputs, reuse_hint="an earlier --cache-dir")
    tok = get_tokenizer(opts["tokenizer"], OBJECTIVES[args.objective].tokenizer, recipe.data.corpus,
                        int(opts["vocab_size"]), cache)
    if not trained:  # a reused tokenizer: its size is the vocabulary
        if args.vocab_size is not None and args.vocab_size != tok.get_vocab_size():
            raise ConfigError(f"--vocab-size {args.vocab_size} applies to a tokenizer trained on the corpus; "
                              f"--tokenizer {opts['tokenizer']} has {tok.get_vocab_size()} tokens; drop "
                              f"--vocab-size")
        recipe.extra["pretrain"]["vocab_size"] = tok.get_vocab_size()
    return tok, opts, trained, tok_inputs, cache


def _datasets(opts, recipe, corpus, ids: dict):
    """``(train_ds, eval_ds or None, why there is none or None, train sentence mask)``."""
    from ..data.corpus import PretrainDataset, split_documents
    seed = recipe.train.seed
    train_mask, eval_mask = split_documents(corpus, float(opts["eval_fraction"]), seed)
    common = dict(mode=opts["mode"], max_seq_len=recipe.data.max_seq_len, cls_id=ids["cls"], sep_id=ids["sep"],
                  short_seq_prob=float(opts["short_seq_prob"] or 0.0))
    train_ds = PretrainDataset(corpus, sentence_mask=train_mask, dupe_factor=int(opts["dupe_factor"]),
                               static_masking=opts["masking"] == "static", seed=seed, **common)
    eval_ds, why = None, None
    frac = float(opts["eval_fraction"])
    if eval_mask.any():
        try:
            eval_ds = PretrainDataset(corpus, sentence_mask=eval_mask, static_masking=True, seed=seed + 1,
                                      max_items=int(opts["max_eval_sequences"]), **common)
        except DataError as e:
            why = f"the held-out sentences make no {opts['mode']} sequence ({e})"
    elif frac > 0:
        why = (f"pretrain.eval_fraction {frac:g} holds out no sentence: each document gives up "
               f"int(sentences × {frac:g}), and none has {1 / frac:.0f} or more")
    return train_ds, eval_ds, why, train_mask


def _run(args) -> TrainResult:
    from ..data.corpus import TokenizedCorpus
    from ..engine.train.trainer import Trainer
    from ..objectives.collate import PretrainCollator
    from ..objectives.pretrain import build_model, evaluate_mlm, model_config, unigram_top_id
    from ..tokenizer import special_tokens
    from .sources import Sources
    recipe = build_pretrain_recipe(args)
    inputs = Sources(recipe, args.recipe)  # what --recipe recorded; what this run reads
    recipe.data.corpus = inputs.data_paths("--corpus", recipe.data.corpus, given=args.corpus is not None)
    tok, opts, trained, tok_inputs, cache = _tokenizer(args, recipe, inputs)
    sp = special_tokens(tok)
    for role in ("cls", "sep", "pad", "mask"):
        if role not in sp:
            raise BertforgeError(f"the tokenizer has no {role} token; use a BERT/RoBERTa-style tokenizer")
    ids = {r: tok.token_to_id(t) for r, t in sp.items()}
    corpus = TokenizedCorpus.build(recipe.data.corpus, tok, cache, opts["doc_sep"])
    train_ds, eval_ds, why, train_mask = _datasets(opts, recipe, corpus, ids)
    collate = PretrainCollator(ids["pad"], ids["mask"], list(ids.values()), tok.get_vocab_size(),
                               scheme=opts["scheme"], mlm_probability=float(opts["mlm_probability"]),
                               replace_probs=tuple(float(x) for x in opts["replace_probs"]),
                               geometric_p=float(opts["geometric_p"]), max_span=int(opts["max_span"]),
                               max_ngram=int(opts["max_ngram"]))
    config = model_config(opts, recipe, tok.get_vocab_size(), ids["pad"])
    if opts["family"] not in ("albert", "electra"):  # E = H there: recipe.yaml records the model trained
        recipe.model.pop("embedding_size", None)
    config.bertforge = {**config.bertforge, "objective": args.objective, "max_seq_len": recipe.data.max_seq_len}
    out = Path(args.out)
    run_dir = RunDir(out, inputs=tok_inputs, overwrite=args.overwrite, resume=args.resume)
    inputs.record(recipe)  # recipe.yaml: what the run read, so that --recipe alone re-runs it
    if args.resume:
        from .resume_policy import check_resume
        check_resume(out, len(train_ds), recipe.train, None, recipe)  # before the model is built
    with run_dir as work:
        from ..engine.train.rng import set_seed
        set_seed(recipe.train.seed)  # the same initial weights in every run and on every rank
        model = build_model(opts, config)
        uni = unigram_top_id(corpus, train_mask, list(ids.values()))
        eval_fn = None
        if eval_ds is not None:
            eval_fn = lambda m: evaluate_mlm(m, eval_ds, collate, unigram_id=uni)  # noqa: E731
        trainer = Trainer(model, train_ds, collate, recipe, work, eval_fn=eval_fn,
                          save_fn=lambda m, dst: m.save_pretrained(dst, tokenizer=tok))
        result = trainer.fit(resume=args.resume)
    if why and int(os.environ.get("RANK", "0")) == 0:  # said once the run has succeeded
        print(f"bertforge pretrain: note: the run had no held-out evaluation: {why}; raise "
              f"pretrain.eval_fraction or add text", file=sys.stderr)
    if trained and tok.get_vocab_size() < int(opts["vocab_size"]):  # said once the run has succeeded
        print(f"bertforge: the corpus yields {tok.get_vocab_size()} tokens, fewer than --vocab-size / "
              f"pretrain.vocab_size {opts['vocab_size']}; the model uses {tok.get_vocab_size()}", file=sys.stderr)
    return TrainResult(out, {"objective": args.objective, "train_sequences": len(train_ds),
                             "corpus_tokens": corpus.num_tokens, **result})


__all__ = ["PretrainOptions", "pretrain", "pretrain_with", "build_pretrain_recipe", "get_tokenizer"]
