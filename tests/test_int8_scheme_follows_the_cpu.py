"""INT8 schemes per CPU kind, and the AVX2 kernel's int16 saturation checked on every host.

Truths: the definition of ``vpmaddubsw`` (products of neighbouring K positions summed in int16 with
saturation) worked by hand; exact integer GEMM in int64; real MiniLM weights and activations; ONNX's reference
evaluator running the quantized graph in exact integer arithmetic (the scheme's own result), against which
ONNX Runtime on this host must agree far inside the scheme's quantization error — a saturating kernel would
not (the AVX2 model below shows by how much).
"""
import json

import numpy as np
import pytest
import torch

from bertforge.compress import int8 as Q

AVX2 = ["sse4_2", "avx", "avx2", "fma"]
VNNI = AVX2 + ["avx512f", "avx512_vnni"]
AMX = VNNI + ["amx_tile", "amx_int8"]
ARM = ["fp", "asimd", "asimddp"]


def test_vpmaddubsw_model_saturates_each_pair_in_int16_as_the_instruction_does():
    a = np.array([[255, 255, 1, 2]], dtype=np.uint8)
    b = np.array([[127], [127], [3], [4]], dtype=np.int8)
    # pair (0,1): 255·127 + 255·127 = 64770 → 32767; pair (2,3): 3 + 8 = 11
    assert Q.matmul_u8s8_avx2(a, b)[0, 0] == 32767 + 11
    assert Q.matmul_u8s8_avx2(a, -b)[0, 0] == -32768 - 11
    # no pair beyond int16 → the exact product, zero point subtracted afterwards: Σ (a_k − 128)·b_k
    a2 = np.array([[200, 3, 17, 255, 9]], dtype=np.uint8)  # odd K: padded with a zero pair
    b2 = np.array([[60, -2], [-64, 5], [7, 64], [1, 1], [-3, 0]], dtype=np.int8)
    want = (a2.astype(np.int64) - 128) @ b2.astype(np.int64)
    assert (Q.matmul_u8s8_avx2(a2, b2, a_zero_point=128) == want).all()


def test_seven_bit_weights_never_saturate_and_eight_bit_ones_do_on_real_minilm_activations(minilm_dir):
    from bertforge.checkpoint import load_pretrained
    model = load_pretrained(minilm_dir).eval()
    seen = {}
    lin = model.encoder.layers[0].attention.qkv  # (384 → 3·384), input: the embeddings after LayerNorm

    def keep_input(module, inputs, output):
        seen.setdefault("x", inputs[0].detach())

    hook = lin.register_forward_hook(keep_input)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model(torch.randint(1000, 20000, (2, 24), generator=g), torch.ones(2, 24, dtype=torch.long))
    hook.remove()
    x = seen["x"].reshape(-1, lin.in_features).numpy()
    w = lin.weight.detach().t().numpy()  # (K, N), as the graph's MatMul holds it
    xq, _, xz = Q.quantize_activation(x)
    for name, saturates in (("u8s8", True), ("u8s8-7bit", False)):
        wq, _, _ = Q.quantize_weight(w, Q.SCHEMES[name])
        exact = (xq.astype(np.int64) - xz) @ wq.astype(np.int64)
        got = Q.matmul_u8s8_avx2(xq, wq, xz)
        assert (Q.max_pair_sum(wq) > Q.INT16_MAX) == saturates  # the worst case over all uint8 inputs
        if saturates:
            assert (got != exact).any()  # and it happens on real text
        else:
            assert (got == exact).all() and Q.max_pair_sum(wq) <= 2 * 255 * 64


def test_host_kind_and_its_scheme_come_from_the_cpu_flags():
    assert [Q.host_target(f) for f in (AVX2, VNNI, AMX, ARM, [])] == ["avx2", "vnni", "amx", "arm64", "avx2"]
    assert Q.host_target(AVX2 + ["avx_vnni"]) == "vnni"  # Alder Lake's VEX VNNI
    assert {t: Q.default_scheme(t).name for t in Q.TARGETS} == \
        {"avx2": "u8s8-7bit", "vnni": "u8s8", "amx": "u8s8", "arm64": "u8s8"}
    for t in Q.TARGETS:  # every target's default is exact on that target's kernels
        assert Q.exact_on(Q.default_scheme(t), t)
    assert not Q.exact_on(Q.SCHEMES["u8s8"], "avx2") and Q.exact_on(Q.SCHEMES["u8u8"], "avx2")


