"""MobileBERT dirs through export (ONNX FP32 + INT8), PyTorch INT8, the runners, head pruning and `layers:` students.

Truths: the ONNX graph against the PyTorch model on a padded batch (the export's own parity check plus the
runtime's logits); ONNX Runtime's INT8 against ONNX's reference evaluator of the same quantized graph in exact
integer arithmetic; a head-pruned model against the unpruned one with the removed heads' output columns zeroed
(same logits); a `layers:` student against the teacher's blocks run by hand.
"""
import pytest
import torch

from bertforge.checkpoint import load_pretrained
from bertforge.compress.int8 import reference_run
from bertforge.compress.onnx import deploy
from bertforge.compress.prune import head_counts, prune_ffn, prune_heads
from bertforge.compress.quantize import load_quantized, quantize_dynamic, save_quantized
from bertforge.config import ModelConfig
from bertforge.errors import ConfigError
from bertforge.runtime import load_runner
from bertforge.task_model import TaskModel


def _model(head="sequence_classification", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="mobilebert", vocab_size=120, hidden_size=32, embedding_size=8,
                      intra_bottleneck_size=16, num_attention_heads=4, intermediate_size=32,
                      num_feedforward_networks=2, num_hidden_layers=3, max_position_embeddings=64,
                      hidden_act="relu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3, **kw)
    model = TaskModel(cfg, head=head).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # NoNorm scales away from 1, so the norms matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


def _batch(lengths=(14, 5, 9), seed=1):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 120, (len(lengths), t), generator=g).masked_fill(mask == 0, 0)
    return ids, mask


def test_export_and_int8_graphs_match_pytorch(tmp_path, minilm_dir):
    ids, mask = _batch()
    types = torch.zeros_like(ids)
    for head, int8 in (("sequence_classification", False), ("token_classification", True)):
        model = _model(head)
        with torch.no_grad():
            ref = model(ids, mask).logits
        rec = deploy(model, tmp_path / head, source_dir=minilm_dir, quantize=int8)
        assert rec["fp32_max_abs_diff"] < 1e-4 and "token_type_ids" in rec["inputs"]
        got = torch.as_tensor(load_runner(tmp_path / head)(ids, mask, types)["logits"])
        real = mask.bool() if head == "token_classification" else slice(None)
        if int8:
            exact = torch.as_tensor(reference_run(tmp_path / head / "model.onnx", {
                "input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}))
            quant_error = (exact[real] - ref[real]).abs().max()
            assert quant_error < 0.2 * ref[real].abs().max()
            assert (got[real] - exact[real]).abs().max() <= 0.1 * quant_error + 1e-6
        else:
            assert (got[real] - ref[real]).abs().max() < 1e-4
    # PyTorch dynamic INT8, saved and loaded back; and the PyTorch runner of a saved FP32 dir
    model = _model()
    q = quantize_dynamic(model)
    save_quantized(q, model, tmp_path / "q", tokenizer_dir=minilm_dir)
    with torch.no_grad():
        a, b = model(ids, mask).logits, load_quantized(tmp_path / "q")(ids, mask).logits
    assert (a - b).abs().max() < 0.1 * a.abs().max() + 1e-3
    model.save_pretrained(tmp_path / "fp32", tokenizer_dir=minilm_dir)
    got = torch.as_tensor(load_runner(tmp_path / "fp32", backend="torch")(ids, mask, types)["logits"])
    assert (got - a).abs().max() < 1e-5


def test_pruned_heads_equal_zeroed_output_columns(tmp_path):
    model, ref = _model(), _model()
    ids, mask = _batch()
    with torch.no_grad():  # the truth: head 1 of layer 0 and head 3 of layer 2 contribute nothing
        for layer, h in ((0, 1), (2, 3)):
            att = ref.encoder.layers[layer].attention
            att.out.weight[:, h * att.head_dim:(h + 1) * att.head_dim] = 0
        want = ref(ids, mask).logits
    prune_heads(model, {0: [1], 2: [3]})
    assert head_counts(model) == [3, 4, 3]
    with torch.no_grad():
        assert (model(ids, mask).logits - want).abs().max() < 1e-5
    model.save_pretrained(tmp_path / "pruned")
    back = load_pretrained(tmp_path / "pruned")
    with torch.no_grad():
        assert (back(ids, mask).logits - want).abs().max() < 1e-5
    with pytest.raises(ConfigError, match="stack 2 FFNs"):
        prune_ffn(model, {0: [1]})


def test_layers_student_runs_the_teacher_blocks():
    from bertforge.distillation.student import build_student
    teacher = _model()
    student = build_student("layers:0,2", teacher, head="sequence_classification")
    assert student.config.model_type == "mobilebert" and student.config.num_hidden_layers == 2
    ids, mask = _batch()
    te = teacher.encoder
    with torch.no_grad():
        x = te.embeddings(ids)
        bias = torch.zeros(mask.shape).masked_fill(mask == 0, torch.finfo(torch.float32).min)[:, None, None, :]
        for i in (0, 2):
            x = te.layers[i](x, bias)[0]
        want = teacher.head.classifier(torch.tanh(te.pooler(x[:, 0])))
        assert (student(ids, mask).logits - want).abs().max() < 1e-5


def test_bench_flops_equal_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    from bertforge.checkpoint.write import config_to_hf
    from bertforge.models.output import Features
    from bertforge.runtime.bench import encoder_flops
    model = _model("base")
    ids = torch.randint(5, 120, (1, 20))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:  # attention written out: its matmuls count
        model(ids, torch.ones_like(ids), features=Features(attentions=True))
    assert encoder_flops(config_to_hf(model.config, "base"), 20) == counter.get_total_flops()
