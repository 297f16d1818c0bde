"""A corpus larger than memory embedded into shards of vectors (+ ids) from Python: :func:`embed_corpus` (what
``bertforge embed`` runs) — resumable, split across ``torchrun`` ranks.

Inputs are read lazily (``.txt``: one text per line, id = line number; ``.jsonl``: ``id`` / ``_id`` +
``text``), checked in one pass before anything is written, and cut into shards of ``shard_size`` records.
Each shard is written as ``shard-NNNNN.npy`` (float32 (n, d): the model's pooled vectors, as the dir
declares its pooling), ``shard-NNNNN.ids.json`` and, last, ``shard-NNNNN.json`` (count, size, sha256) — each
file through a temporary name and a rename, so a killed run leaves no half-written shard under a final name.
``manifest.json`` records the model, inputs and shard plan. Running it again resumes: a shard whose record,
size and sha256 agree is kept, any other is computed again. Under ``torchrun`` rank r takes shards r, r+W,
r+2W, … (the same vectors as one process); rank 0 then writes the index. Memory stays bounded by one shard of
vectors plus one chunk of texts, whatever the input size. (:func:`bertforge.embed` embeds a list in memory.)

    >>> import bertforge
    >>> from bertforge.pipelines.embed_corpus import read_shards
    >>> r = bertforge.embed_corpus("minilm", ["corpus.jsonl"], "runs/corpus-vecs", index="faiss")
    >>> vectors, ids = read_shards(r.out)        # (N, 384) float32, the records' ids in order
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ..checkpoint.modeldir import resolve
from ..errors import BertforgeError, ConfigError
from .options import options_from, python_names

#: texts tokenised and embedded at once inside a shard (bounds the memory of tokenised text)
CHUNK = 4096

#: manifest format tag
FORMAT = "bertforge-embeddings/1"


@dataclass
class EmbedCorpusOptions:
    """Options of :func:`embed_corpus` — the flags of ``bertforge embed`` with ``_`` for ``-``, same defaults.
    ``backend``: ``"auto"`` (what the dir holds), ``"torch"`` or ``"onnxruntime"``; ``index``: ``"faiss"`` to
    also build an index of all shards (``index_kind``: ``"flat"`` (exact, default), ``"hnsw"`` or ``"ivf"``);
    ``overwrite``: recompute every shard (an ``out`` holding an embedding of other inputs needs it)."""

    shard_size: int = 100_000
    batch_size: int = 64
    #: tokens per text; None: the dir's ``max_seq_length`` capped at its positions (what ``serve`` cuts at)
    max_seq_len: Optional[int] = None
    threads: Optional[int] = None
    backend: str = "auto"
    index: Optional[str] = None
    index_kind: Optional[str] = None
    overwrite: bool = False


@dataclass
class EmbedCorpusResult:
    """The embedding folder ``out`` and the run's record (see :func:`embed_shards`; ``complete``: every shard
    is there)."""

    out: Path
    record: dict


def embed_corpus(model, inputs: Union[str, Path, list], out, **options) -> EmbedCorpusResult:
    """Embed the texts of ``inputs`` (``.txt`` / ``.jsonl`` files) with ``model`` (an embedding model dir:
    checkpoint, static or export dir, or ``"minilm"``) into shards under ``out``; ``options``: the fields of
    :class:`EmbedCorpusOptions`. Read the vectors back with :func:`read_shards`.

    Raises:
        ConfigError: an option out of range; a model that outputs logits only. BertforgeError: an ``out`` that
            is a file, overlaps the model or another run, or holds an embedding of other inputs (without
            ``overwrite``). DataError: an unreadable input record (all before anything is written)."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    opts = options_from(EmbedCorpusOptions, "embed_corpus", options)
    with python_names(EmbedCorpusOptions):
        return embed_corpus_with(model, [str(i) for i in inputs], out, opts)


