"""`bertforge distill` end to end on a tiny teacher: task stage (KD, augmentation, cache), general stage
(TinyBERT shape), chaining general → task, user errors."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.config import ModelConfig
from bertforge.task_model import TaskModel

SENTS = ["a charming and affecting journey .", "the movie is dull and boring .", "good acting , great film .",
         "it is a terrible mess .", "funny and warm .", "nothing works in this film .",
         "an excellent , moving story .", "bad script , worse direction ."]


def save_tiny(d, head, tokenizer_dir, task=None, layers=4, positions=64, **kw):
    """A tiny MiniLM-vocabulary checkpoint (H 32, 4 heads, FFN 64) with ``head`` at ``d``; ``task`` records
    the task and a fine-tuning length of 32. Returns ``d``."""
    cfg = ModelConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=positions, **kw)
    m = TaskModel(cfg, head=head)
    if task:
        m.config.bertforge = {"task": task, "max_seq_len": 32}
    m.save_pretrained(d, tokenizer_dir=tokenizer_dir)
    return d


CLS2 = dict(num_labels=2, problem_type="single_label_classification", id2label={0: "0", 1: "1"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("distill")
    torch.manual_seed(0)
    save_tiny(root / "teacher", "sequence_classification", minilm_dir, task="sst2", **CLS2)
    rows = ["sentence\tlabel"] + [f"{s}\t{i % 2}" for i, s in enumerate(SENTS * 3)]
    (root / "train.tsv").write_text("\n".join(rows) + "\n")
    (root / "dev.tsv").write_text("\n".join(rows[:9]) + "\n")
    (root / "corpus.txt").write_text(" = Heading = \n\n" + "\n\n".join(" ".join(SENTS[i:] + SENTS[:i])
                                                                    for i in range(8)) + "\n")
    return root


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_task_stage_kd_copied_student_with_cache_and_augmentation(tiny, capsys):
    out = tiny / "kd"
    rc = main(["distill", "--teacher", str(tiny / "teacher"), "--student", "layers:0,2", "--method", "kd",
               "--task", "sst2", "--train", str(tiny / "train.tsv"), "--eval", str(tiny / "dev.tsv"),
               "--out", str(out), "--epochs", "2", "--batch-size", "8", "--augment", "1",
               "--temperature", "3", "--alpha", "0.7", "train.log_every=1"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["student"] == "layers:0,2"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["bertforge"]["student"]["layers"] == [0, 2]
    assert cfg["bertforge"]["distill"]["losses"][0]["temperature"] == 3.0
    assert cfg["bertforge"]["distill"]["losses"][0]["alpha"] == 0.7
    m = _metrics(out)
    assert any("kd" in r for r in m) and any("eval" in r for r in m)
    filled = np.load(out / "teacher_cache" / "filled.npy")
    assert len(filled) == 48 and filled.all()  # 24 originals + 24 augmented copies, all cached in epoch 1
    from transformers import AutoModelForSequenceClassification
    hf = AutoModelForSequenceClassification.from_pretrained(out)
    assert hf.config.num_hidden_layers == 2
    # recipe.yaml records what the run used (flags included), so --recipe repeats it
    import yaml
    rec = yaml.safe_load((out / "recipe.yaml").read_text())["distill"]
    assert rec["temperature"] == 3.0 and rec["alpha"] == 0.7 and rec["augment"]["copies"] == 1
    assert rec["losses"][0]["loss"] == "kd" and rec["losses"][0]["temperature"] == 3.0  # as applied
    assert rec["losses"][0]["alpha"] == 0.7
    assert all(Path(t).is_absolute() for t in rec["teachers"])
    again = tiny / "kd-again"
    assert main(["distill", "--recipe", str(out / "recipe.yaml"), "--teacher", str(tiny / "teacher"),
                 "--task", "sst2", "--train", str(tiny / "train.tsv"), "--out", str(again), "--max-steps", "1",
                 "--batch-size", "8"]) == 0
    capsys.readouterr()
    term = json.loads((again / "config.json").read_text())["bertforge"]["distill"]["losses"][0]
    assert term["temperature"] == 3.0 and term["alpha"] == 0.7
    state = json.loads(next((again / "checkpoints").glob("step-*/trainer_state.json")).read_text())
    assert state["n_examples"] == 48  # augmentation repeated: 24 originals + 24 copies


def test_general_then_task_chain(tiny, capsys, monkeypatch):
    from safetensors.torch import load_file
    from bertforge.distillation.distiller import PROJECTIONS_FILE, Distiller
    g = tiny / "general"
    assert main(["distill", "--stage", "general", "--teacher", str(tiny / "teacher"), "--student",
                 "2L-16H-2A-32I", "--method", "tinybert", "--corpus", str(tiny / "corpus.txt"),
                 "--out", str(g), "--max-steps", "3", "--batch-size", "4", "--max-seq-len", "16",
                 "train.log_every=1"]) == 0
    m = _metrics(g)
    assert {"embedding_mse", "hidden_mse", "attention_mse"} <= set(m[0])
    cfg = json.loads((g / "config.json").read_text())
    assert cfg["hidden_size"] == 16 and cfg["bertforge"]["distill"]["stage"] == "general"
    # the learned W_e and the one W_h (student 16 → teacher 32) are kept beside the student …
    saved = load_file(str(g / PROJECTIONS_FILE))
    assert {k: tuple(v.shape) for k, v in saved.items()} == {
        "embedding_mse.weight": (32, 16), "embedding_mse.bias": (32,),
        "hidden_mse.weight": (32, 16), "hidden_mse.bias": (32,)}
    # … and the task stage starts from them (TinyBERT's reference code carries them over too)
    loaded = {}
    real = Distiller.load_projections

    def spy(self, src):
        names = real(self, src)
        loaded.update({k: self.proj[k].weight.detach().clone() for k in names})
        return names
    monkeypatch.setattr(Distiller, "load_projections", spy)
    t = tiny / "task"
    assert main(["distill", "--teacher", str(tiny / "teacher"), "--student", str(g), "--method", "tinybert",
                 "--task", "sst2", "--train", str(tiny / "train.tsv"), "--out", str(t), "--max-steps", "2",
                 "--batch-size", "8", "--no-cache", "train.log_every=1"]) == 0
    m = _metrics(t)
    assert {"soft_ce", "hidden_mse", "attention_mse", "embedding_mse"} <= set(m[0])
    assert set(loaded) == {"embedding_mse", "hidden_mse"}
    assert torch.equal(loaded["hidden_mse"], saved["hidden_mse.weight"])
    cfg = json.loads((t / "config.json").read_text())
    assert cfg["bertforge"]["student"]["from_dir"] == str(g) and cfg["bertforge"]["student"]["shape"]["hidden_size"] == 16


def test_user_errors(tiny, capsys, minilm_dir):
    assert main(["distill", "--stage", "general", "--teacher", str(minilm_dir), "--student", "layers:0",
                 "--method", "kd", "--corpus", str(tiny / "corpus.txt"), "--out", str(tiny / "e1")]) == 2
    assert "MLM head" in capsys.readouterr().err
    assert main(["distill", "--teacher", str(tiny / "teacher"), "--student", "layers:0,9", "--task", "sst2",
                 "--train", str(tiny / "train.tsv"), "--out", str(tiny / "e2")]) == 2
    assert "0…3" in capsys.readouterr().err
    assert main(["distill", "--teacher", str(tiny / "teacher"), "--student", "4L-30H-7A", "--task", "sst2",
                 "--train", str(tiny / "train.tsv"), "--out", str(tiny / "e3")]) == 2
    assert not (tiny / "e2").exists() or not any((tiny / "e2").iterdir())


def test_head_pruned_dir_is_recovered_by_kd_from_the_unpruned_teacher(tiny):
    """Pruning recovery (docs/compress.md): `bertforge prune` → `bertforge distill --student <pruned dir>`. The
    student keeps its uneven per-layer head counts (one layer with none), and KD moves its predictions toward
    the teacher's (truth: KL(teacher ‖ student) on the training sentences, before vs after)."""
    from bertforge.compress import prune as P
    from bertforge.checkpoint import load_pretrained
    from bertforge.tokenizer import load_tokenizer
    teacher = load_pretrained(tiny / "teacher").eval()
    with torch.no_grad():  # a confident teacher, so removing heads visibly moves the predictions
        teacher.head.classifier.weight.mul_(300.0)
    teacher.save_pretrained(tiny / "sharp", tokenizer_dir=tiny / "teacher")
    pruned = load_pretrained(tiny / "teacher").eval()  # far from the sharp teacher: KD must move it
    P.prune_heads(pruned, {0: [0, 1, 2, 3], 1: [0, 1, 2], 2: [1]})
    pruned.save_pretrained(tiny / "pruned", tokenizer_dir=tiny / "teacher")
    out = tiny / "recovered"
    assert main(["distill", "--teacher", str(tiny / "sharp"), "--student", str(tiny / "pruned"), "--method",
                 "kd", "--task", "sst2", "--train", str(tiny / "train.tsv"), "--out", str(out), "--epochs",
                 "8", "--batch-size", "8", "--lr", "1e-3", "--temperature", "1", "--alpha", "1",
                 "train.warmup_steps=0", "train.dropout_off=true"]) == 0
    rec = load_pretrained(out).eval()
    assert P.head_counts(rec) == P.head_counts(pruned) == [0, 1, 3, 4]  # layer 0 keeps no head
    tok = load_tokenizer(tiny / "teacher")
    ids = [e.ids for e in tok.encode_batch(SENTS)]
    width = max(map(len, ids))
    x = {"input_ids": torch.tensor([i + [0] * (width - len(i)) for i in ids]),
         "attention_mask": torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])}

    def kl_to_teacher(m):
        with torch.no_grad():
            pt = torch.softmax(teacher(**x).logits, -1)
            return float((pt * (pt.log() - torch.log_softmax(m(**x).logits, -1))).sum(-1).mean())
    assert kl_to_teacher(rec) < 0.5 * kl_to_teacher(pruned), (kl_to_teacher(rec), kl_to_teacher(pruned))


