"""Retrieval data in the BEIR layout, and a SQuAD → BEIR helper with an article-disjoint split.

The BEIR layout (Thakur et al. 2021, "BEIR: A Heterogeneous Benchmark for Zero-shot Evaluation of
Information Retrieval Models", §3 and the ``beir`` package's ``GenericDataLoader``)::

    DIR/corpus.jsonl      {"_id": "d1", "title": "…", "text": "…"}     one document a line
    DIR/queries.jsonl     {"_id": "q1", "text": "…"}                   one query a line
    DIR/qrels/test.tsv    query-id <TAB> corpus-id <TAB> score          a header line, then one judgement a line

A document's text for embedding is ``title + " " + text`` (``text`` alone when the title is empty), as BEIR's
dense-retrieval models read it. Only the queries that have a judgement in the split's qrels are evaluated.

:func:`squad_to_beir` turns a SQuAD JSON file into that layout: every paragraph is a document, every question
a query whose one relevant document (score 1) is the paragraph it was asked about. The articles are split
disjointly (:func:`bertforge.data.squad.split_by_article`): the questions of the eval articles are judged in
``qrels/test.tsv``, those of the train articles in ``qrels/train.tsv`` and written again as training pairs in
``train.jsonl`` (``{"query", "positive", "query_id", "corpus_id"}``), which ``finetune --task retrieval`` reads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import DataError
from .readers import split_lines


@dataclass
class BeirData:
    """One split of a BEIR dir.

    Attributes:
        corpus: document id → text to embed (``title + " " + text``, or ``text``).
        queries: query id → text; only the queries judged in ``qrels``.
        qrels: query id → {document id: relevance grade (int; > 0 relevant)}.
        titles: document id → title (may be empty), for display.
        path: the dir read.
    """

    corpus: dict
    queries: dict
    qrels: dict
    titles: dict = field(default_factory=dict)
    path: Optional[Path] = None


def _read_jsonl(path: Path, what: str, fields: tuple) -> list:
    """[(line_no, id, {field: str})] of a JSONL file; DataError with ``path:line`` for a bad line."""
    if not path.is_file():
        raise DataError(f"{path} does not exist; a BEIR dir holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8; re-encode it as UTF-8") from None
    rows, seen = [], {}
    for i, line in enumerate(split_lines(text), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{i} is not valid JSON ({e.msg}); one {what} object per line") from None
        if not isinstance(obj, dict) or "_id" not in obj:
            raise DataError(f"{path}:{i} has no \"_id\"; each line is {{\"_id\": …, \"text\": …}}")
        did = str(obj["_id"]).strip()
        if not did:
            raise DataError(f"{path}:{i} has an empty \"_id\"; give every {what} an id")
        if did in seen:
            raise DataError(f"{path}:{i} repeats {what} id {did!r} (first at line {seen[did]}); ids must be unique")
        seen[did] = i
        vals = {}
        for f in fields:
            v = obj.get(f, "")
            if v is None:
                v = ""
            if not isinstance(v, str):
                raise DataError(f"{path}:{i} field {f!r} of {what} {did!r} is {type(v).__name__}, not text")
            vals[f] = v
        rows.append((i, did, vals))
    if not rows:
        raise DataError(f"{path} holds no {what}; one JSON object per line")
    return rows


def read_qrels(path: Path) -> tuple:
    """``qrels/<split>.tsv`` → ``({qid: {did: grade}}, {(qid, did): line_no})``. A first line whose third
    field is not a number is the header. Raises DataError (``path:line``) for a line without 3 fields, a grade
    that is not an integer, a repeated (query, document) pair, a file without judgements or without a relevant
    one (score ≥ 1)."""
    if not path.is_file():
        split_dir = path.parent
        have = sorted(p.stem for p in split_dir.glob("*.tsv")) if split_dir.is_dir() else []
        raise DataError(f"{path} does not exist; pass --split " + (" or ".join(have) if have else "<a qrels/*.tsv name>")
                        + " (retrieval-eval; finetune and distill --eval read qrels/test.tsv)")
    qrels: dict = {}
    where: dict = {}
    first = True
    for i, line in enumerate(split_lines(path.read_text(encoding="utf-8-sig")), 1):
        if not line.strip():
            continue
        was_first, first = first, False
        parts = line.rstrip("\r\n").split("\t")
        if len(parts) < 3:
            parts = line.split()
        if len(parts) == 4:  # TREC qrels: qid 0 did grade
            parts = [parts[0], parts[2], parts[3]]
        if len(parts) != 3:
            raise DataError(f"{path}:{i} has {len(parts)} fields; each line is query-id<TAB>corpus-id<TAB>score")
        q, d, s = (p.strip() for p in parts)
        try:
            grade = int(s)
        except ValueError:
            if was_first:
                continue  # the header: query-id corpus-id score
            raise DataError(f"{path}:{i} score {s!r} is not an integer relevance grade") from None
        if (q, d) in where:
            raise DataError(f"{path}:{i} repeats the judgement of query {q!r} on document {d!r} "
                            f"(first at line {where[(q, d)]}); keep one")
        where[(q, d)] = i
        qrels.setdefault(q, {})[d] = grade
    if not qrels:
        raise DataError(f"{path} holds no judgements; each line is query-id<TAB>corpus-id<TAB>score")
    if not any(g > 0 for r in qrels.values() for g in r.values()):  # every metric would be 0 by construction
        raise DataError(f"{path} marks no document relevant (every score ≤ 0); relevant pairs need a score ≥ 1")
    return qrels, where


def read_beir(data_dir, split: str = "test") -> BeirData:
    """Read one split of a BEIR dir (layout in the module docstring).

    Returns:
        :class:`BeirData` whose ``queries`` are the queries judged in ``qrels/<split>.tsv`` and whose ``qrels``
        keep every judgement (grade 0 included: not relevant, as in pytrec_eval).
    Raises:
        DataError: a missing file; a line that is not JSON or has no ``_id``; a repeated document or query id;
        an empty query text; a qrels line naming a query or document id that the files do not hold — each
        with ``file:line``.
    """
    d = Path(data_dir)
    if not d.is_dir():
        raise DataError(f"--data {d} is not a directory; pass a BEIR dir (corpus.jsonl, queries.jsonl, qrels/)")
    corpus, titles = {}, {}
    for _, did, v in _read_jsonl(d / "corpus.jsonl", "document", ("title", "text")):
        title, text = v["title"].strip(), v["text"]
        corpus[did] = f"{title} {text}" if title else text
        titles[did] = title
    qpath = d / "queries.jsonl"
    qrows = _read_jsonl(qpath, "query", ("text",))
    qpath_lines = {qid: i for i, qid, _ in qrows}
    all_queries = {qid: v["text"] for _, qid, v in qrows}
    rpath = d / "qrels" / f"{split}.tsv"
    qrels, where = read_qrels(rpath)
    for (q, doc), i in where.items():
        if q not in all_queries:
            raise DataError(f"{rpath}:{i} names query {q!r}, which {qpath.name} does not hold; fix the id or "
                            f"add the query")
        if doc not in corpus:
            raise DataError(f"{rpath}:{i} names document {doc!r}, which corpus.jsonl does not hold; fix the id "
                            f"or add the document")
    queries = {}
    for q in qrels:
        if not all_queries[q].strip():
            raise DataError(f"{qpath}:{qpath_lines[q]} query {q!r} has an empty text; give it a text or drop it "
                            f"and its judgements")
        queries[q] = all_queries[q]
    return BeirData(corpus, queries, qrels, titles, d)


def write_beir(out_dir, corpus: dict, queries: dict, qrels_by_split: dict, titles: Optional[dict] = None,
               extra_files: Optional[dict] = None) -> Path:
    """Write a BEIR dir atomically (the whole dir appears at once; an existing one is replaced only when the
    new one is complete). ``corpus``: id → text (or id → {"title", "text"}); ``queries``: id → text;
    ``qrels_by_split``: split name → {qid: {did: grade}}; ``extra_files``: name → text written beside them.
    Returns ``out_dir``.
    Raises DataError for a judgement naming an id the corpus or queries lack (nothing is written)."""
    from ..io import atomic_dir
    for split, qrels in qrels_by_split.items():
        for q, docs in qrels.items():
            if q not in queries:
                raise DataError(f"qrels {split}: query {q!r} is not among the queries")
            for did in docs:
                if did not in corpus:
                    raise DataError(f"qrels {split}: document {did!r} is not in the corpus")
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        with open(tmp / "corpus.jsonl", "w", encoding="utf-8") as f:
            for did, doc in corpus.items():
                if isinstance(doc, dict):
                    row = {"_id": did, "title": doc.get("title", ""), "text": doc.get("text", "")}
                else:
                    row = {"_id": did, "title": (titles or {}).get(did, ""), "text": doc}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        with open(tmp / "queries.jsonl", "w", encoding="utf-8") as f:
            for qid, text in queries.items():
                f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
        (tmp / "qrels").mkdir()
        for split, qrels in qrels_by_split.items():
            with open(tmp / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
                f.write("query-id\tcorpus-id\tscore\n")
                for q, docs in qrels.items():
                    for did, g in docs.items():
                        f.write(f"{q}\t{did}\t{int(g)}\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
    return out


def squad_to_beir(squad_json, out_dir, eval_fraction: float = 0.2, seed: int = 0) -> dict:
    """A SQuAD v1.1/v2.0 JSON file → a BEIR dir: paragraphs are the corpus (ids ``a<article>-p<paragraph>``,
    empty title), questions the queries (their SQuAD ids), each judged relevant (1) to its own paragraph only.
    SQuAD v2.0 questions marked impossible are kept: their paragraph is still the one they were asked about.

    Articles are split disjointly by :func:`bertforge.data.squad.split_by_article` (``eval_fraction`` of the
    questions, deterministic in ``seed``): ``qrels/test.tsv`` judges the eval articles' questions,
    ``qrels/train.tsv`` the train articles' ones, also written as ``train.jsonl`` training pairs
    ``{"query", "positive", "query_id", "corpus_id"}``; ``split.json`` lists the articles of each part.
    ``eval_fraction=1.0``: every article is in ``test`` (no train part; the whole file as one retrieval set).
    A paragraph text that occurs twice is one document. Returns counts (``documents``, ``train_queries`` …).

    Raises:
        DataError: not SQuAD JSON, fewer than two articles for a split, a fraction outside (0, 1].
    """
    from .squad import _load_json, split_by_article
    path = Path(squad_json)
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f"{path} is not SQuAD JSON (no top-level 'data' list); pass a SQuAD v1.1/v2.0 file")
    if not 0.0 < eval_fraction <= 1.0:
        raise DataError(f"eval fraction {eval_fraction} must be in (0, 1]")
    if eval_fraction == 1.0:
        train_d, eval_d = {"data": []}, data
    else:
        train_d, eval_d = split_by_article(data, eval_fraction, seed)
    eval_titles = {a.get("title") for a in eval_d["data"]}
    corpus, queries, by_text = {}, {}, {}
    qrels = {"train": {}, "test": {}}
    pairs = []
    split_articles = {"train": [], "test": []}
    try:
        for ai, art in enumerate(data["data"]):
            title = art.get("title", f"article{ai}")
            part = "test" if (eval_fraction == 1.0 or title in eval_titles) else "train"
            split_articles[part].append(title)
            for pi, para in enumerate(art["paragraphs"]):
                ctx = para["context"]
                did = by_text.get(ctx)
                if did is None:
                    did = by_text[ctx] = f"a{ai}-p{pi}"
                    corpus[did] = ctx
                for qa in para.get("qas", []):
                    qid, q = str(qa["id"]), qa["question"].strip()
                    if not q or qid in queries:
                        continue
                    queries[qid] = q
                    qrels[part][qid] = {did: 1}
                    if part == "train":
                        pairs.append({"query": q, "positive": ctx, "query_id": qid, "corpus_id": did})
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{path} does not follow the SQuAD layout (data → paragraphs → context, qas → id, "
                        f"question): {type(e).__name__} {e}") from None
    if not qrels["train"]:
        qrels.pop("train")
    out = Path(out_dir)
    extra = {"split.json": json.dumps({"source": str(path), "eval_fraction": eval_fraction, "seed": seed,
                                       "articles": split_articles}, ensure_ascii=False, indent=1)}
    if pairs:
        extra["train.jsonl"] = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs)
    write_beir(out, corpus, queries, qrels, extra_files=extra)
    return {"out": str(out), "documents": len(corpus), "queries": len(queries),
            "train_queries": len(qrels.get("train", {})), "test_queries": len(qrels["test"]),
            "train_articles": len(split_articles["train"]), "test_articles": len(split_articles["test"])}


def read_documents(path) -> list:
    """A plain-text file of documents — one sentence a line, a blank line between documents (what
    ``embedded-corpus`` writes as ``train.txt`` / ``heldout.txt``) — as a list of sentence lists."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; pass a text file (one sentence a line, blank line between "
                        f"documents)")
    docs, cur = [], []
    for line in split_lines(path.read_text(encoding="utf-8-sig")):
        if line.strip():
            cur.append(line.strip())
        elif cur:
            docs.append(cur)
            cur = []
    if cur:
        docs.append(cur)
    return docs


