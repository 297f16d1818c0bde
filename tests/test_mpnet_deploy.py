"""MPNet dirs through export (ONNX FP32 + INT8), PyTorch INT8, head pruning, `layers:` students, serving (the
runner the server calls) and cross-family distillation.

Truths: the ONNX graph against the PyTorch model on a padded batch longer than MPNet's exact buckets; ONNX
Runtime's INT8 against ONNX's reference evaluator of the same quantized graph in exact integer arithmetic; a
pruned model against the unpruned one with the removed heads' output columns zeroed (its shared position bias
keeps each remaining head's own column); a `layers:` student against the teacher blocks it copies.
"""
import torch

from helpers_mpnet import make_tiny_mpnet, padded_batch, randomise, tiny_mpnet_config

from bertforge.checkpoint import load_pretrained
from bertforge.compress.int8 import reference_run
from bertforge.compress.onnx import deploy
from bertforge.compress.prune import head_counts, prune_heads
from bertforge.compress.quantize import load_quantized, quantize_dynamic, save_quantized
from bertforge.runtime import load_runner
from bertforge.task_model import TaskModel


def _model(head="sequence_classification", **kw):
    torch.manual_seed(0)
    model = TaskModel(tiny_mpnet_config(num_hidden_layers=3, **kw), head=head).eval()
    randomise(model)
    return model


def test_export_and_int8_graphs_match_pytorch(tmp_path):
    tok = make_tiny_mpnet(tmp_path / "tok")
    ids, mask = padded_batch([40, 7, 19], vocab=90)  # 40 tokens: log-spaced buckets are read
    for head, int8 in (("sequence_classification", False), ("token_classification", True)):
        model = _model(head)
        with torch.no_grad():
            ref = model(ids, mask).logits
        rec = deploy(model, tmp_path / head, source_dir=tok, quantize=int8)
        assert rec["fp32_max_abs_diff"] < 1e-4 and "token_type_ids" not in rec["inputs"]
        got = torch.as_tensor(load_runner(tmp_path / head)(ids, mask)["logits"])  # what `serve` runs
        real = mask.bool() if head == "token_classification" else slice(None)
        if int8:
            assert rec["exact_on_target"]
            exact = torch.as_tensor(reference_run(tmp_path / head / "model.onnx",
                                                  {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))
            quant_error = (exact[real] - ref[real]).abs().max()
            assert quant_error < 0.1 * ref[real].abs().max()
            assert (got[real] - exact[real]).abs().max() <= 0.1 * quant_error
        else:
            assert (got[real] - ref[real]).abs().max() < 1e-4
    model = _model()
    q = quantize_dynamic(model)
    save_quantized(q, model, tmp_path / "q", tokenizer_dir=tok)
    with torch.no_grad():
        a, b = model(ids, mask).logits, load_quantized(tmp_path / "q")(ids, mask).logits
    assert (a - b).abs().max() < 0.1 * a.abs().max() + 1e-3


def test_pruned_heads_keep_their_own_position_bias(tmp_path):
    model, ref = _model(), _model()
    ids, mask = padded_batch([30, 9, 17], seed=2)
    with torch.no_grad():  # the truth: heads 1 and 3 of layer 0, head 0 of layer 2 contribute nothing
        d = ref.encoder.layers[0].attention.head_dim
        ref.encoder.layers[0].attention.out.weight[:, d:2 * d] = 0
        ref.encoder.layers[0].attention.out.weight[:, 3 * d:4 * d] = 0
        ref.encoder.layers[2].attention.out.weight[:, :d] = 0
        want = ref(ids, mask).logits
    prune_heads(model, {0: [1, 3], 2: [0]})
    assert head_counts(model) == [2, 4, 3]
    with torch.no_grad():
        assert (model(ids, mask).logits - want).abs().max() < 1e-5
    model.save_pretrained(tmp_path / "pruned")
    back = load_pretrained(tmp_path / "pruned")
    with torch.no_grad():
        assert (back(ids, mask).logits - want).abs().max() < 1e-5


def test_layers_students_copy_blocks_and_the_shared_bias():
    from bertforge.distillation.student import build_student
    teacher = _model("base")
    student = build_student("layers:0,2", teacher, head="base")
    assert student.config.model_type == "mpnet" and student.config.num_hidden_layers == 2
    assert torch.equal(student.encoder.relative_attention_bias.weight, teacher.encoder.relative_attention_bias.weight)
    # the truth: the teacher run with its block 1 skipped
    ids, mask = padded_batch([25, 12], seed=3)
    from bertforge.models.attention import padding_mask_bias
    with torch.no_grad():
        got = student(ids, mask).last_hidden_state
        enc = teacher.encoder
        x = enc.embeddings(ids)
        bias = enc.layer_bias(padding_mask_bias(mask, x.dtype), enc.position_bias(x.shape[1], x.device), 0)
        for i in (0, 2):
            x = enc.layers[i](x, bias)[0]
    assert (got - x)[mask.bool()].abs().max() < 1e-6


def test_cross_family_students_of_an_mpnet_teacher():
    from bertforge.distillation.distiller import Distiller, build_terms, method_terms
    from bertforge.distillation.student import build_student
    teacher = _model("sequence_classification")
    ids, mask = padded_batch([20, 9, 14], seed=5)
    for spec in ("bert:2L-32H-2A-64I", "modernbert:2L-32H-2A-48I"):
        student = build_student(spec, teacher, head="sequence_classification")
        assert student.config.vocab_size == teacher.config.vocab_size
        out = Distiller(student, [teacher], build_terms(method_terms("kd", "task"), 2, 3)).train()(
            ids, mask, labels=torch.tensor([0, 1, 2]))
        assert torch.isfinite(out.loss) and out.loss > 0
