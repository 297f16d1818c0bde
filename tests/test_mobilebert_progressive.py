"""MobileBERT's progressive knowledge transfer (Sun et al. 2020 §3.3–3.5), `distill --method mobilebert`.

Truths: the feature-map loss computed by hand (layer norm without affine, then the masked mean square); each
stage of one Trainer run lowers its own layer's feature-map and attention losses on a held-out batch, and
every student weight outside the stage's layer (and, after stage 1, the embeddings) is bit-for-bit what it
was when the stage began; the bad inputs are one line and exit 2.
"""
import pytest
import torch


from bertforge.config import ModelConfig, load_recipe
from bertforge.distillation.distiller import build_terms, method_terms
from bertforge.distillation.losses import attention_kl_loss, feature_map_mse_loss
from bertforge.distillation.progressive import ProgressiveDistiller
from bertforge.distillation.student import build_student, parse_mobilebert_shape
from bertforge.engine.train.trainer import Trainer
from bertforge.errors import ConfigError
from bertforge.models.output import Features
from bertforge.task_model import TaskModel

V, T, L = 60, 12, 3
STAGE_STEPS = 12


def test_feature_map_loss_is_the_mse_of_affine_free_layer_norms():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 5, 8, generator=g) * 3 + 1, torch.randn(2, 5, 8, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])

    def ln(x):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    want = ((ln(a) - ln(b)) ** 2).mean(-1)[mask.bool()].mean()
    assert torch.allclose(feature_map_mse_loss(a, b, mask), want, atol=1e-6)
    assert float(feature_map_mse_loss(a, 5 * a + 2, mask)) < 1e-8  # scale and shift do not count


def _teacher():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, hidden_size=32, num_hidden_layers=L, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return TaskModel(cfg, head="mlm").eval()