def passage_set(documents: list, sentences_per_passage: int = 4, max_passages: int = 200) -> BeirData:
    """A small retrieval set from plain documents, with no labels needed: each document is cut into passages
    of ``sentences_per_passage`` consecutive sentences; from each passage its middle sentence is taken out
    as the query and the rest is the one relevant document (the inverse cloze task of Lee, Chang &
    Toutanova 2019, "Latent Retrieval for Weakly Supervised Open Domain QA", §5). Passages with fewer
    sentences (a document's tail) are left out; when there are more than ``max_passages``, that many are
    kept, evenly spaced over the documents (deterministic). Ids: ``p<i>`` / ``q<i>``.
    Raises DataError when no passage can be formed."""
    groups = []
    for doc in documents:
        for s in range(0, len(doc) - sentences_per_passage + 1, sentences_per_passage):
            groups.append(doc[s:s + sentences_per_passage])
    if not groups:
        raise DataError(f"no document has {sentences_per_passage} sentences; pass longer documents")
    if len(groups) > max_passages:
        step = len(groups) / max_passages
        groups = [groups[int(i * step)] for i in range(max_passages)]
    corpus, queries, qrels = {}, {}, {}
    for i, g in enumerate(groups):
        mid = len(g) // 2
        corpus[f"p{i}"] = " ".join(g[:mid] + g[mid + 1:])
        queries[f"q{i}"] = g[mid]
        qrels[f"q{i}"] = {f"p{i}": 1}
    return BeirData(corpus, queries, qrels)


__all__ = ["BeirData", "read_beir", "read_qrels", "write_beir", "squad_to_beir", "read_documents", "passage_set"]
