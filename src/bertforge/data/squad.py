"""Extractive QA data: SQuAD v1.1 / v2.0 JSON, an article-level split, sliding-window features and
n-best span decoding back to the original context characters.

* SQuAD (Rajpurkar et al. 2016; v2.0 with unanswerable questions: Rajpurkar et al. 2018):
  ``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers":
  [{"text", "answer_start"}], "is_impossible"?}]}]}]}``. JSONL with ``id``/``question``/``context``
  (/``answers``) per line is read too.
* Windows (Devlin et al. 2018 §4.2; BERT ``run_squad.py``): ``[CLS] question [SEP] context-window
  [SEP]``; a context longer than the window is cut into windows that overlap by ``doc_stride`` tokens
  (``transformers`` convention: the overlap, not the step). Questions longer than ``max_query_len``
  tokens are truncated. A window that does not contain the whole answer is labelled (0, 0) = [CLS].
* Decoding: per window the ``n_best`` start and end logits over context tokens, spans with
  start ≤ end and length ≤ ``max_answer_len`` tokens, score = start + end logit; best over windows.
  v2.0: the null score s_null = start[CLS] + end[CLS] (minimum over windows); the answer is empty
  when s_null − best > ``null_threshold`` (Devlin et al. 2018 §4.3). The answer text is
  ``context[offset[start].begin : offset[end].end]`` — the original characters, accents and
  inner whitespace included.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import DataError
from .readers import split_lines


@dataclass
class QAExample:
    """One question. ``answers``: list of ``{"text", "answer_start"}`` (character offset in
    ``context``); empty for an unanswerable v2.0 question or an unlabelled input."""

    id: str
    question: str
    context: str
    answers: list = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""


# ------------------------------------------------------------------------------------------ readers
def _load_json(path: Path):
    if not path.is_file() or path.stat().st_size == 0:
        raise DataError(f"{path} does not exist or is empty; pass a SQuAD JSON file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8; re-encode it as UTF-8") from None
    if path.suffix.lower() == ".jsonl":
        rows = []
        for i, line in enumerate(split_lines(text), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{i} is not valid JSON ({e.msg}); one object per line") from None
        return rows
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); fix the file") from None


def examples_from_squad(data: dict, path="<data>", require_answers: bool = True) -> list:
    """SQuAD-format dict → :class:`QAExample` list. Raises DataError on a malformed layout or an
    answer whose ``answer_start`` does not point at its text."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f"{path} is not SQuAD JSON (no top-level 'data' list); pass a SQuAD v1.1/v2.0 file")
    try:
        return _squad_examples(data, path, require_answers)
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{path} does not follow the SQuAD layout (data → paragraphs → context, qas → id, "
                        f"question, answers; {type(e).__name__}: {str(e)[:60]}); fix the file") from None


def _squad_examples(data: dict, path, require_answers: bool) -> list:
    out = []
    for art in data["data"]:
        title = art.get("title", "")
        for para in art.get("paragraphs", []):
            for qa in para.get("qas", []):
                out.append(_example(path, f"question {qa['id']}", qa["id"], qa["question"], para["context"],
                                    qa.get("answers"), qa.get("is_impossible", False), title, require_answers))
    if not out:
        raise DataError(f"{path} has no questions; pass a non-empty SQuAD file")
    return out


