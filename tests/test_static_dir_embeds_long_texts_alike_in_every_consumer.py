"""A static embedding dir declares one maximum length, and every consumer cuts a text where it says:
``SentenceTransformer(DIR).encode`` (whose ``StaticEmbedding`` honours only ``tokenizer.json``'s truncation),
``bertforge embed``, the server's ``/embed`` and the bundle of ``bertforge bundle`` give the same vector for a
2,000-token text and for one longer than the limit.

The teacher's ``tokenizer.json`` truncates at 128 tokens and adds [CLS]/[SEP], as all-MiniLM-L6-v2's does:
copied as it was, sentence-transformers embedded the first 128 tokens of a long text and bertforge all of them
(issue #49: cosine 0.81 on a 2,775-token text)."""
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import WORDS, make_tiny_checkpoint

LITE = Path(__file__).resolve().parents[1] / "lite"


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    from tokenizers import Tokenizer
    from tokenizers.processors import BertProcessing

    from bertforge.cli import main
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("static_len")
    teacher = make_tiny_checkpoint(d / "teacher")
    tok = Tokenizer.from_file(str(teacher / "tokenizer.json"))  # MiniLM's: [CLS] … [SEP], cut at 128
    tok.post_processor = BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    tok.enable_truncation(max_length=128)
    tok.save(str(teacher / "tokenizer.json"))
    out = d / "static"
    assert main(["distill", "--method", "static", "--teacher", str(teacher), "--dim", "8", "--remove-top", "2",
                 "--out", str(out), "--no-progress"]) == 0
    return d, out


def _text(tok, n_tokens: int, words, seed: int) -> str:
    """Random words of ``words`` until the text has ``n_tokens`` tokens (no special tokens)."""
    rng = random.Random(seed)
    parts, n = [], 0
    while n < n_tokens:
        w = rng.choice(words)
        k = len(tok.encode(w, add_special_tokens=False).ids)
        if n + k > n_tokens:
            continue
        parts.append(w)
        n += k
    return " ".join(parts)


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_dir_declares_one_length_and_its_tokenizer_agrees(static):
    from tokenizers import Tokenizer

    from bertforge.checkpoint.modeldir import ModelDir
    from bertforge.models.static import STATIC_MAX_POSITIONS
    _, out = static
    tj = json.loads((out / "tokenizer.json").read_text())
    st_cfg = json.loads((out / "sentence_bert_config.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    limit = STATIC_MAX_POSITIONS
    assert st_cfg["max_seq_length"] == limit == cfg["max_position_embeddings"]
    assert tj["truncation"]["max_length"] == limit and tj["padding"] is None
    assert tj["post_processor"] is None  # a length counts the text's own tokens in every consumer
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == limit
    assert ModelDir.open(out).embed_max_length() == limit
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("good film").ids == tok.encode("good film", add_special_tokens=False).ids


def test_st_embed_serve_and_bundle_give_one_vector_for_long_texts(static):
    from sentence_transformers import SentenceTransformer

    import bertforge
    from bertforge.cli import main
    from bertforge.models.static import STATIC_MAX_POSITIONS
    from bertforge.pipelines.embed_corpus import read_shards
    from bertforge.tokenizer import load_tokenizer
    d, out = static
    tok = load_tokenizer(out)
    half = len(WORDS) // 2
    two_k = _text(tok, 2000, WORDS, 1)
    # past the limit, other words: a consumer that cut elsewhere would give another vector
    over = _text(tok, STATIC_MAX_POSITIONS, WORDS[:half], 2) + " " + _text(tok, 600, WORDS[half:], 3)
    assert len(tok.encode(two_k, add_special_tokens=False).ids) == 2000
    texts = [two_k, over, "a good film"]

    from safetensors.numpy import load_file
    table = load_file(str(out / "model.safetensors"))["embedding.weight"]

    def mean(ids):  # the mean of the table's rows over these tokens
        return table[np.asarray(ids)].mean(0)

    ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    ref = [mean(i[:STATIC_MAX_POSITIONS]) for i in ids]  # the truth: the text's tokens up to the limit
    assert _cos(ref[0], mean(ids[0][:128])) < 0.999  # a cut at 128 tokens would show
    assert _cos(ref[1], mean(ids[1])) < 0.999  # so would no cut at the limit
    st = SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)

    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(out), "--input", str(corpus), "--out", str(d / "vecs"),
                 "--threads", "1"]) == 0
    embedded, _ = read_shards(d / "vecs")

    import urllib.request
    with bertforge.serve({"s": out}, threads=1) as srv:
        def post(body):
            req = urllib.request.Request(srv.url + "/embed", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.load(r)
        served = [post({"inputs": two_k, "model": "s"})[0], post({"inputs": over, "model": "s", "truncate": True})[0],
                  post({"inputs": texts[2], "model": "s"})[0]]

    sys.path.insert(0, str(LITE))
    try:
        import bertforge_lite
        bundled = bertforge_lite.Bundle(bertforge.bundle({"s": out}, d / "bundle").out).embed(texts)
    finally:
        sys.path.remove(str(LITE))

    for i in range(len(texts)):
        for name, v in (("SentenceTransformer", st[i]), ("bertforge embed", embedded[i]), ("/embed", served[i]),
                        ("bundle", bundled[i])):
            c = _cos(ref[i], v)
            assert c >= 0.9999, f"text {i} ({len(ids[i])} tokens): {name} vs the table's mean: cosine {c:.4f}"
        assert _cos(st[i], embedded[i]) >= 0.9999 and _cos(st[i], served[i]) >= 0.9999
