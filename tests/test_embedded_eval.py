"""Embedded data (gensim text), sentence-embedding evaluation (Lee ρ, Pang–Lee probe, latency) and report;
`embed-eval` checks its options and its models before any work and truncates to the model's positions."""
import json
import time

import numpy as np
import pytest
import torch

from bertforge.pipelines import demo_report as rp
from bertforge.cli import main
from bertforge.data.bundled import build_corpus, lee_corpus, polarity_sentences
from bertforge.runtime.embedder import (Embedder, lee_spearman, load_embedder, mean_pool, measure_latencies,
                                         polarity_accuracy, task_metrics)

from helpers import make_tiny_checkpoint, sentences, write_file

pytest.importorskip("gensim")


# ------------------------------------------------------------------------------------------ data
def test_build_corpus_layout_and_heldout_split(tmp_path):
    info = build_corpus(tmp_path, heldout_fraction=0.2, max_documents=15)
    train = (tmp_path / "train.txt").read_text()
    held = (tmp_path / "heldout.txt").read_text()
    tdocs = [d for d in train.strip().split("\n\n") if d.strip()]
    hdocs = [d for d in held.strip().split("\n\n") if d.strip()]
    assert len(tdocs) == info["train"]["documents"] and len(hdocs) == info["heldout"]["documents"]
    assert info["train"]["documents"] + info["heldout"]["documents"] == sum(info["documents_per_source"].values())
    assert not set(tdocs) & set(hdocs)
    lines = [ln for ln in train.splitlines() if ln]
    assert len(lines) == info["train"]["sentences"]
    assert all(len(ln.split()) >= 3 for ln in lines)
    assert "'''" not in train and "[[" not in train and "{{" not in train  # wiki markup stripped
    # evaluation documents never leak into the corpus
    docs, _ = lee_corpus()
    for d in docs:
        assert d[:80] not in train and d[:80] not in held
    # deterministic
    build_corpus(tmp_path / "again", heldout_fraction=0.2, max_documents=15)
    assert (tmp_path / "again" / "train.txt").read_text() == train


def test_lee_and_polarity_files():
    docs, sims = lee_corpus()
    assert len(docs) == 50 and sims.shape == (50, 50)
    assert np.allclose(sims, sims.T) and np.allclose(np.diag(sims), 1.0)
    assert 0.0 <= sims.min() and sims.max() <= 1.0
    texts, labels = polarity_sentences()
    assert len(texts) == 200 and sorted(set(labels)) == [0, 1] and sum(labels) == 100


# ------------------------------------------------------------------------------------- evaluation
def test_mean_pool_hand_computed():
    h = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    m = np.array([[1, 1, 0]])
    assert np.allclose(mean_pool(h, m), [[2.0, 3.0]])