def embed_corpus_with(model, inputs: list, out, args: EmbedCorpusOptions) -> EmbedCorpusResult:
    """:func:`embed_corpus` from a complete :class:`EmbedCorpusOptions` (what the verb builds from its flags)."""
    from ..data.stream import check_inputs, plan_shards
    for flag, v in (("--shard-size", args.shard_size), ("--batch-size", args.batch_size),
                    ("--max-seq-len", 1 if args.max_seq_len is None else args.max_seq_len)):
        if v < 1:
            raise ConfigError(f"{flag} {v}: pass a positive number")
    for flag, v, choices in (("--backend", args.backend, ("auto", "torch", "onnxruntime")),
                             ("--index", args.index, (None, "faiss")),
                             ("--index-kind", args.index_kind, (None, "flat", "hnsw", "ivf"))):
        if v not in choices:  # the CLI's choices; a Python caller's typo
            raise ConfigError(f"{flag} {v!r}: choose one of {', '.join(c for c in choices if c)}")
    if args.index_kind and not args.index:
        raise ConfigError("--index-kind picks the kind of --index faiss; add --index faiss or drop it")
    inputs = check_inputs(inputs)
    model_dir = resolve(str(model))
    if not model_dir.exists():
        raise BertforgeError(f"--model {model} does not exist; pass an embedding model dir or 'minilm'")
    out = Path(out)
    check_out(out, model_dir)
    plan = plan_shards(inputs, args.shard_size)  # every record checked before anything is written
    return EmbedCorpusResult(out, embed_shards(model_dir, inputs, out, plan, args))


def shard_name(i: int) -> str:
    return f"shard-{i:05d}"


def _sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def shard_done(out: Path, shard: dict, dim: int) -> bool:
    """Whether shard ``shard`` of ``out`` is complete: its record exists and its vectors file has the size
    and sha256 the record gives (``count`` × ``dim`` float32) and its ids file ``count`` ids."""
    name = shard_name(shard["index"])
    try:
        rec = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
        npy, ids = out / f"{name}.npy", out / f"{name}.ids.json"
        if rec.get("count") != shard["count"] or rec.get("dim") != dim or rec.get("start") != shard["start"]:
            return False
        if not npy.is_file() or npy.stat().st_size != rec.get("bytes"):
            return False
        if len(json.loads(ids.read_text(encoding="utf-8"))) != shard["count"]:
            return False
        return _sha256(npy) == rec.get("sha256")
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def _atomic_npy(path: Path, arr) -> None:
    import numpy as np

    from ..io import owner_tag
    tmp = path.with_name(f".{path.name}.{owner_tag()}tmp")
    try:
        with open(tmp, "wb") as f:
            np.save(f, arr)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_shard(out: Path, shard: dict, vecs, ids: list) -> dict:
    """Write one shard: vectors, ids, then its record (each atomically; the record last). Returns the record."""
    from ..io import atomic_write_text
    name = shard_name(shard["index"])
    npy = out / f"{name}.npy"
    _atomic_npy(npy, vecs)
    atomic_write_text(out / f"{name}.ids.json", json.dumps(ids))
    rec = {"index": shard["index"], "start": shard["start"], "count": int(vecs.shape[0]), "dim": int(vecs.shape[1]),
           "bytes": npy.stat().st_size, "sha256": _sha256(npy)}
    atomic_write_text(out / f"{name}.json", json.dumps(rec))
    return rec


def _remove_shard(out: Path, i: int) -> None:
    name = shard_name(i)
    for f in (f"{name}.json", f"{name}.npy", f"{name}.ids.json"):  # the record first: never a record without data
        (out / f).unlink(missing_ok=True)
    for f in out.glob(f".{name}.*"):  # temporaries of a killed writer
        f.unlink(missing_ok=True)


def embed_shard(embedder, inputs, shard: dict, dim: int, max_seq_len: int, batch_size: int, progress=None):
    """The (count, dim) float32 vectors and the ids of one shard, embedded ``CHUNK`` texts at a time
    (``progress``: a :class:`bertforge.progress.Progress` counting texts, updated after each chunk)."""
    import numpy as np

    from ..data.stream import read_shard
    vecs = np.empty((shard["count"], dim), dtype=np.float32)
    ids: list = []
    texts: list = []
    row = 0

    def flush():
        nonlocal row, texts
        if texts:
            vecs[row:row + len(texts)] = embedder.embed(texts, max_seq_len, batch_size)
            row += len(texts)
            if progress is not None:
                progress.update(len(texts))
            texts = []

    for rid, text in read_shard(inputs, shard):
        ids.append(rid)
        texts.append(text)
        if len(texts) >= CHUNK:
            flush()
    flush()
    return vecs, ids


