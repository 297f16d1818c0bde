"""Embed a corpus larger than memory into shards of vectors (+ ids), resumable, split across torchrun ranks.

Inputs are read lazily (``.txt``: one text per line, id = line number; ``.jsonl``: ``id`` / ``_id`` +
``text``), checked in one pass before anything is written, and cut into shards of ``--shard-size`` records.
Each shard is written as ``shard-NNNNN.npy`` (float32 (n, d): the model's pooled vectors, as the dir
declares its pooling), ``shard-NNNNN.ids.json`` and, last, ``shard-NNNNN.json`` (count, size, sha256) — each
file through a temporary name and a rename, so a killed run leaves no half-written shard under a final name.
``manifest.json`` records the model, inputs and shard plan. Re-running the same command resumes: a shard
whose record, size and sha256 agree is kept, any other is computed again. Under ``torchrun`` rank r takes
shards r, r+W, r+2W, … (the same vectors as one process); rank 0 then writes the index.

Examples:
  bertforge embed --model runs/minilm-static --input corpus.txt --out runs/corpus-vecs
  bertforge embed --model minilm --input corpus.jsonl --out runs/corpus-vecs --index faiss --index-kind hnsw
  torchrun --nproc-per-node 2 -m bertforge embed --model minilm --input big.txt --out runs/big-vecs

Memory stays bounded by one shard of vectors plus one chunk of texts, whatever the input size.
"""
from __future__ import annotations

from ._common import print_json

def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="embedding model dir (checkpoint, static or export dir) or "
                                                  "'minilm'")
    p.add_argument("--input", required=True, nargs="+", metavar="FILE",
                   help=".txt (one text per line; id = line number) or .jsonl (id + text per line) files")
    p.add_argument("--out", required=True, help="output dir: manifest.json + shard-NNNNN.{npy,ids.json,json}")
    p.add_argument("--shard-size", type=int, default=100_000, metavar="N", help="records per shard (100000)")
    p.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (64)")
    p.add_argument("--max-seq-len", type=int, help="tokens per text (longer texts are cut; default: the max_seq_length the model dir declares, else its positions — where the server cuts)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: PyTorch's)")
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "onnxruntime"),
                   help="runner backend (auto: what the dir holds)")
    p.add_argument("--index", choices=("faiss",), help="also build a faiss index of all shards (index.faiss)")
    p.add_argument("--index-kind", choices=("flat", "hnsw", "ivf"),
                   help="with --index: flat (exact, default), hnsw or ivf")
    p.add_argument("--overwrite", action="store_true",
                   help="recompute every shard (an --out holding an embedding of other inputs needs it)")


def run(args) -> int:
    from ...pipelines.embed_corpus import EmbedCorpusOptions, embed_corpus_with
    opts = EmbedCorpusOptions(**{f: getattr(args, f) for f in EmbedCorpusOptions.__dataclass_fields__})
    print_json(embed_corpus_with(args.model, args.input, args.out, opts).record)
    return 0