def test_teacher_lee_spearman_matches_transformers_reference(minilm_dir):
    """Our encoder + pooling vs transformers' BertModel on the same weights, and the known ≈ 0.51."""
    from scipy.stats import spearmanr
    from transformers import AutoModel, AutoTokenizer
    docs, sims = lee_corpus()
    ours = lee_spearman(load_embedder(minilm_dir, "teacher"))
    tok = AutoTokenizer.from_pretrained(str(minilm_dir))
    ref = AutoModel.from_pretrained(str(minilm_dir)).eval()
    enc = tok(docs, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = ref(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
    iu = np.triu_indices(50, 1)
    rho_ref = spearmanr((e @ e.T)[iu], sims[iu])[0]
    assert ours == pytest.approx(rho_ref, abs=2e-3)
    assert ours == pytest.approx(0.51, abs=0.01)


class _FakeEmbedder(Embedder):
    """Embeds text i as a fixed vector looked up by text; for probing the metric code."""
    backend = "fake"

    def __init__(self, table: dict, name="fake", sleep_s=0.0):
        self.name, self.table, self.sleep_s = name, table, sleep_s
        self.num_parameters, self.path = 0, "."

    def embed(self, texts, max_seq_len=256, batch_size=16):
        return np.stack([self.table[t] for t in texts])

    def forward(self, *a):
        time.sleep(self.sleep_s)

    class _Tok:
        @staticmethod
        def get_vocab_size():
            return 30522

    tok = _Tok()


def test_polarity_probe_separates_informative_from_random_features():
    texts, labels = polarity_sentences()
    rng = np.random.default_rng(0)
    informative = {t: np.r_[2.0 * y - 1.0 + 0.3 * rng.standard_normal(), rng.standard_normal(7)]
                   for t, y in zip(texts, labels)}
    acc, std = polarity_accuracy(_FakeEmbedder(informative))
    assert acc >= 0.95 and 0 <= std < 0.1
    chance = []
    for seed in range(5):
        rng = np.random.default_rng(seed + 1)
        random_feats = {t: rng.standard_normal(8) for t in texts}
        chance.append(polarity_accuracy(_FakeEmbedder(random_feats))[0])
    assert abs(np.mean(chance) - 0.5) < 0.08  # 5 draws × 200 examples: sd of the mean ≈ 0.016


def test_lee_spearman_is_plus_minus_one_for_embeddings_that_reproduce_the_ratings_order():
    docs, _ = lee_corpus()
    rng = np.random.default_rng(0)
    r = rng.uniform(0, 1, (50, 50))
    r = (r + r.T) / 2  # distinct off-diagonal values (the real ratings have ties)
    np.fill_diagonal(r, 1.0)
    for sign in (1, -1):
        g = sign * r + 60 * np.eye(50)  # Gershgorin: positive definite; equal diagonals → cosine ∝ ±r_ij
        w, v = np.linalg.eigh(g)
        e = v * np.sqrt(w)  # e e^T = g
        rho = lee_spearman(_FakeEmbedder({d: e[i] for i, d in enumerate(docs)}), docs=docs, ratings=r)
        assert rho == pytest.approx(sign * 1.0, abs=1e-9)


def test_latency_rounds_are_interleaved_and_measure_sleep():
    fast, slow = _FakeEmbedder({}, "fast", 0.001), _FakeEmbedder({}, "slow", 0.006)
    order = []
    fast.forward = lambda *a: (order.append("f"), time.sleep(0.001))
    slow.forward = lambda *a: (order.append("s"), time.sleep(0.006))
    lat = measure_latencies([fast, slow], rounds=3, iters=4, warmup=1, progress=False, warmup_seconds=0)
    # warm-up, then interleaved rounds, each model's timed calls after one untimed call of its own
    assert "".join(order) == "fs" + ("f" + "ffff" + "s" + "ssss") * 3
    assert lat["fast"]["n"] == 12 and lat["slow"]["n"] == 12
    order.clear()  # a time-based warm-up per round: the previous model's spinning threads are not timed
    measure_latencies([fast, slow], rounds=2, iters=4, warmup=1, progress=False, warmup_seconds=0.03)
    assert order.count("f") >= 1 + 2 * (4 + 0.03 / 0.0015) and order.count("s") >= 1 + 2 * (4 + 5)
    assert lat["slow"]["min_ms"] >= 6.0 and lat["fast"]["min_ms"] >= 1.0  # sleep never undershoots
    assert lat["slow"]["p50_ms"] > lat["fast"]["p50_ms"]


def _tiny_dir(tmp_path, minilm_dir, head="base", num_labels=2):
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    torch.manual_seed(0)
    cfg = ModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                      num_labels=num_labels, max_position_embeddings=512)
    m = TaskModel(cfg, head=head).eval()
    with torch.no_grad():  # distinct values everywhere (ONNX export de-duplicates equal initializers)
        for p in m.parameters():
            p.add_(0.01 * torch.randn_like(p))
        if m.head is not None:  # decisive logits, so padding-level float noise cannot flip an argmax
            m.head.classifier.weight.mul_(1000.0)
    d = tmp_path / f"tiny-{head}"
    m.save_pretrained(d, tokenizer_dir=minilm_dir)
    return d, m


def _export(model, path, output):
    ids = torch.randint(1000, 2000, (2, 9))
    am = torch.ones_like(ids)
    am[0, -3:] = 0  # trace the padded path (an all-ones mask takes the unmasked fast path)
    tt = torch.zeros_like(ids)

    class W(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return o.logits if output == "logits" else o.last_hidden_state

    axes = {k: {0: "b", 1: "t"} for k in ("input_ids", "attention_mask", "token_type_ids")}
    # an eval-mode wrapper: the exporter restores the wrapper's mode afterwards, which would otherwise put
    # the caller's model back in training mode (dropout on)
    torch.onnx.export(W(model).eval(), (ids, am, tt), str(path), input_names=list(axes), output_names=[output],
                      dynamic_axes=axes, opset_version=17, dynamo=False)


def test_onnx_embedder_matches_torch(tmp_path, minilm_dir):
    pytest.importorskip("onnxruntime")
    d, m = _tiny_dir(tmp_path, minilm_dir)
    onnx_dir = tmp_path / "onnx"
    onnx_dir.mkdir()
    _export(m, onnx_dir / "model.onnx", "last_hidden_state")
    from bertforge.tokenizer import copy_tokenizer_files
    copy_tokenizer_files(d, onnx_dir)
    te, oe = load_embedder(d, "t"), load_embedder(onnx_dir / "model.onnx", "o")
    texts = ["a short one .", "a somewhat longer sentence about the weather in sydney ."]
    assert np.allclose(te.embed(texts), oe.embed(texts), atol=1e-4)
    # every weight is an initializer, counted once; the pooler (unused by last_hidden_state) is dropped
    pooler = 32 * 32 + 32
    assert te.num_parameters - pooler <= oe.num_parameters <= te.num_parameters - pooler + 64
    assert lee_spearman(te) == pytest.approx(lee_spearman(oe), abs=1e-3)


def test_task_metrics_torch_and_onnx_agree(tmp_path, minilm_dir):
    pytest.importorskip("onnxruntime")
    d, m = _tiny_dir(tmp_path, minilm_dir, head="sequence_classification")
    _export(m, tmp_path / "cls.onnx", "logits")
    data = tmp_path / "dev.tsv"
    pairs = list(zip(*polarity_sentences()))
    pairs = pairs[:20] + pairs[-20:]  # 20 negative, 20 positive
    rows = ["sentence\tlabel"] + [f"{t}\t{y}" for t, y in pairs]
    data.write_text("\n".join(rows) + "\n")
    te = load_embedder(d, "t")
    oe = load_embedder(tmp_path / "cls.onnx", "o", tokenizer_dir=d)
    assert not oe.can_embed
    mt, mo = task_metrics(te, "sst2", data), task_metrics(oe, "sst2", data)
    # independent truth: argmax of the model's own logits, counted by hand
    from bertforge.tokenizer import encode_texts
    correct = 0
    m.eval()
    for t, y in pairs:
        enc = encode_texts(te.tok, [t], None, 128)[0]
        with torch.no_grad():
            lg = m(input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids])).logits
        correct += int(lg.argmax(-1).item() == y)
    assert 0 < correct < 40  # the check is not vacuous
    assert mt["accuracy"] == pytest.approx(correct / 40) and mo["accuracy"] == pytest.approx(correct / 40)