def test_distilbert_general_without_teacher_mlm_head_warns_and_trains_cosine(tiny, capsys):
    out = tiny / "db-general"
    assert main(["distill", "--stage", "general", "--teacher", str(tiny / "teacher"), "--student", "layers:0",
                 "--method", "distilbert", "--corpus", str(tiny / "corpus.txt"), "--out", str(out),
                 "--max-steps", "2", "--batch-size", "4", "--max-seq-len", "16", "train.log_every=1"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "mlm_soft" in err and "cosine" in err
    m = _metrics(out)
    assert "cosine" in m[0] and "mlm_soft" not in m[0]


def test_distilbert_general_trains_all_three_terms_with_bert_masking(tiny, capsys, cli_error):
    """Sanh et al. 2019 §3: L = 5·L_ce + 2·L_mlm + 1·L_cos on MLM-corrupted text: all three terms train
    (the hard L_mlm term included), and without --mlm-prob the inputs are masked at BERT's 15%."""
    import yaml
    import bertforge.checkpoint.read  # noqa: F401  (registers the mlm head)
    from bertforge.distillation.distiller import Distiller, build_terms, method_terms
    from bertforge.distillation.student import build_student
    from bertforge.checkpoint import load_pretrained
    torch.manual_seed(0)
    tdir = tiny / "mlm-teacher"
    if not tdir.exists():
        save_tiny(tdir, "mlm", tiny / "teacher")
    # the Distiller's mlm term is 2 × the student's own masked-token cross-entropy, computed here apart
    teacher = load_pretrained(tdir)
    student = build_student("layers:0,2", teacher, head="mlm")
    terms = build_terms(method_terms("distilbert", "general"), 2, 4)
    dist = Distiller(student, [teacher], terms).eval()
    ids = torch.randint(1000, 30000, (2, 9))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 5] = ids[0, 3], ids[1, 5]
    masked = ids.clone()
    masked[labels != -100] = 103
    with torch.no_grad():
        out = dist(masked, torch.ones_like(ids), mlm_labels=labels)
        z = student(masked, torch.ones_like(ids)).logits
    own = torch.nn.functional.cross_entropy(z[labels != -100], labels[labels != -100])
    assert set(out.terms) == {"mlm_soft", "mlm", "cosine"}
    assert float(out.terms["mlm"]) == pytest.approx(2.0 * float(own), rel=1e-5)
    assert float(out.loss) == pytest.approx(float(sum(out.terms.values())), rel=1e-5)
    # end to end: every term is logged and the run records the 15% masking it used
    out_dir = tiny / "db-mlm"
    assert main(["distill", "--stage", "general", "--teacher", str(tdir), "--student", "layers:0,2",
                 "--method", "distilbert", "--corpus", str(tiny / "corpus.txt"), "--out", str(out_dir),
                 "--max-steps", "2", "--batch-size", "4", "--max-seq-len", "16", "train.log_every=1"]) == 0
    capsys.readouterr()
    m = _metrics(out_dir)
    assert {"mlm_soft", "mlm", "cosine"} <= set(m[0])
    assert yaml.safe_load((out_dir / "recipe.yaml").read_text())["distill"]["mlm_probability"] == 0.15
    # the hard MLM term cannot learn from unmasked inputs: refused in one line, nothing written
    bad = tiny / "db-nomask"
    line = cli_error(["distill", "--stage", "general", "--teacher", tdir, "--student", "layers:0",
                      "--method", "distilbert", "--corpus", tiny / "corpus.txt", "--out", bad,
                      "--max-steps", "1", "--mlm-prob", "0"], tdir)
    assert "mlm term predicts masked tokens" in line and "--mlm-prob" in line
    assert not bad.exists()


def test_augment_mlm_gives_single_piece_words_the_masked_lms_candidates(tiny, capsys, cli_error):
    """TinyBERT §3.3: single-piece words are replaced by a masked LM's top-K predictions. The task-stage
    teacher is a classifier, so --augment-mlm DIR supplies the masked LM; without it every word comes from
    embedding neighbours and a note says so."""
    import yaml
    import bertforge.checkpoint.read  # noqa: F401  (registers the mlm head)
    from bertforge.distillation.augment import MaskedLMPredictor, default_augmenter
    from bertforge.checkpoint import load_pretrained
    from bertforge.tokenizer import load_tokenizer
    torch.manual_seed(1)
    mlm_dir = save_tiny(tiny / "aug-mlm", "mlm", tiny / "teacher", layers=2)
    tok, mlm = load_tokenizer(tiny / "teacher"), load_pretrained(mlm_dir)
    aug = default_augmenter(tok, load_pretrained(tiny / "teacher"), p=1.0, k=3, mlm_model=mlm)
    words = "the movie is dull".split()  # "dull": one word piece in the MiniLM vocabulary
    assert len(tok.encode("dull", add_special_tokens=False).ids) == 1
    expect = MaskedLMPredictor(tok, lambda x: mlm(x).logits).candidates(words, 3, 3)
    assert aug.candidates(words)[3] == expect and len(expect) == 3
    assert all(c.split()[3] in expect for c in aug.augment(" ".join(words), 5))
    # CLI: the masked LM is used and recorded; without it, a note
    out = tiny / "aug-kd"
    assert main(["distill", "--teacher", str(tiny / "teacher"), "--student", "layers:0", "--task", "sst2",
                 "--train", str(tiny / "train.tsv"), "--out", str(out), "--max-steps", "1", "--augment", "1",
                 "--augment-mlm", str(mlm_dir)]) == 0
    assert "--augment-mlm" not in capsys.readouterr().err
    rec = yaml.safe_load((out / "recipe.yaml").read_text())["distill"]["augment"]
    assert rec["mlm"] == str(mlm_dir.resolve())
    assert main(["distill", "--teacher", str(tiny / "teacher"), "--student", "layers:0", "--task", "sst2",
                 "--train", str(tiny / "train.tsv"), "--out", str(tiny / "aug-kd2"), "--max-steps", "1",
                 "--augment", "1"]) == 0
    assert "pass --augment-mlm DIR" in capsys.readouterr().err
    # refused in one line: a classifier as the masked LM, no --augment, the general stage
    base = ["distill", "--teacher", tiny / "teacher", "--student", "layers:0", "--task", "sst2",
            "--train", tiny / "train.tsv", "--max-steps", "1"]
    line = cli_error(base + ["--out", tiny / "aug-bad1", "--augment", "1", "--augment-mlm",
                             tiny / "teacher"], tiny / "teacher")
    assert "not a masked-LM one" in line
    line = cli_error(base + ["--out", tiny / "aug-bad2", "--augment-mlm", mlm_dir], mlm_dir)
    assert "pass --augment N too" in line


def test_augment_prob_zero_is_used_and_augment_options_need_the_task_stage(tiny, capsys, cli_error):
    """--augment-prob 0 is a valid rate (no word replaced) and is recorded as given, not replaced by the
    0.4 default; --augment / --augment-prob in the general stage, or --augment-prob alone, are refused."""
    import yaml
    out = tiny / "aug0"
    base = ["distill", "--teacher", str(tiny / "teacher"), "--student", "layers:0,2", "--method", "kd",
            "--task", "sst2", "--train", str(tiny / "train.tsv"), "--max-steps", "1", "--batch-size", "8"]
    assert main([*base, "--out", str(out), "--augment", "1", "--augment-prob", "0"]) == 0
    capsys.readouterr()
    assert yaml.safe_load((out / "recipe.yaml").read_text())["distill"]["augment"]["prob"] == 0.0
    general = ["distill", "--stage", "general", "--teacher", str(tiny / "teacher"), "--student", "layers:0,2",
               "--method", "tinybert", "--corpus", str(tiny / "corpus.txt"), "--max-steps", "1"]
    line = cli_error([*general, "--augment", "2", "--out", tiny / "g-aug"], tiny / "teacher")
    assert "--stage task only" in line
    line = cli_error([*base, "--augment-prob", "0.2", "--out", tiny / "p-only"], tiny / "teacher")
    assert "pass --augment N too" in line


def test_an_explicit_method_replaces_a_recipes_losses(tiny, capsys):
    """A recipe written for TinyBERT (its losses list) run with --method kd trains with KD's own term and
    says so; the recorded method and losses are the ones used."""
    import yaml
    recipe = tiny / "tb.yaml"
    recipe.write_text(yaml.safe_dump({"distill": {"method": "tinybert", "losses": [
        {"loss": "hidden_mse", "weight": 1.0}, {"loss": "soft_ce", "weight": 1.0}]}}))
    out = tiny / "kd-over"
    assert main(["distill", "--recipe", str(recipe), "--teacher", str(tiny / "teacher"), "--student",
                 "layers:0,2", "--method", "kd", "--task", "sst2", "--train", str(tiny / "train.tsv"),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "8", "train.log_every=1"]) == 0
    assert "--method kd replaces the recipe's losses list (method tinybert)" in capsys.readouterr().err
    rec = yaml.safe_load((out / "recipe.yaml").read_text())["distill"]
    assert rec["method"] == "kd" and {e["loss"] for e in rec["losses"]} == {"kd"}
    logged = set().union(*[set(r) for r in _metrics(out) if "loss" in r])
    assert "kd" in logged and "hidden_mse" not in logged


def test_a_recipes_max_seq_len_is_kept_even_when_it_equals_the_default(tiny, capsys):
    """With no length asked for, the student trains at the teacher's fine-tuning length; a recipe file that
    sets data.max_seq_len: 128 (the default's value) is kept, not overridden by it."""
    import yaml
    torch.manual_seed(0)
    tdir = save_tiny(tiny / "teacher-160", "sequence_classification", tiny / "teacher", task="sst2", layers=2,
                     positions=160, **CLS2)
    recipe = tiny / "len128.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"max_seq_len": 128}}))
    lens = {}
    for name, extra in (("plain", []), ("recipe", ["--recipe", str(recipe)])):
        out = tiny / f"len-{name}"
        assert main(["distill", "--teacher", str(tdir), "--student", "layers:0", "--task", "sst2",
                     "--train", str(tiny / "train.tsv"), "--out", str(out), "--max-steps", "1",
                     "--batch-size", "8", *extra]) == 0
        lens[name] = yaml.safe_load((out / "recipe.yaml").read_text())["data"]["max_seq_len"]
    capsys.readouterr()
    assert lens == {"plain": 32, "recipe": 128}


def test_a_student_dir_with_another_label_space_gets_a_fresh_head(tiny, capsys):
    """An STS-B regressor (1 output) as the student of an SST-2 teacher (2 labels) loads as transformers'
    ignore_mismatched_sizes does: the encoder is kept and the head is new (and said so), with no false
    "config.json and the weights disagree" about a file that is fine."""
    from bertforge.checkpoint import load_pretrained
    torch.manual_seed(0)
    rdir = save_tiny(tiny / "stsb-student", "sequence_classification", tiny / "teacher", task="stsb", layers=2,
                     num_labels=1, problem_type="regression")
    out = tiny / "from-stsb"
    assert main(["distill", "--teacher", str(tiny / "teacher"), "--student", str(rdir), "--task", "sst2",
                 "--train", str(tiny / "train.tsv"), "--out", str(out), "--max-steps", "1",
                 "--batch-size", "8"]) == 0
    assert "has 1 output(s), not the 2 asked for; it is initialised fresh" in capsys.readouterr().err
    s = load_pretrained(out)
    assert s.head.classifier.weight.shape == (2, 32) and s.config.num_labels == 2


def test_a_pretraining_checkpoint_teaches_distilbert_with_its_mlm_head(tiny, capsys):
    """A `bertforge pretrain --objective bert` run is BertForPreTraining (MLM + NSP). Its masked-LM part is
    recognised (no "has no MLM head, so the mlm_soft and mlm term(s) … are dropped"): it teaches with it,
    and loading it as a masked LM gives the pretraining head's MLM logits exactly."""
    import bertforge.checkpoint.read  # noqa: F401  (registers the pretraining heads)
    from bertforge.checkpoint import load_pretrained
    torch.manual_seed(0)
    tdir = save_tiny(tiny / "bert-pretraining", "mlm_nsp", tiny / "teacher", layers=2)
    x = torch.randint(1000, 30000, (2, 7))
    with torch.no_grad():
        assert torch.equal(load_pretrained(tdir)(x).logits, load_pretrained(tdir, head="mlm")(x).logits)
    out = tiny / "db-from-pretraining"
    assert main(["distill", "--stage", "general", "--teacher", str(tdir), "--student", "layers:0",
                 "--method", "distilbert", "--corpus", str(tiny / "corpus.txt"), "--out", str(out),
                 "--max-steps", "1", "--batch-size", "4", "--max-seq-len", "16", "train.log_every=1"]) == 0
    err = capsys.readouterr().err
    assert "no MLM head" not in err and "initialised fresh" not in err
    assert {"mlm_soft", "mlm", "cosine"} <= set(_metrics(out)[0])


def test_flag_override_conflicts_and_other_stages_options_are_refused(tiny, capsys, cli_error):
    """A flag and an override of one key must agree (as the README says): `--temperature 2
    distill.temperature=3`, `--method kd distill.method=pkd`… are refused; `--corpus` with --task/--train
    (options of two stages) is refused rather than training one stage and dropping the other's options."""
    t = tiny / "teacher"
    base = ["distill", "--teacher", t, "--student", "layers:0", "--max-steps", "1"]
    task = ["--task", "sst2", "--train", tiny / "train.tsv"]
    for extra, want in ((["--temperature", "2", "distill.temperature=3"], "--temperature 2.0 conflicts with "
                                                                         "distill.temperature=3"),
                        (["--method", "kd", "distill.method=pkd"], "--method kd conflicts with distill.method=pkd"),
                        (["--alpha", "0.5", "distill.alpha=0.7"], "--alpha 0.5 conflicts with distill.alpha=0.7")):
        line = cli_error(base + task + ["--out", tiny / "conflict"] + extra, t)
        assert want in line, line
    # the same value twice is fine
    assert main([str(a) for a in base + task + ["--out", tiny / "agree", "--batch-size", "8", "--temperature", "2",
                                                "distill.temperature=2.0"]]) == 0
    capsys.readouterr()
    line = cli_error(base + task + ["--corpus", tiny / "corpus.txt", "--out", tiny / "mixed"], t)
    assert "--task belongs to --stage task" in line
    line = cli_error(base + ["--stage", "task", "--task", "sst2", "--train", tiny / "train.tsv", "--corpus",
                             tiny / "corpus.txt", "--out", tiny / "mixed2"], t)
    assert "--corpus (raw text) belongs to --stage general" in line