def _example(path, where: str, qid, question, context, answers, impossible, title,
             require_answers: bool) -> QAExample:
    """One checked :class:`QAExample`: text question and context, answers as ``{"text", "answer_start"}``
    objects whose offsets point at their text. Raises DataError naming ``where``."""
    for name, value in (("question", question), ("context", context)):
        if not isinstance(value, str):
            raise DataError(f"{path}: {where} has a {type(value).__name__} {name!r}; it must be text")
    if isinstance(answers, dict):  # HF datasets layout {"text": [...], "answer_start": [...]}
        answers = [{"text": t, "answer_start": a} for t, a in zip(answers.get("text") or [],
                                                                   answers.get("answer_start") or [])]
    answers = list(answers or [])
    for a in answers:
        if not (isinstance(a, dict) and isinstance(a.get("text"), str)
                and isinstance(a.get("answer_start"), int) and not isinstance(a.get("answer_start"), bool)):
            raise DataError(f"{path}: {where} has an answer {str(a)[:60]!r}; write answers as "
                            f'[{{"text": "...", "answer_start": <character offset>}}]')
        st = a["answer_start"]
        if st < 0 or context[st:st + len(a["text"])] != a["text"]:
            raise DataError(f"{path}: {where} answer {a['text']!r} is not at answer_start {st} of its "
                            f"context; fix the offsets")
    impossible = bool(impossible)
    if require_answers and not answers and not impossible:
        raise DataError(f"{path}: {where} has no answers and is not marked is_impossible; labelled data "
                        f"is needed here")
    return QAExample(str(qid), question, context, answers, impossible, str(title or ""))


def _check_unique_ids(examples: list, path) -> None:
    seen: set = set()
    for e in examples:
        if e.id in seen:
            raise DataError(f"{path}: question id {e.id!r} appears more than once; give each question its "
                            f"own id (the metrics are per id)")
        seen.add(e.id)


def read_squad(path, max_samples: Optional[int] = None, require_answers: bool = True) -> list:
    """Read SQuAD v1.1/v2.0 JSON (or JSONL of ``id, question, context, answers?``) into examples.

    Raises:
        DataError: missing/empty/invalid file, wrong layout, a non-text question or context, answers that
        are not ``{"text", "answer_start"}`` objects or do not match their offsets, a repeated id.
    """
    path = Path(path)
    data = _load_json(path)
    if isinstance(data, list):  # JSONL
        out = []
        for i, r in enumerate(data):
            if not isinstance(r, dict):
                raise DataError(f"{path}: item {i + 1} is a JSON {type(r).__name__}, not an object; pass SQuAD "
                                f"JSON (a top-level 'data' list) or JSONL rows of id, question, context")
            for k in ("question", "context"):
                if k not in r:
                    raise DataError(f"{path}: row {i + 1} has no {k!r}; each line needs id, question, context")
            out.append(_example(path, f"row {i + 1}", r.get("id", i), r["question"], r["context"],
                                r.get("answers"), r.get("is_impossible", False), r.get("title", ""),
                                require_answers))
        examples = out
    else:
        examples = examples_from_squad(data, path, require_answers)
    _check_unique_ids(examples, path)
    return examples[:max_samples] if max_samples is not None else examples


def split_by_article(data: dict, eval_fraction: float = 0.2, seed: int = 0) -> tuple:
    """Deterministic article-level split of a SQuAD dict: no article is in both parts.

    Articles are ordered by ``sha1(f"{seed}:{title}")`` and taken into the eval part until it holds
    at least ``eval_fraction`` of the questions; the rest is the train part (original order kept in
    both). Returns ``(train_dict, eval_dict)`` in SQuAD layout.
    Raises:
        DataError: not SQuAD JSON, fewer than two articles, fraction outside (0, 1).
    """
    if not 0.0 < eval_fraction < 1.0:
        raise DataError(f"eval fraction {eval_fraction} must be in (0, 1)")
    arts = data.get("data") if isinstance(data, dict) else None
    if not isinstance(arts, list) or len(arts) < 2:
        raise DataError("an article split needs SQuAD JSON with at least two articles")

    def nq(a):
        return sum(len(p.get("qas", [])) for p in a.get("paragraphs", []))

    total = sum(nq(a) for a in arts)
    order = sorted(range(len(arts)), key=lambda i: hashlib.sha1(
        f"{seed}:{arts[i].get('title', i)}".encode()).hexdigest())
    ev, n = set(), 0
    for i in order:
        if n >= eval_fraction * total or len(ev) == len(arts) - 1:
            break
        ev.add(i)
        n += nq(arts[i])
    version = data.get("version", "")
    train = {"version": version, "data": [a for i, a in enumerate(arts) if i not in ev]}
    evl = {"version": version, "data": [a for i, a in enumerate(arts) if i in ev]}
    return train, evl