def test_embed_eval_cli(tmp_path, minilm_dir, capsys):
    d, _ = _tiny_dir(tmp_path, minilm_dir)
    out = tmp_path / "res.json"
    rc = main(["embed-eval", f"--model=tiny={d}", "--rounds", "1", "--iters", "2", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    row = res["models"][0]
    assert row["name"] == "tiny" and row["backend"] == "torch"
    assert -1 <= row["lee_spearman"] <= 1 and 0 <= row["polarity_acc"] <= 1
    assert row["latency_ms"] > 0 and row["latency_seq_len"] == 128
    n_params = sum(p.numel() for p in load_embedder(d).runner.model.parameters())
    assert row["params"] == n_params
    assert row["size_mb"] == pytest.approx((d / "model.safetensors").stat().st_size / 1e6)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == res
    # two rows with one name: a one-line user error, exit 2
    assert main(["embed-eval", f"--model=x={d}", f"--model=x={d}", "--no-progress"]) == 2
    assert "two models are named" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- report
def _rows():
    return [{"name": "teacher", "backend": "torch", "lee_spearman": 0.50, "polarity_acc": 0.7,
             "polarity_acc_std": 0.05, "latency_ms": 10.0, "params": 22_700_000, "size_mb": 90.9},
            {"name": "student-a", "backend": "torch", "lee_spearman": 0.475, "polarity_acc": 0.68,
             "polarity_acc_std": 0.04, "latency_ms": 5.0, "params": 17_400_000, "size_mb": 69.6},
            {"name": "student-a-int8", "backend": "onnxruntime", "lee_spearman": 0.47, "polarity_acc": None,
             "polarity_acc_std": None, "latency_ms": 2.5, "params": 17_400_000, "size_mb": 18.0}]


def test_results_table_and_claims():
    md, txt = rp.results_table(_rows())
    head = md.splitlines()[0]
    for unit in ("(%)", "(ms, seq 128, batch 1)", "(×)", "(M)", "(MB)"):
        assert unit in head
    a = md.splitlines()[3].split("|")
    assert a[1].strip() == "student-a" and a[4].strip() == "95.0" and a[7].strip() == "2.00"
    assert "student-a-int8" in txt
    claims = {c["claim"]: c["ok"] for c in rp.checks(_rows())}
    assert list(claims.values()) == [True, True, False, True]  # int8 keeps 94% < 95%
    # the second student (4-bit weights): 0.48 / 0.50 = 96% kept; 11.6 / 69.6 MB = 1/6 ≤ 1/4; at 20 MB (> 1/4) no
    low_bit = {"name": "student-b", "backend": "onnxruntime", "lee_spearman": 0.48, "latency_ms": 3.0,
               "size_mb": 11.6}
    claims = rp.checks([*_rows(), low_bit])
    assert [c["ok"] for c in claims[-2:]] == [True, True] and claims[-1]["value"].startswith("1/6.0")
    assert [c["ok"] for c in rp.checks([*_rows(), {**low_bit, "size_mb": 20.0, "lee_spearman": 0.47}])[-2:]] \
        == [False, False]


def test_plots_and_loss_curve_reader(tmp_path):
    mj = tmp_path / "metrics.jsonl"
    mj.write_text("\n".join(json.dumps(r) for r in [{"step": 2, "loss": 9.0}, {"step": 2, "eval": {"acc": 1}},
                                                    {"step": 4, "loss": 6.0}, {"step": 6, "loss": float("nan")}]))
    assert rp.read_loss_curve(mj) == ([2, 4], [9.0, 6.0])
    assert rp.plot_loss_curves({"bert": ([2, 4], [9.0, 6.0]), "none": ([], [])}, tmp_path / "l.png")
    assert rp.plot_quality_vs_latency(_rows(), tmp_path / "q.png")
    for f in ("l.png", "q.png"):
        assert (tmp_path / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not rp.plot_loss_curves({}, tmp_path / "none.png")


def test_embed_eval_out_is_checked_before_any_work(tmp_path, cli_error):
    ckpt = make_tiny_checkpoint(tmp_path / "m")
    common = ["embed-eval", "--model", ckpt, "--rounds", 1, "--iters", 1, "--seq-len", 8, "--no-progress"]
    line = cli_error([*common, "--out", ckpt / "model.safetensors"], ckpt)
    assert "inside the model directory" in line
    existing = tmp_path / "results.json"
    existing.write_text("{}")
    assert "--overwrite" in cli_error([*common, "--out", existing], ckpt)
    assert existing.read_text() == "{}"
    for flag, value in (("--threads", -1), ("--lee-max-seq-len", -5), ("--max-eval-samples", 0)):
        assert flag in cli_error([*common, flag, value], ckpt)
    assert "exceeds the 64 positions" in cli_error([*common[:-3], "--seq-len", 100], ckpt)


def test_embedding_truncates_to_the_models_positions(tmp_path):
    """A 32-position model embeds a 200-word document (Lee documents are longer than 256 tokens): the
    text is cut at the model's limit, and the embedding equals the one of the text cut by hand."""
    from bertforge.runtime.embedder import load_embedder
    ckpt = make_tiny_checkpoint(tmp_path / "m", max_pos=32)
    e = load_embedder(ckpt)
    assert e.max_positions == 32 and e.truncation(256) == 32 and e.truncation(16) == 16
    long_text = " ".join(s for s, _ in sentences(40))
    assert len(e.tok.encode(long_text).ids) > 100
    got = e.embed([long_text], 256)
    assert np.allclose(got, e.embed([long_text], 32), atol=1e-6)


@pytest.mark.parametrize("head,labels", [("token_classification", 9), ("question_answering", 2),
                                         ("sequence_classification", 2)])
def test_embed_eval_task_needs_a_classifier_of_the_task(workspace, tmp_path, cli_error, head, labels):
    """A tagger or QA model (one output per token) or a 2-label model on STS-B (1 output) is refused, not
    scored (np.stack of per-token outputs, or Pearson of argmax labels, would mean nothing)."""
    from bertforge.checkpoint import load_pretrained
    from bertforge.task_model import TaskModel
    base = load_pretrained(workspace.tiny)
    base.config.num_labels = labels
    torch.manual_seed(0)
    d = tmp_path / f"m-{head}"
    TaskModel(base.config, head=head).save_pretrained(d, tokenizer_dir=workspace.tiny)
    stsb = write_file(tmp_path / "stsb.tsv", "sentence1\tsentence2\tscore\na good film\ta fine film\t4.0\n"
                                             "a bad film\ta dull film\t1.0\n")
    task, data = ("stsb", stsb) if head == "sequence_classification" else ("sst2", workspace.train)
    line = cli_error(["embed-eval", "--model", f"m={d}", "--rounds", 1, "--iters", 1, "--seq-len", 32,
                      "--lee-max-seq-len", 32, "--max-seq-len", 32, "--task", task,
                      "--data", data, "--no-progress"], untouched=workspace.run)
    want = "predicts 2 labels but task stsb has 1" if task == "stsb" else "is not a sequence classifier"
    assert want in line, line