def _modernbert():
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="modernbert", vocab_size=120, hidden_size=32, num_hidden_layers=3,
                      num_attention_heads=4, intermediate_size=48, max_position_embeddings=128, local_attention=8,
                      type_vocab_size=0, add_pooling_layer=False, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=3)
    return TaskModel(cfg, head="token_classification").eval()


def _feed():
    g = torch.Generator().manual_seed(1)
    lengths = (24, 7, 15)
    mask = (torch.arange(24)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 120, (3, 24), generator=g).masked_fill(mask == 0, 0)
    return {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """The same standard-op model quantized for every target (ModernBERT: an unfused export)."""
    from bertforge.compress.onnx import deploy
    model = _modernbert()
    d = tmp_path_factory.mktemp("int8")
    feed = _feed()
    with torch.no_grad():
        fp32 = model(torch.as_tensor(feed["input_ids"]), torch.as_tensor(feed["attention_mask"])).logits.numpy()
    recs = {t: deploy(model, d / t, quantize=True, target=t) for t in Q.TARGETS}
    return d, recs, feed, fp32


def test_each_target_gets_a_scheme_its_kernels_compute_exactly(graphs):
    d, recs, feed, fp32 = graphs
    m = feed["attention_mask"].astype(bool)
    for t, rec in recs.items():
        on_disk = json.loads((d / t / "onnx.json").read_text())
        assert on_disk["target"] == t and on_disk["scheme"] == Q.DEFAULT_SCHEME[t] and on_disk["exact_on_target"]
        assert on_disk["host_target"] == Q.host_target() and isinstance(on_disk["cpu_flags"], list)
        exact = Q.reference_run(d / t / "model.onnx", feed)
        kernel = Q.reference_run(d / t / "model.onnx", feed, kernel="avx2" if t == "avx2" else "exact")
        assert np.array_equal(exact[m], kernel[m])  # the target's kernel loses nothing to saturation
        assert np.abs(exact[m] - fp32[m]).max() < 0.1 * np.abs(fp32[m]).max()  # and INT8 is near FP32
    # the counter-example: 8-bit weights as an AVX2 CPU computes them — the saturation error dwarfs the
    # scheme's own quantization error (the 0.047 a fresh clone saw on an AVX2 host)
    eight = d / "vnni" / "model.onnx"
    exact, avx2 = Q.reference_run(eight, feed), Q.reference_run(eight, feed, kernel="avx2")
    assert np.abs(avx2[m] - exact[m]).max() > 2 * np.abs(exact[m] - fp32[m]).max()


def test_onnx_runtime_on_this_host_computes_the_scheme_it_was_given(graphs):
    """This host's own target: ONNX Runtime's INT8 equals the exact integer reference up to float rounding —
    a small fraction of the scheme's quantization error (a saturating kernel would exceed it)."""
    from bertforge.compress.onnx import run_session, session
    d, recs, feed, fp32 = graphs
    m = feed["attention_mask"].astype(bool)
    path = d / Q.host_target() / "model.onnx"
    got = run_session(session(path), feed)
    exact = Q.reference_run(path, feed)
    quant_error = np.abs(exact[m] - fp32[m]).max()
    assert np.abs(got[m] - exact[m]).max() <= 0.1 * quant_error


def test_bench_warns_when_an_int8_graph_runs_on_another_cpu_kind(graphs, capsys):
    from bertforge.cli import main
    from bertforge.runtime.bench import target_mismatch
    here = Q.host_target()
    other = "avx2" if here != "avx2" else "vnni"
    assert target_mismatch({"int8_target": here, "int8_scheme": Q.DEFAULT_SCHEME[here]}) is None
    w = target_mismatch({"int8_target": other, "int8_scheme": Q.DEFAULT_SCHEME[other]})
    assert f"quantized for {other}" in w and f"this CPU is {here}" in w
    if here == "avx2":  # 8-bit weights on this CPU saturate: the warning says so
        assert "saturate" in w
    d = graphs[0]
    assert main(["bench", "--model", str(d / other), "--seq-len", "16", "--iters", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr()
    assert "warning: this graph was quantized for" in out.err
    assert json.loads(out.out.strip().splitlines()[-1])["int8_target"] == other