# ----------------------------------------------------------------------------------------- features
def encode_qa_windows(tok, examples: list, max_seq_len: int = 384, doc_stride: int = 128,
                      max_query_len: int = 64, with_labels: bool = True) -> list:
    """Question/context pairs → windows (dicts) for the QA head.

    Each dict: ``input_ids``, ``token_type_ids``, ``example_index``, ``offsets`` (per token: (begin, end)
    character span in the context, or None outside the context), ``start_positions`` /
    ``end_positions`` (token indices of the gold answer, 0 = [CLS] when the window misses it; only with
    ``with_labels`` and an answer present — the first gold answer is used for training).
    Raises:
        DataError: ``max_seq_len`` too small for the question plus at least 8 context tokens, or
            ``doc_stride`` not smaller than the context room.
    """
    # truncate long questions (in characters, at the end of the last kept token)
    questions = []
    q_encs = tok.encode_batch([e.question for e in examples], add_special_tokens=False)
    for e, qe in zip(examples, q_encs):
        q = e.question.strip()
        if len(qe.ids) > max_query_len:
            q = e.question[:qe.offsets[max_query_len - 1][1]]
        questions.append(q)
    # the tokenizer panics (a Rust panic, not an Exception) when the stride is not below the context room
    longest_q = max((min(len(qe.ids), max_query_len) for qe in q_encs), default=0)
    room = max_seq_len - tok.num_special_tokens_to_add(True) - longest_q
    if doc_stride >= room:
        raise DataError(f"max_seq_len={max_seq_len} leaves {max(room, 0)} context tokens beside the longest "
                        f"question ({longest_q} tokens), not more than the window overlap doc_stride="
                        f"{doc_stride}; raise --max-seq-len (or lower the stride)")
    tok.enable_truncation(max_length=max_seq_len, stride=doc_stride, strategy="only_second")
    try:
        encs = tok.encode_batch(list(zip(questions, [e.context for e in examples])))
    except BaseException as e:  # also the tokenizer's Rust panic (pyo3 PanicException is a BaseException)
        if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        raise DataError(f"cannot fit the question and context windows in max_seq_len={max_seq_len} with "
                        f"doc_stride={doc_stride} ({str(e)[:100]}); raise --max-seq-len or lower the "
                        f"stride") from None
    finally:
        tok.no_truncation()
    out = []
    for ei, (e, enc) in enumerate(zip(examples, encs)):
        ans = e.answers[0] if (with_labels and e.answers and not e.is_impossible) else None
        for w in [enc] + list(enc.overflowing):
            if len(w.ids) > max_seq_len:  # the tokenizer keeps a pair whole when max_length cannot hold it
                raise DataError(f"max_seq_len={max_seq_len} cannot hold the question, its special tokens and "
                                f"some context; raise --max-seq-len")
            seq = w.sequence_ids
            offs = [tuple(o) if s == 1 else None for o, s in zip(w.offsets, seq)]
            d = {"input_ids": list(w.ids), "token_type_ids": list(w.type_ids), "example_index": ei,
                 "offsets": offs}
            if with_labels and (ans is not None or e.is_impossible):
                d["start_positions"], d["end_positions"] = _answer_tokens(offs, ans)
            out.append(d)
    return out


