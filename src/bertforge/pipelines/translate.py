"""Translation from Python: :func:`translate_train` and :func:`translate` (what ``bertforge translate train`` and
``translate decode`` run) — the original Transformer (Vaswani et al. 2017, "Attention Is All You Need").

:func:`translate_train` learns a joint subword vocabulary on source + target, batches sentence pairs by token
count and trains the encoder-decoder with label-smoothed cross-entropy (§5.4) and the warmup /
inverse-square-root schedule (§5.3, eq. 3) on the one Trainer; the run folder is the checkpoint (``config.json``
with ``model_type`` ``"bertforge-transformer"``, ``model.safetensors``, ``tokenizer.json``) plus ``recipe.yaml``
and ``metrics.jsonl`` (``val_loss`` and greedy validation BLEU at every evaluation). :func:`translate`
translates sentences with greedy or beam search (§6.1: beam 4, length penalty α 0.6) and, given references,
scores sacreBLEU on the detokenized output.

    >>> import bertforge
    >>> r = bertforge.translate_train("train.en", "train.de", "val.en", "val.de", "runs/mt-small",
    ...                               overrides=["train.max_minutes=55"])
    >>> t = bertforge.translate(r.out, ["A man is riding a bike."], beam=4)
    >>> t.hypotheses[0]
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from ..errors import ConfigError, DataError, require_number
from .finetune import TrainResult
from .recipe import apply_train_flags
from .rundir import RunDir
from .options import options_from, python_names

#: the defaults of `translate train` (mirrored in recipes/translate/small.yaml; a test keeps them equal)
DEFAULT_RECIPE = {
    "model": {"d_model": 256, "encoder_layers": 3, "decoder_layers": 3, "num_heads": 4, "ffn_dim": 1024,
              "dropout": 0.1, "attention_dropout": 0.0, "activation": "relu", "share_embeddings": True,
              "tie_output": True, "label_smoothing": 0.1, "max_positions": 256},
    "train": {"batch_size": 1, "epochs": 10, "schedule": "inverse_sqrt", "warmup_steps": 120,
              "lr": 1.0e-3, "adam_betas": [0.9, 0.98], "adam_eps": 1.0e-9, "weight_decay": 0.0,
              "max_grad_norm": 1.0, "eval_every": 150, "save_every": 150, "metric_for_best": "bleu",
              "log_every": 10, "keep_checkpoints": 1},
    "impl": {"dtype": "auto"},
    "translate": {"tokenizer": "bpe", "vocab_size": 8000, "max_tokens": 1500, "max_len": 128,
                  "noam_factor": None, "eval_bleu_sentences": 300, "eval_beam": 1,
                  "beam": 4, "length_penalty": 0.6, "max_len_a": 1.5, "max_len_b": 10},
}
#: the parallel files of a run, by recipe key (``translate.src`` …) and flag; a run's recipe.yaml records them
#: resolved, so that ``--recipe RUN/recipe.yaml`` alone re-runs it
FILE_FLAGS = {"src": "--src", "tgt": "--tgt", "valid_src": "--valid-src", "valid_tgt": "--valid-tgt"}
TRANSLATE_KEYS = set(DEFAULT_RECIPE["translate"]) | set(FILE_FLAGS)


@dataclass
class TranslateTrainOptions:
    """Options of :func:`translate_train` — the flags of ``bertforge translate train`` with ``_`` for ``-``, same
    defaults (None: the recipe's, else :data:`DEFAULT_RECIPE`'s). ``src`` / ``tgt``: aligned training files, one
    sentence a line; ``valid_src`` / ``valid_tgt``: the validation pair; ``overrides``: recipe ``key=value``
    strings (``model.d_model=512``, ``translate.vocab_size=10000``)."""

    src: Optional[str] = None
    tgt: Optional[str] = None
    valid_src: Optional[str] = None
    valid_tgt: Optional[str] = None
    out: Optional[str] = None
    max_minutes: Optional[float] = None
    max_tokens: Optional[int] = None
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


@dataclass
class TranslateOptions:
    """Options of :func:`translate` — the flags of ``bertforge translate decode`` with ``_`` for ``-``, same
    defaults (None: the run's ``translate.*`` recipe values, else beam 4, α 0.6, a 1.5, b 10). ``output``: a
    file the translations are written to (atomically; an existing one only with ``overwrite``);
    ``reference``: a file or a list of reference translations (sacreBLEU); ``batch_tokens``: source tokens ×
    beam per batch."""

    output: Optional[str] = None
    overwrite: bool = False
    beam: Optional[int] = None
    length_penalty: Optional[float] = None
    max_len_a: Optional[float] = None
    max_len_b: Optional[int] = None
    batch_tokens: int = 4000
    reference: Union[str, Path, list, None] = None
    bf16: bool = False
    threads: Optional[int] = None


@dataclass
class TranslateResult:
    """``hypotheses``: one translation per input sentence, in order; ``sentences``, ``beam``, ``seconds`` (wall
    time of decoding); with references ``bleu`` (sacreBLEU, detokenized, cased), its ``signature`` and
    ``bleu_detail``; ``output``: the file written, or None."""

    hypotheses: list
    sentences: int
    beam: int
    seconds: float
    bleu: Optional[float] = None
    signature: Optional[str] = None
    bleu_detail: Optional[str] = None
    output: Optional[Path] = None

    @property
    def record(self) -> dict:
        """What the verb prints: sentences, beam, seconds (1 decimal) and, with references, the BLEU fields."""
        rec = {"sentences": self.sentences, "beam": self.beam, "seconds": round(self.seconds, 1)}
        if self.bleu is not None:
            rec.update(bleu=round(self.bleu, 2), signature=self.signature, bleu_detail=self.bleu_detail)
        return rec


def translate_train(src, tgt, valid_src, valid_tgt, out, **options) -> TrainResult:
    """Train a translation Transformer on the parallel files ``src`` / ``tgt`` (validated on ``valid_src`` /
    ``valid_tgt``; each None: the one ``recipe`` records) into the run folder ``out``; ``options``: the other
    fields of :class:`TranslateTrainOptions`.

    Returns:
        :class:`~bertforge.pipelines.finetune.TrainResult`: ``out`` and ``metrics`` — the Trainer's result
        (``step``, ``val_loss``, ``bleu`` …) plus ``train_seconds``, ``prep_seconds``, ``parameters``,
        ``vocab_size``, ``batches_per_epoch``.

    Raises:
        ConfigError / DataError: one line naming what to change (checked before the run folder is written)."""
    files = {k: None if v is None else str(v)
             for k, v in (("src", src), ("tgt", tgt), ("valid_src", valid_src), ("valid_tgt", valid_tgt))}
    opts = options_from(TranslateTrainOptions, "translate_train", dict(out=out, **options), **files)
    with python_names(TranslateTrainOptions):
        return translate_train_with(opts)


def translate(model, input: Union[str, Path, list], **options) -> TranslateResult:  # noqa: A002 (the flag)
    """Translate ``input`` (a file, one sentence a line, or a list of sentences) with the checkpoint ``model``
    written by :func:`translate_train`; ``options``: the fields of :class:`TranslateOptions`.

    Raises:
        ConfigError: a decode setting out of range, ``reference`` not aligned with ``input``, an ``output`` that
            would land in a run or model dir or on an input; CheckpointError: ``model`` is no translation
            checkpoint."""
    opts = options_from(TranslateOptions, "translate", options)
    with python_names(TranslateOptions):
        return translate_with(model, input, opts)


# --------------------------------------------------------------------------------------- train
def build_translate_recipe(args):
    """Defaults (DEFAULT_RECIPE) < recipe file < KEY=VALUE overrides < explicit flags."""
    from ..config import load_recipe
    r = load_recipe(args.recipe, args.overrides or [], extra_sections=("translate",),
                    defaults=DEFAULT_RECIPE)
    if args.batch_size is not None:
        raise ConfigError("translation batches are built by token count; use --max-tokens, not --batch-size")
    apply_train_flags(r, args)
    if args.max_minutes is not None:
        r.train.max_minutes = args.max_minutes
    sec = r.extra.setdefault("translate", {})
    unknown = set(sec) - TRANSLATE_KEYS
    if unknown:
        raise ConfigError(f"unknown recipe keys {sorted('translate.' + k for k in unknown)}; valid: "
                          f"{', '.join(sorted(TRANSLATE_KEYS))}")
    if args.max_tokens is not None:
        sec["max_tokens"] = args.max_tokens
    if r.train.batch_size != 1:
        raise ConfigError("keep train.batch_size=1 for translation (each item is a batch of "
                          "translate.max_tokens tokens)")
    if sec.get("noam_factor"):  # lr = factor · d_model^-0.5 · warmup^-0.5 (Vaswani et al. eq. 3)
        d = int(r.model.get("d_model", 512))
        r.train.lr = float(sec["noam_factor"]) * d ** -0.5 * max(1, r.train.warmup_steps or 1) ** -0.5
    _check_translate_recipe(r, sec)
    from .sources import Sources
    inputs = Sources(r, args.recipe)  # files not given come from the recipe, checked to be the ones it recorded
    for key, flag in FILE_FLAGS.items():
        given = getattr(args, key)
        value = given or sec.get(key)
        if not value:
            raise ConfigError(f"no {flag} given; pass {flag} FILE, or --recipe RUN/recipe.yaml of an earlier "
                              f"`translate train` run")
        sec[key] = inputs.data_path(flag, value, given=given is not None)
        setattr(args, key, sec[key])
    inputs.record(r)  # recipe.yaml: what the run read
    r.data.train, r.data.eval = args.src, args.valid_src
    return r


def _check_translate_recipe(r, sec: dict) -> None:
    """One-line ConfigErrors, before anything is written: the shared training checks, the architecture
    (``TransformerConfig`` on a stand-in vocabulary) and the ``translate`` section's numbers."""
    import math

    from ..models.seq2seq import TransformerConfig
    from .recipe import check_recipe
    check_recipe(r)
    if r.train.max_minutes is not None and not 0 < r.train.max_minutes < math.inf:
        raise ConfigError(f"--max-minutes / train.max_minutes must be > 0 (got {r.train.max_minutes})")
    TransformerConfig.from_dict({**r.model, "vocab_size": 8})
    for key, low in (("vocab_size", 5), ("max_tokens", 1), ("max_len", 2), ("eval_bleu_sentences", 0),
                     ("eval_beam", 1), ("beam", 1)):
        require_number(f"translate.{key}", sec.get(key), low, whole=True,
                       note="4 ids are the special tokens" if key == "vocab_size" else "")


def length_limit(max_len: int, max_positions: int) -> tuple[int, str]:
    """(longest side in tokens a training pair may have, the setting that sets it): ``translate.max_len``,
    or ``model.max_positions`` − 1 when that is smaller (a decoder input is ``<s>`` + the target)."""
    if max_len <= max_positions - 1:
        return max_len, f"translate.max_len (now {max_len})"
    return max_positions - 1, (f"model.max_positions (now {max_positions}; a side may have up to "
                               f"max_positions − 1 tokens)")


def make_eval_fn(model, tokenizer, valid_src: list, valid_tgt: list, sec: dict, dtype: str):
    """eval_fn for the Trainer: ``val_loss`` / ``val_nll`` (per target token, all of the validation set)
    and ``bleu`` (sacreBLEU of greedy or beam output on the first ``eval_bleu_sentences`` sentences)."""
    import sacrebleu
    import torch

    from ..data.translation import TokenBatchDataset, encode_pairs
    from ..models.decoding import translate_texts
    s_ids, t_ids, dropped = encode_pairs(tokenizer, valid_src, valid_tgt, model.config.max_positions - 1)
    if not s_ids:  # val_loss would divide by zero at the first evaluation
        raise DataError(f"all {dropped} sentence pairs of --valid-src/--valid-tgt are longer than "
                        f"{model.config.max_positions - 1} tokens (</s> included), so none can be "
                        f"evaluated; raise model.max_positions (now {model.config.max_positions})")
    val = TokenBatchDataset(s_ids, t_ids, max(4000, int(sec["max_tokens"])))
    n_bleu = int(sec.get("eval_bleu_sentences") or 0)

    def eval_fn(m) -> dict:
        dev = next(m.parameters()).device
        tot = nll = n = 0.0
        for b in val.batches:
            out = m(**{k: v.to(dev) for k, v in b.items()})
            k = float(out.terms["ntokens"])
            tot += float(out.loss) * k
            nll += float(out.terms["nll"]) * k
            n += k
        res = {"val_loss": tot / n, "val_nll": nll / n, "val_ppl": float(torch.exp(torch.tensor(nll / n)))}
        if n_bleu:
            hyp = translate_texts(m, tokenizer, valid_src[:n_bleu], beam=int(sec.get("eval_beam", 1)),
                                  length_penalty=float(sec["length_penalty"]),
                                  max_len_a=float(sec["max_len_a"]), max_len_b=int(sec["max_len_b"]),
                                  dtype=dtype)
            res["bleu"] = sacrebleu.corpus_bleu(hyp, [valid_tgt[:n_bleu]]).score
        return res
    return eval_fn


def translate_train_with(args: TranslateTrainOptions) -> TrainResult:
    """:func:`translate_train` from a complete :class:`TranslateTrainOptions` (what the verb builds from its
    flags)."""
    import torch

    from ..data.translation import TokenBatchDataset, encode_pairs, read_parallel, train_joint_tokenizer, unwrap_collate
    from ..engine.train.trainer import Trainer
    from ..models.seq2seq import TransformerConfig, TransformerSeq2Seq
    r = build_translate_recipe(args)
    sec = r.extra["translate"]
    src, tgt = read_parallel(args.src, args.tgt)
    vsrc, vtgt = read_parallel(args.valid_src, args.valid_tgt)
    out = Path(args.out)
    with RunDir(out, overwrite=args.overwrite, resume=args.resume) as work:
        t0 = time.perf_counter()
        from tokenizers import Tokenizer
        tok_file = work / "tokenizer.json"
        if args.resume and tok_file.is_file():
            tok = Tokenizer.from_file(str(tok_file))
        else:
            tok = train_joint_tokenizer(src + tgt, int(sec["vocab_size"]), str(sec["tokenizer"]),
                                        name="translate.vocab_size")
        cfg = TransformerConfig.from_dict({**r.model, "vocab_size": tok.get_vocab_size()})
        limit, limit_key = length_limit(int(sec["max_len"]), cfg.max_positions)
        s_ids, t_ids, dropped = encode_pairs(tok, src, tgt, limit)
        if not s_ids:
            raise DataError(f"all {dropped} sentence pairs of --src/--tgt are longer than {limit} tokens "
                            f"(</s> included) and were dropped, so nothing is left to train on; raise "
                            f"{limit_key}")
        torch.manual_seed(r.train.seed)
        model = TransformerSeq2Seq(cfg)
        model.explicit_attention = r.impl.dtype == "bfloat16"  # faster on CPU under bf16; same numbers
        ds = TokenBatchDataset(s_ids, t_ids, int(sec["max_tokens"]), seed=r.train.seed)
        if args.resume:
            from .resume_policy import check_resume
            check_resume(work, len(ds), r.train, None, r)  # the run's verb, options, data size and batch
        prep_s = time.perf_counter() - t0
        if r.impl.progress:
            print(f"bertforge: {len(s_ids)} pairs ({dropped} longer than {limit} tokens dropped), vocab "
                  f"{tok.get_vocab_size()}, {len(ds)} batches/epoch, {model.num_parameters():,} parameters",
                  file=sys.stderr)

        def save_fn(m, d):
            m.save_pretrained(d, tokenizer=tok)

        eval_fn = make_eval_fn(model, tok, vsrc, vtgt, sec, r.impl.dtype)
        trainer = Trainer(model, ds, unwrap_collate, r, work, eval_fn=eval_fn, save_fn=save_fn)
        t1 = time.perf_counter()
        result = trainer.fit(resume=args.resume)
        result.update(train_seconds=round(time.perf_counter() - t1, 1), prep_seconds=round(prep_s, 1),
                      parameters=model.num_parameters(), vocab_size=tok.get_vocab_size(),
                      batches_per_epoch=len(ds))
    return TrainResult(out, result)


# -------------------------------------------------------------------------------------- decode
#: decode settings a flag may leave unset: the run's ``translate`` recipe section, else these (§6.1)
DECODE_KEYS = ("beam", "length_penalty", "max_len_a", "max_len_b")


def decode_settings(args, model=None) -> None:
    """Fill the unset decode settings of ``args`` from ``<model>/recipe.yaml`` (``translate.beam`` …; ``model``
    defaults to ``args.model``), the settings the run was trained with, else :data:`DEFAULT_RECIPE`'s (beam 4,
    α 0.6: Vaswani et al. 2017 §6.1)."""
    import yaml
    saved = {}
    f = Path(args.model if model is None else model) / "recipe.yaml"
    if f.is_file():
        try:
            saved = (yaml.safe_load(f.read_text(encoding="utf-8")) or {}).get("translate") or {}
        except (yaml.YAMLError, UnicodeDecodeError, AttributeError):
            saved = {}
    for key in DECODE_KEYS:
        if getattr(args, key) is None:
            value = saved.get(key, DEFAULT_RECIPE["translate"][key])
            whole = key in ("beam", "max_len_b")
            if whole and isinstance(value, float) and value.is_integer():
                value = int(value)
            try:
                require_number(f"translate.{key}", value, 1 if key == "beam" else 0, whole=whole)
            except ConfigError as e:
                raise ConfigError(f"{f}: {e}; fix it or pass --{key.replace('_', '-')}") from None
            setattr(args, key, value)


def check_decode(model, input, args: TranslateOptions) -> None:  # noqa: A002
    """The decode settings filled (:func:`decode_settings`) and checked, the threads set, ``output`` checked —
    before the model is read.

    Raises:
        ConfigError: naming the flag and its range; BertforgeError: an ``output`` path that is refused."""
    decode_settings(args, model)
    if args.beam < 1:
        raise ConfigError(f"--beam {args.beam}: the beam size must be ≥ 1 (1 = greedy)")
    require_number("--length-penalty", args.length_penalty, 0, note="GNMT α; 0 = none")
    require_number("--max-len-a", args.max_len_a, 0)
    require_number("--max-len-b", args.max_len_b, 0)
    if args.max_len_a == 0 and args.max_len_b < 1:
        raise ConfigError("--max-len-a 0 with --max-len-b 0 allows no output tokens; raise either")
    if args.threads is not None:
        require_number("--threads", args.threads, 1, whole=True)
    require_number("--batch-tokens", args.batch_tokens, 1, whole=True)
    if args.output:
        from .outputs import check_out_file
        inputs = (str(input),) if isinstance(input, (str, Path)) else ()
        check_out_file(Path(args.output), (model,), inputs, args.overwrite, flag="--output", example="hyp.txt")
        if isinstance(args.reference, (str, Path)) and Path(args.reference).resolve() == Path(args.output).resolve():
            raise ConfigError(f"--output {args.output} is the --reference file; choose another --output")


def translate_with(model, input, args: TranslateOptions) -> TranslateResult:  # noqa: A002
    """:func:`translate` from a complete :class:`TranslateOptions` (what the verb builds from its flags)."""
    model = str(model)
    check_decode(model, input, args)
    import torch

    from ..data.translation import read_lines
    from ..models.decoding import translate_texts
    from ..models.seq2seq import TransformerSeq2Seq
    from ..tokenizer import load_tokenizer
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.bf16:
        from ..engine.train.precision import warn_if_emulated
        warn_if_emulated("bfloat16")
    net = TransformerSeq2Seq.from_pretrained(model)
    net.explicit_attention = bool(args.bf16)
    tok = load_tokenizer(model)
    sents = read_lines(input) if isinstance(input, (str, Path)) else [str(s) for s in input]
    refs = args.reference
    refs = read_lines(refs) if isinstance(refs, (str, Path)) else None if refs is None else [str(s) for s in refs]
    if refs is not None and len(refs) != len(sents):
        raise ConfigError(f"--reference has {len(refs)} lines but --input has {len(sents)}; they must align")
    t0 = time.perf_counter()
    hyps = translate_texts(net, tok, sents, beam=args.beam, length_penalty=args.length_penalty,
                           max_len_a=args.max_len_a, max_len_b=args.max_len_b, batch_tokens=args.batch_tokens,
                           dtype="bfloat16" if args.bf16 else "float32")
    res = TranslateResult(hyps, len(sents), args.beam, time.perf_counter() - t0)
    if args.output:
        from ..io import atomic_write_text
        atomic_write_text(Path(args.output), "\n".join(hyps) + "\n")
        res.output = Path(args.output)
    if refs is not None:
        import sacrebleu
        metric = sacrebleu.BLEU()
        bleu = metric.corpus_score(hyps, [refs])
        res.bleu, res.signature, res.bleu_detail = bleu.score, str(metric.get_signature()), str(bleu)
    return res


__all__ = ["DEFAULT_RECIPE", "TranslateTrainOptions", "TranslateOptions", "TranslateResult", "translate_train",
           "translate_train_with", "translate", "translate_with", "build_translate_recipe", "decode_settings"]