def _items(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(5, V, (T,), generator=g)
        mask = torch.ones(T, dtype=torch.long)
        mask[T - 1 - i % 4:] = 0
        labels = torch.full((T,), -100)
        labels[[1, 4]] = ids[[1, 4]]
        out.append({"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "mlm_labels": labels})
    return out


def _collate(items):
    return {k: torch.stack([it[k] for it in items]) for k in items[0]}


def _layer_losses(distiller, batch) -> list:
    """(feature-map loss, attention loss) of student layer l against teacher layer l, l = 1…L."""
    req = Features(hidden_states=True, attentions=True)
    with torch.no_grad():
        s = distiller.student.encoder(batch["input_ids"], batch["attention_mask"], features=req)
        t = distiller.teacher.encoder(batch["input_ids"], batch["attention_mask"], features=req)
    m = batch["attention_mask"]
    return [(float(feature_map_mse_loss(s.hidden_states[i], t.hidden_states[i], m)),
             float(attention_kl_loss(s.attentions[i - 1], t.attentions[i - 1], m))) for i in range(1, L + 1)]


def test_each_stage_lowers_its_layer_losses_and_leaves_frozen_weights_bit_unchanged(tmp_path):
    teacher = _teacher()
    student = build_student("mobilebert:3L-32H-16B-4A-32I-2F-8E", teacher, head="mlm")
    assert student.config.model_type == "mobilebert" and student.config.hidden_size == teacher.config.hidden_size
    terms = build_terms(method_terms("mobilebert", "general"), L, L)
    distiller = ProgressiveDistiller(student, [teacher], terms)
    probe = _collate(_items(8, seed=9))
    snaps, losses = [], []

    def record(model):
        snaps.append({k: v.detach().clone() for k, v in model.student.state_dict().items()})
        losses.append(_layer_losses(model, probe))
        return {"stage": float(model.stage)}

    record(distiller)
    recipe = load_recipe(None, ["train.batch_size=8", f"train.max_steps={STAGE_STEPS * (L + 1)}",
                                f"train.eval_every={STAGE_STEPS}", f"train.save_every={STAGE_STEPS * (L + 1)}",
                                "train.lr=3e-3", "train.warmup_ratio=0", "train.schedule=constant",
                                "train.load_best_at_end=false", "impl.progress=false", "impl.kernels=none"])
    trainer = Trainer(distiller, _items(32, seed=1), _collate, recipe, tmp_path / "run", eval_fn=record,
                      save_fn=lambda m, d: m.student.save_pretrained(d))
    distiller.set_schedule(trainer.total_steps)
    assert distiller.stage_steps == STAGE_STEPS
    trainer.fit()
    assert len(snaps) >= L + 2  # before, after each of the L layer stages, after the final stage
    for stage in range(1, L + 1):
        before, after = snaps[stage - 1], snaps[stage]
        own = f"encoder.layers.{stage - 1}."
        for k, v in before.items():
            trained = k.startswith(own) or (stage == 1 and k.startswith("encoder.embeddings."))
            if not trained:
                assert torch.equal(v, after[k]), (stage, k)
        assert any(not torch.equal(v, after[k]) for k, v in before.items() if k.startswith(own)), stage
        fm_before, at_before = losses[stage - 1][stage - 1]
        fm_after, at_after = losses[stage][stage - 1]
        assert fm_after < fm_before and at_after < at_before, (stage, losses[stage - 1], losses[stage])
    # the final stage (pre-training distillation: MLM + KD on the MLM logits) trains everything
    assert not torch.equal(snaps[L]["encoder.layers.0.attention.query.weight"],
                           snaps[L + 1]["encoder.layers.0.attention.query.weight"])


def test_bad_shapes_and_a_teacher_of_another_width_are_refused():
    with pytest.raises(ConfigError, match="3 heads do not divide the bottleneck width 16"):
        parse_mobilebert_shape("2L-32H-16B-3A")
    with pytest.raises(ConfigError, match="gives L twice"):  # the last one used to win silently
        parse_mobilebert_shape("1L-2L-8F-1F")
    from bertforge.distillation.student import parse_shape
    with pytest.raises(ConfigError, match="gives H twice"):
        parse_shape("4L-312H-128h")
    shape = parse_mobilebert_shape("", teacher_hidden=384, teacher_heads=12, teacher_layers=6)
    assert shape["hidden_size"] == 384 and shape["intra_bottleneck_size"] == 96
    assert shape["num_attention_heads"] == 12 and shape["num_hidden_layers"] == 6
    teacher = _teacher()
    student = build_student("mobilebert:2L-48H-16B", teacher, head="mlm")
    with pytest.raises(ConfigError, match="inter-block width 48 is not the teacher's hidden size 32"):
        ProgressiveDistiller(student, [teacher], build_terms(method_terms("mobilebert", "general"), 2, L))


def test_a_student_too_big_for_memory_is_refused_before_any_tensor_is_allocated():
    """A typo like 99999999999L used to build layers until the host swapped: the size estimate (16 bytes per
    weight: weights, gradients, AdamW's two moments) refuses it at once, and the estimate tracks the real count."""
    import time
    from bertforge.distillation.student import cross_family_config, estimate_parameters, parse_shape, student_config
    teacher = _teacher()
    for spec in ("mobilebert:99999999999L-32H-8B-2A", "99999999999L-32H", "2L-4000000H-1A-1I"):
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match="GiB .*more than this machine's"):
            build_student(spec, teacher, head="mlm")
        assert time.perf_counter() - t0 < 5  # refused, not built (building 1e11 layers never returns)
    base = ModelConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072)  # BERT-base's sizes
    for cfg in (student_config(base, parse_shape("4L-312H-12A-1200I")),  # TinyBERT-4: 14.4M
                cross_family_config(base, "mobilebert", parse_mobilebert_shape("6L-384H-96B-12A-384I-4F-384E"))):
        with torch.device("meta"):  # counted, not allocated
            real = sum(p.numel() for p in TaskModel(cfg, head="base").parameters())
        assert 0.7 < estimate_parameters(cfg) / real < 1.1, (cfg.model_type, estimate_parameters(cfg), real)


def test_the_cli_refuses_bad_shapes_and_widths_in_one_line(workspace, cli_error):
    base = ["distill", "--teacher", str(workspace.run), "--method", "mobilebert", "--task", "sst2", "--train",
            str(workspace.train), "--max-steps", "1", "--no-progress"]
    line = cli_error(base + ["--student", "mobilebert:2L-32H-16B-3A", "--out", str(workspace.d / "mb-a")],
                     workspace.run)
    assert "3 heads do not divide the bottleneck width 16" in line
    line = cli_error(base + ["--student", "mobilebert:2L-48H-16B-4A", "--out", str(workspace.d / "mb-b")],
                     workspace.run)
    assert "inter-block width 48 is not the teacher's hidden size 32" in line
    line = cli_error(base + ["--student", "mobilebert:99999999999L-32H-8B-2A", "--out", str(workspace.d / "mb-c")],
                     workspace.run)
    assert "more than this machine's" in line and not (workspace.d / "mb-c").exists()


def test_the_cli_runs_progressive_transfer_into_a_loadable_mobilebert_dir(workspace, capsys):
    from bertforge.checkpoint import load_pretrained
    from bertforge.cli import main
    out = workspace.d / "mb-ok"
    assert main(["distill", "--teacher", str(workspace.run), "--method", "mobilebert", "--task", "sst2", "--train",
                 str(workspace.train), "--student", "mobilebert:2L-16B-2A", "--max-steps", "6", "--batch-size", "8",
                 "--max-seq-len", "32", "--no-progress", "--out", str(out)]) == 0
    student = load_pretrained(out)
    assert student.config.model_type == "mobilebert" and student.config.hidden_size == 32
    assert student.head_name == "sequence_classification"
    assert "warning: progressive transfer" not in capsys.readouterr().err  # 6 steps cover the 3 stages
    # fewer steps than stages: said once, on stderr, and the run still writes its dir
    assert main(["distill", "--teacher", str(workspace.run), "--method", "mobilebert", "--task", "sst2", "--train",
                 str(workspace.train), "--student", "mobilebert:2L-16B-2A", "--max-steps", "2", "--batch-size", "8",
                 "--max-seq-len", "32", "--no-progress", "--out", str(workspace.d / "mb-short")]) == 0
    assert "has 3 stages" in capsys.readouterr().err and (workspace.d / "mb-short" / "config.json").is_file()