def _answer_tokens(offs: list, ans: Optional[dict]) -> tuple:
    """Token indices (start, end) of a character answer span inside one window, (0, 0) if absent."""
    if ans is None:
        return 0, 0
    s_char = ans["answer_start"]
    e_char = s_char + len(ans["text"])
    ctx = [i for i, o in enumerate(offs) if o is not None]
    if not ctx or offs[ctx[0]][0] > s_char or offs[ctx[-1]][1] < e_char:
        return 0, 0
    start = next((i for i in ctx if offs[i][1] > s_char), ctx[-1])
    end = next((i for i in reversed(ctx) if offs[i][0] < e_char), start)
    return start, max(start, end)


def max_context_windows(windows: list) -> dict:
    """For the windows of one example: context token (its character offsets) → index of the window
    where it has the most context, BERT's ``_check_is_max_context`` (google-research/bert run_squad.py):
    score = min(tokens left of it, tokens right of it in the window's context) + 0.01 · context length;
    the first window wins a tie. A token's span is decoded only from that window (as a start token)."""
    home: dict = {}
    for wi, w in enumerate(windows):
        ctx = [tuple(o) for o in w["offsets"] if o is not None]
        n = len(ctx)
        for j, key in enumerate(ctx):
            score = min(j, n - 1 - j) + 0.01 * n
            if key not in home or score > home[key][0]:
                home[key] = (score, wi)
    return {k: wi for k, (_, wi) in home.items()}


def decode_answers(examples: list, windows: list, start_logits: list, end_logits: list,
                   n_best: int = 20, max_answer_len: int = 30, version_2: bool = False,
                   null_threshold: float = 0.0) -> list:
    """n-best span decoding over all windows of each example (Devlin et al. 2018 §4.3; google-research/bert
    run_squad.py ``write_predictions``: a start token is taken only from the window where it has the
    most context, :func:`max_context_windows`).

    Args:
        examples: the :class:`QAExample` list the windows were built from.
        windows: dicts of :func:`encode_qa_windows` (``example_index``, ``offsets``).
        start_logits, end_logits: per window, 1-D arrays (T_w,).
        n_best: start and end candidates kept per window.
        max_answer_len: longest span in tokens.
        version_2: allow the empty answer (SQuAD v2.0).
    Returns: per example ``{"id", "answer", "start" (char, −1 when empty), "score", "null_score"}``.
    """
    by_ex: dict = {}
    for w, s, e in zip(windows, start_logits, end_logits):
        by_ex.setdefault(w["example_index"], []).append((w, np.asarray(s, dtype=np.float64),
                                                         np.asarray(e, dtype=np.float64)))
    out = []
    for ei, ex in enumerate(examples):
        best = None  # (score, begin_char, end_char)
        null = None
        wins = by_ex.get(ei, [])
        home = max_context_windows([w for w, _, _ in wins])
        for wi, (w, s, e) in enumerate(wins):
            offs = w["offsets"]
            t = min(len(offs), len(s))
            ns = s[0] + e[0]
            null = ns if null is None else min(null, ns)
            ctx = np.array([i for i in range(t) if offs[i] is not None], dtype=np.int64)
            if ctx.size == 0:
                continue
            ss = ctx[np.argsort(-s[ctx], kind="stable")[:n_best]]
            es = ctx[np.argsort(-e[ctx], kind="stable")[:n_best]]
            for a in ss:
                if home[tuple(offs[a])] != wi:  # another window sees this start token with more context
                    continue
                for b in es:
                    if b < a or b - a + 1 > max_answer_len:
                        continue
                    sc = s[a] + e[b]
                    if best is None or sc > best[0]:
                        best = (float(sc), offs[a][0], offs[b][1])
        if best is None or (version_2 and null is not None and null - best[0] > null_threshold):
            out.append({"id": ex.id, "answer": "", "start": -1,
                        "score": float(null) if null is not None else 0.0,
                        "null_score": float(null) if null is not None else 0.0})
        else:
            out.append({"id": ex.id, "answer": ex.context[best[1]:best[2]], "start": int(best[1]),
                        "score": best[0], "null_score": float(null) if null is not None else 0.0})
    return out