def _key(model_dir: Path, inputs: list, args, dim: int, pooling) -> dict:
    from ..io import dir_fingerprint
    fp = dir_fingerprint(model_dir) if model_dir.is_dir() else {"path": str(model_dir.resolve())}
    return {"model_sha256": fp.get("sha256"),
            "inputs": [{"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                       for p in inputs],
            "shard_size": args.shard_size, "max_seq_len": args.max_seq_len, "dim": dim,
            "pooling": {"mode": pooling.mode, "normalize": pooling.normalize}}


def check_out(out: Path, model_dir: Path) -> None:
    """``--out`` rules: a directory path outside the model dir and not inside another run, model or embedding
    output (as :class:`~bertforge.pipelines.rundir.RunDir` checks); a non-empty one must be an earlier embed
    output (``manifest.json``)."""
    if out.exists() and not out.is_dir():
        raise BertforgeError(f"--out {out} is a file; pass a directory path")
    res, src = out.resolve(), model_dir.resolve()
    if res == src or src in res.parents or res in src.parents:
        raise BertforgeError(f"--out {out} overlaps the model dir {model_dir}; choose an --out outside it")
    from .rundir import enclosing_output
    parent = enclosing_output(res) or next((p for p in res.parents if (p / "manifest.json").is_file()), None)
    if parent is not None:
        raise BertforgeError(f"--out {out} is inside {parent}, which holds a bertforge run, model or embedding; "
                             f"choose an --out outside it")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise BertforgeError(f"--out {out} is a non-empty directory that holds no embedding (manifest.json); pass "
                             f"a new or empty --out")


def embed_shards(model_dir: Path, inputs: list, out: Path, plan: dict, args, rank: int = None,
                 world_size: int = None) -> dict:
    """Embed the shards of ``plan`` (:func:`bertforge.data.stream.plan_shards`) this rank owns into ``out`` (see
    the module docstring); ``args``: an :class:`EmbedCorpusOptions` (or the verb's flags). ``rank`` /
    ``world_size``: default the ``torchrun`` environment (joined with gloo); given explicitly, no process
    group is used (the split can be run rank by rank in one process).

    Returns:
        this rank's record: ``rank``, ``world_size``, ``records``, ``shards``, ``dim``, ``computed`` / ``kept``
        (shard numbers), ``seconds``, ``texts_per_s``; from the rank that finishes (rank 0 under torchrun)
        also ``complete`` and, with ``index``, the index's record."""
    from ..runtime.embedder import load_embedder
    from ..io import append_jsonl, atomic_write_text
    ctx = None
    if rank is None:
        from ..engine.train.distributed import init_distributed
        ctx = init_distributed()
        rank, world_size = ctx.rank, ctx.world_size
    world_size = world_size or 1

    def barrier():
        if ctx is not None:
            from ..engine.train.distributed import barrier as b
            b(ctx)

    embedder = load_embedder(model_dir, threads=args.threads) if args.backend == "auto" else None
    if embedder is None:
        from ..runtime.embedder import Embedder
        from ..runtime import load_runner
        embedder = Embedder(load_runner(model_dir, backend=args.backend, threads=args.threads))
    if not embedder.can_embed:
        raise ConfigError(f"{model_dir} outputs logits only; pass an embedding model (encoder or static dir)")
    dim = int(embedder.embed(["dimension probe"], 8, 1).shape[1])
    args.max_seq_len = args.max_seq_len or embedder.max_seq_len  # the dir's declared length, as /embed cuts
    key = _key(model_dir, inputs, args, dim, embedder.pooling)
    mpath = out / "manifest.json"
    old = None
    if mpath.is_file():
        try:
            old = json.loads(mpath.read_text(encoding="utf-8"))
        except ValueError:
            old = None
    same = old is not None and old.get("key") == key and old.get("shards") == plan["shards"]
    if old is not None and not same and not args.overwrite:
        raise BertforgeError(f"--out {out} holds an embedding of another model, inputs or settings; pass "
                             f"--overwrite to recompute it, or another --out")
    fresh = args.overwrite or not same
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if fresh:  # start over: no shard of the old plan survives
            for f in list(out.glob("shard-*")) + list(out.glob(".shard-*")) + [out / "index.faiss",
                                                                                out / "index.json"]:
                f.unlink(missing_ok=True)
        manifest = {"format": FORMAT, "model": str(model_dir), "records": plan["records"], "key": key,
                    "shards": plan["shards"], "complete": False}
        atomic_write_text(mpath, json.dumps(manifest, indent=1))
    barrier()
    out.mkdir(parents=True, exist_ok=True)
    mine = plan["shards"][rank::world_size]
    computed, kept = [], []
    from ..progress import Progress  # texts of this rank's shards: lines with rate and ETA in a log
    bar = Progress(sum(s["count"] for s in mine), "embed" if world_size == 1 else f"embed rank {rank}", unit="text")
    t0 = time.perf_counter()
    for shard in mine:
        if shard_done(out, shard, dim):
            kept.append(shard["index"])
            bar.set_total(bar.total - shard["count"])  # kept, not computed: not in the rate nor the time left
            continue
        _remove_shard(out, shard["index"])  # a half-written or stale shard is redone
        ts = time.perf_counter()
        vecs, ids = embed_shard(embedder, inputs, shard, dim, args.max_seq_len, args.batch_size, bar)
        write_shard(out, shard, vecs, ids)
        del vecs, ids
        computed.append(shard["index"])
        append_jsonl(out / "events.jsonl", {"shard": shard["index"], "rank": rank, "records": shard["count"],
                                             "seconds": round(time.perf_counter() - ts, 3)})
    seconds = time.perf_counter() - t0
    bar.close()
    barrier()
    rec = {"out": str(out), "rank": rank, "world_size": world_size, "records": plan["records"],
           "shards": len(plan["shards"]), "dim": dim, "computed": computed, "kept": kept,
           "seconds": round(seconds, 3),
           "texts_per_s": (round(sum(plan["shards"][i]["count"] for i in computed) / seconds, 1)
                           if computed and seconds > 0 else None)}
    if rank == 0 or ctx is None:  # under torchrun rank 0 finishes; in one process, the rank that ends last
        missing = [s["index"] for s in plan["shards"] if not (out / f"{shard_name(s['index'])}.json").is_file()]
        if not missing:
            if args.index:
                rec["index"] = build_shard_index(out, plan, args.index_kind or "flat")
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
            manifest["complete"] = True
            atomic_write_text(mpath, json.dumps(manifest, indent=1))
        rec["complete"] = not missing
    return rec


def read_shards(out) -> tuple:
    """All vectors and ids of a complete embed ``out`` dir, in record order: ``(vectors (N, d), ids)``.
    (Loads everything: for a corpus that fits in memory, e.g. tests and evaluation.)"""
    import numpy as np
    out = Path(out)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    vecs, ids = [], []
    for s in manifest["shards"]:
        name = shard_name(s["index"])
        vecs.append(np.load(out / f"{name}.npy"))
        ids.extend(json.loads((out / f"{name}.ids.json").read_text(encoding="utf-8")))
    return np.concatenate(vecs), ids


#: IVF training points drawn per cell at most (faiss's k-means subsamples beyond 256 per centroid anyway)
IVF_TRAIN_POINTS_PER_CELL = 256

#: the seed of the IVF training sample (the same rows, so the same index, on every run)
IVF_TRAIN_SEED = 0


def ivf_training_sample(out: Path, plan: dict, nlist: int):
    """The vectors an IVF index of all shards of ``out`` trains on: min(N, :data:`IVF_TRAIN_POINTS_PER_CELL` ·
    ``nlist``) rows drawn uniformly over all N records (seed :data:`IVF_TRAIN_SEED`; every row when that is
    all of them), read shard by shard (memory: the sample). Returns (n_train, d) float32."""
    import numpy as np
    n = plan["records"]
    k = min(n, IVF_TRAIN_POINTS_PER_CELL * nlist)
    rows = np.arange(n) if k == n else np.sort(np.random.default_rng(IVF_TRAIN_SEED).choice(n, k, replace=False))
    parts = []
    for s in plan["shards"]:
        lo, hi = np.searchsorted(rows, [s["start"], s["start"] + s["count"]])
        if hi > lo:
            x = np.load(out / f"{shard_name(s['index'])}.npy", mmap_mode="r")
            parts.append(np.asarray(x[rows[lo:hi] - s["start"]], dtype=np.float32))
            del x
    return np.concatenate(parts)


def build_shard_index(out: Path, plan: dict, kind: str) -> dict:
    """A faiss index (:func:`bertforge.metrics.retrieval.build_index`, cosine) over every shard of ``out``,
    built from the first shard and extended shard by shard (memory: the index plus one shard), written to
    ``out/index.faiss`` (atomically) with ``index.json`` (kind, vectors, shard order; row i of the index is
    record i of the manifest's order).

    ``ivf``: the cells are sized from all N records (:func:`~bertforge.metrics.retrieval.ivf_nlist`, not from
    the first shard) and placed by k-means on a sample drawn across all shards (:func:`ivf_training_sample`);
    ``index.json`` records ``nlist``, ``nprobe`` and ``train_points``. Fewer than 39 training points per cell
    (faiss's own minimum; a corpus under 39 records) prints one warning line on stderr."""
    import sys

    import faiss
    import numpy as np

    from ..metrics.retrieval import IVF_MIN_POINTS_PER_CELL, build_index, ivf_nlist, ivf_nprobe, normalize_rows
    from ..io import atomic_write_text, owner_tag
    ivf, options = {}, {}
    if kind == "ivf":
        nlist = ivf_nlist(plan["records"])
        train = ivf_training_sample(out, plan, nlist)
        ivf = {"nlist": nlist, "nprobe": ivf_nprobe(nlist), "train_points": int(len(train)),
               "train_seed": IVF_TRAIN_SEED}
        options = {"nlist": nlist, "nprobe": ivf["nprobe"], "train": train, "faiss_warns": False}
        del train  # held by options until the index is trained
        if ivf["train_points"] < IVF_MIN_POINTS_PER_CELL * nlist:
            print(f"bertforge embed: warning: the IVF index trains {ivf['train_points']} points for {nlist} cell"
                  f"{'s' if nlist > 1 else ''} (< {IVF_MIN_POINTS_PER_CELL} per cell, faiss's minimum): its cells "
                  f"are poorly placed; --index-kind flat searches a corpus this small exactly",
                  file=sys.stderr, flush=True)
    index = None
    for s in plan["shards"]:
        x = np.load(out / f"{shard_name(s['index'])}.npy")
        if index is None:
            index = build_index(x, kind=kind, score="cos", **options)
            options.clear()  # the training sample is freed
        else:
            index.index.add(np.ascontiguousarray(normalize_rows(x), dtype=np.float32))
        del x
    path = out / "index.faiss"
    tmp = out / f".index.faiss.{owner_tag()}tmp"
    try:
        faiss.write_index(index.index, str(tmp))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    rec = {"file": "index.faiss", "kind": kind, "score": "cos", "ntotal": index.ntotal, **ivf,
           "shards": [s["index"] for s in plan["shards"]]}
    atomic_write_text(out / "index.json", json.dumps(rec, indent=1))
    return rec


__all__ = ["EmbedCorpusOptions", "EmbedCorpusResult", "embed_corpus", "embed_corpus_with", "embed_shards",
           "read_shards", "ivf_training_sample", "build_shard_index", "shard_done", "write_shard", "check_out"]
