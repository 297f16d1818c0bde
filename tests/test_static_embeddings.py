"""`distill --method static`: the table equals a reference computation (transformers' BertModel on each
token, sklearn's PCA, the SIF formula by hand), and the static dir runs through every consumer — the runner
layer (torch and ONNX Runtime), sentence-transformers (an independent loader), `export`, `embed-eval`
and `bench` — with the same vectors. A teacher without a tokenizer is refused before anything is written."""
import json
import shutil

import numpy as np
import pytest
import torch

from helpers import make_tiny_checkpoint, sentences


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    from bertforge.cli import main
    torch.set_num_threads(1)  # the vocabulary pass: one thread is fastest on a busy shared host
    d = tmp_path_factory.mktemp("static")
    teacher = make_tiny_checkpoint(d / "teacher")
    out = d / "static"
    assert main(["distill", "--method", "static", "--teacher", str(teacher), "--dim", "8", "--remove-top", "2",
                 "--out", str(out), "--no-progress"]) == 0
    return teacher, out


def test_static_table_equals_a_reference_computation(static):
    """Each text token alone with [CLS]/[SEP] through transformers' BertModel, mean over the 3 positions;
    sklearn PCA components 3..10 (2 removed); rows × a/(a + p_r) with p_r ∝ 1/(r+1) over id order."""
    from safetensors.torch import load_file
    from sklearn.decomposition import PCA
    from tokenizers import Tokenizer
    from transformers import BertModel
    teacher, out = static
    tok = Tokenizer.from_file(str(teacher / "tokenizer.json"))
    vocab = tok.get_vocab()
    special = {vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    kept = np.array([i for i in range(len(vocab)) if i not in special])
    ref_model = BertModel.from_pretrained(str(teacher)).eval()
    x = torch.tensor([[vocab["[CLS]"], int(i), vocab["[SEP]"]] for i in kept])
    with torch.no_grad():
        h = ref_model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state.mean(1).numpy()
    pca = PCA(n_components=10, svd_solver="full").fit(h.astype(np.float64))
    scores = (h - pca.mean_) @ pca.components_[2:10].T
    inv = 1.0 / np.arange(2, len(kept) + 2)
    p = inv / inv.sum()
    ref = scores * (1e-4 / (1e-4 + p))[:, None]
    table = load_file(str(out / "model.safetensors"))["embedding.weight"].numpy()
    assert table.shape == (len(vocab), 8)
    assert np.all(table[sorted(special)] == 0)
    got = table[kept]
    signs = np.sign((got * ref).sum(0))  # a principal component's sign is a convention
    np.testing.assert_allclose(got, ref * signs, rtol=1e-3, atol=1e-6 * np.abs(ref).max())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "static" and cfg["bertforge"]["removed_components"] == 2


def test_static_dir_gives_the_same_vectors_in_every_consumer(static, tmp_path, capsys):
    """Runner (torch) + Embedder = SentenceTransformer(DIR) = the exported ONNX graph (both outputs) = the
    on-the-fly ONNX runner = the server's encode/pool path; `bench` and `embed-eval` take the dir."""
    from sentence_transformers import SentenceTransformer

    from bertforge.cli import main
    from bertforge.runtime.embedder import Embedder, load_embedder
    from bertforge.runtime import load_runner
    _, out = static
    texts = [s for s, _ in sentences(12, 3)] + ["zzz qqq unknownword", "the"]
    emb = load_embedder(out, threads=1)
    assert emb.runner.backend == "torch" and emb.pooling.normalize
    ours = emb.embed(texts, 64, 4)
    st = SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours, st, atol=1e-5)
    onnx_dir = tmp_path / "onnx"
    assert main(["export", "--model", str(out), "--out", str(onnx_dir)]) == 0
    rec = json.loads((onnx_dir / "onnx.json").read_text())
    assert rec["fp32_max_abs_diff"] <= 1e-5
    for runner in (load_runner(onnx_dir, threads=1), load_runner(out, backend="onnxruntime", threads=1)):
        assert runner.backend == "onnxruntime"
        np.testing.assert_allclose(Embedder(runner).embed(texts, 64, 4), ours, atol=1e-5)
    import onnxruntime as ort  # the graph's own pooled output
    sess = ort.InferenceSession(str(onnx_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    enc = [e.ids for e in emb.tok.encode_batch(texts[:3])]
    t = max(map(len, enc))
    ids = np.array([e + [0] * (t - len(e)) for e in enc], dtype=np.int64)
    am = (np.arange(t)[None] < np.array([len(e) for e in enc])[:, None]).astype(np.int64)
    pooled = sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": am})[0]
    np.testing.assert_allclose(pooled, ours[:3], atol=1e-5)
    from bertforge.server.models import load_model  # the server's path: encode → runner → pool
    served = load_model("static", out, threads=1)
    rows = []
    for e in served.encode(texts[:3], truncate=True):
        ids = np.array([e.ids], dtype=np.int64)
        rows.append(served.pool(served.runner(ids, np.ones_like(ids))["last_hidden_state"], np.ones_like(ids))[0])
    rows = np.stack(rows)
    np.testing.assert_allclose(rows / np.linalg.norm(rows, axis=1, keepdims=True), ours[:3], atol=1e-5)
    capsys.readouterr()
    assert main(["bench", "--model", str(out), "--iters", "2", "--warmup", "1", "--seq-len", "16",
                 "--threads", "1"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert b["parameters"] == ours.shape[1] * emb.tok.get_vocab_size() and b["gflops_per_seq"] == 0
    assert main(["embed-eval", "--model", str(out), "--rounds", "1", "--iters", "1", "--threads", "1",
                 "--no-progress"]) == 0
    row = json.loads(capsys.readouterr().out)["models"][0]
    assert -1 <= row["lee_spearman"] <= 1


def test_static_distillation_of_a_model_without_tokenizer_is_refused(static, tmp_path, cli_error):
    teacher, _ = static
    bare = tmp_path / "bare"
    shutil.copytree(teacher, bare)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        (bare / f).unlink(missing_ok=True)
    line = cli_error(["distill", "--method", "static", "--teacher", bare, "--out", tmp_path / "s"], bare)
    assert "no tokenizer" in line
    line = cli_error(["distill", "--method", "static", "--teacher", teacher, "--dim", "33",
                      "--out", tmp_path / "s"], teacher)
    assert "--dim 33" in line
