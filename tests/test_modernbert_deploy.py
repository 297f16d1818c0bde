"""ModernBERT dirs through export (ONNX + INT8), PyTorch INT8, pruning and cross-family distillation.

Truths: the ONNX graph against the PyTorch model on a padded batch longer than the local window (the
export's own parity check plus the runtime's logits); ONNX Runtime's INT8 against ONNX's reference evaluator
of the same quantized graph in exact integer arithmetic (the scheme's own result, on every host kind); a pruned model against the unpruned one with the removed heads / GeGLU units zeroed (same logits).
"""
import torch

from bertforge.checkpoint import load_pretrained
from bertforge.compress.int8 import reference_run
from bertforge.compress.onnx import deploy
from bertforge.compress.prune import ffn_sizes, head_counts, prune_ffn, prune_heads
from bertforge.compress.quantize import load_quantized, quantize_dynamic, save_quantized
from bertforge.config import ModelConfig
from bertforge.errors import ConfigError
from bertforge.runtime import load_runner
from bertforge.task_model import TaskModel

WINDOW = 8


def _model(head="sequence_classification", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="modernbert", vocab_size=120, hidden_size=32, num_hidden_layers=3,
                      num_attention_heads=4, intermediate_size=48, max_position_embeddings=128, local_attention=WINDOW,
                      type_vocab_size=0, add_pooling_layer=False, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=3, **kw)
    return TaskModel(cfg, head=head).eval()


def _batch(lengths=(24, 7, 15), seed=1):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 120, (len(lengths), t), generator=g).masked_fill(mask == 0, 0)
    return ids, mask


def test_export_and_int8_graphs_match_pytorch(tmp_path, minilm_dir):
    ids, mask = _batch()  # 24 tokens, local layers see ±4
    # a mean-pooled classifier as an FP32 graph; a token classifier as INT8 (deploy checks FP32 parity first)
    for head, pooling, int8 in (("sequence_classification", "mean", False), ("token_classification", "cls", True)):
        model = _model(head, classifier_pooling=pooling)
        with torch.no_grad():
            ref = model(ids, mask).logits
        rec = deploy(model, tmp_path / head, source_dir=minilm_dir, quantize=int8)
        assert rec["fp32_max_abs_diff"] < 1e-4 and rec["inputs"] == ["input_ids", "attention_mask"]
        got = torch.as_tensor(load_runner(tmp_path / head)(ids, mask)["logits"])
        real = mask.bool() if head == "token_classification" else slice(None)
        if int8:  # the scheme this host's kind gets; ONNX Runtime must compute it (no saturating kernel):
            # its result equals the exact integer reference of the same graph far inside the scheme's own error
            assert rec["quantization"].startswith("onnxruntime dynamic int8") and rec["exact_on_target"]
            exact = torch.as_tensor(reference_run(tmp_path / head / "model.onnx",
                                                  {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))
            quant_error = (exact[real] - ref[real]).abs().max()
            assert quant_error < 0.1 * ref[real].abs().max()
            assert (got[real] - exact[real]).abs().max() <= 0.1 * quant_error
        else:
            assert (got[real] - ref[real]).abs().max() < 1e-4
    # PyTorch dynamic INT8 of the same kind of dir, saved and loaded back
    model = _model()
    q = quantize_dynamic(model)
    save_quantized(q, model, tmp_path / "q", tokenizer_dir=minilm_dir)
    with torch.no_grad():
        a, b = model(ids, mask).logits, load_quantized(tmp_path / "q")(ids, mask).logits
    assert (a - b).abs().max() < 0.1 * a.abs().max() + 1e-3


def test_pruned_heads_and_units_equal_zeroed_weights(tmp_path):
    model = _model()
    ids, mask = _batch()
    ref = _model()
    with torch.no_grad():  # the truth: the same model with head 1 of layer 0 and units 0, 5 of layer 2 zeroed
        att = ref.encoder.layers[0].attention
        d, inner = att.head_dim, att.num_heads * att.head_dim
        att.out.weight[:, d:2 * d] = 0
        ffn = ref.encoder.layers[2].ffn
        ffn.wo.weight[:, [0, 5]] = 0
        want = ref(ids, mask).logits
    prune_heads(model, {0: [1]})
    prune_ffn(model, {2: [0, 5]})
    assert head_counts(model) == [3, 4, 4] and ffn_sizes(model) == [48, 48, 46]
    with torch.no_grad():
        assert (model(ids, mask).logits - want).abs().max() < 1e-5
    model.save_pretrained(tmp_path / "pruned")
    back = load_pretrained(tmp_path / "pruned")
    with torch.no_grad():
        assert (back(ids, mask).logits - want).abs().max() < 1e-5


def test_cross_family_students_and_the_local_window_rule():
    from bertforge.distillation.distiller import Distiller, build_terms, method_terms
    from bertforge.distillation.student import build_student
    teacher = TaskModel(ModelConfig(vocab_size=120, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                    intermediate_size=64, max_position_embeddings=64, num_labels=2),
                        head="sequence_classification").eval()
    student = build_student("modernbert:3L-48H-2A-64I", teacher, head="sequence_classification")
    c = student.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.vocab_size) == ("modernbert", 3, 48, 120)
    assert [c.layer_type(i) for i in range(3)] == ["full_attention", "sliding_attention", "sliding_attention"]
    # logit KD, hidden states through W_h and value relations pair any layers; attention maps only global ones
    ids, mask = _batch(seed=3)
    ids = ids % 120
    for method in ("kd", "tinybert"):
        terms = build_terms(method_terms(method, "task"), 3, 4, layer_map="1:2" if method == "tinybert" else None)
        out = Distiller(student, [teacher], terms).train()(ids, mask, labels=torch.tensor([0, 1, 1]))
        assert torch.isfinite(out.loss) and out.loss > 0
    # and back: a ModernBERT teacher into a small BERT student
    bert = build_student("bert:2L-32H-2A-64I", student.eval(), head="sequence_classification")
    assert bert.config.model_type == "bert" and bert.config.vocab_size == 120
    out = Distiller(bert, [student], build_terms(method_terms("kd", "task"), 2, 3)).train()(ids, mask, labels=torch.tensor([1, 0, 1]))
    assert torch.isfinite(out.loss)
    try:
        build_student("gpt:2L-32H", teacher, head="sequence_classification")
        raise AssertionError("an unknown family must be refused")
    except ConfigError as e:
        assert "gpt" in str(e) and "modernbert" in str(e)
    local = student.config.replace(local_attention=8)
    student = TaskModel(local, head="sequence_classification")
    terms = build_terms(method_terms("minilm", "task"), 3, 4)  # last student layer (3) is local: refused
    try:
        Distiller(student, [teacher], terms)
        raise AssertionError("a local student layer paired with a global teacher layer must be refused")
    except ConfigError as e:
        assert "student layer 3, local (±4 positions)" in str(e) and "teacher layer 4, global" in str(e)
