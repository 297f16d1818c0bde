"""Fine-tuning the embedded all-MiniLM-L6-v2 under torchrun (issue #49 item 1).

The checkpoint has a pooler but declares mean pooling, so the classification head reads the mean of the last
layer and not the pooler. The encoder used to run the pooler anyway and ``TaskModel`` returned its
``pooler_output``: DDP (``find_unused_parameters=True``) takes every parameter reachable from a forward's
outputs as used, waited for the pooler's gradient, which the loss never produced, and stopped the next step
("Expected to have finished reduction in the prior iteration …"). Every sequence-classification task on this
checkpoint (sst2, stsb, goemotions, also with ``model.pooling=cls``) and retrieval did so; ``finetune`` builds
NER and QA models without a pooler, as transformers does, but one loaded with it (``load_pretrained(dir,
head="token_classification")``) did too. tests/test_distributed.py did not see it: its tiny checkpoint's head
reads the pooler.

Independent truths: a walk of the autograd graph from the outputs (what DDP does) against the gradients the
loss gives; a single-process run of the same global batches for the 2-process DDP and FSDP runs.

Tolerance, from the method: both runs compute the same gradient up to float32 summation order (two half-batch
sums averaged, or one sum): |δg| measured 2.6e-8 on this model's gradients (|g| ≤ 0.15), a few ulps. AdamW's
step lr·m̂/(√v̂+ε) changes by at most about lr·|δg|/ε (its slope in g is ≤ 1/ε; clipping and decay do
not enlarge a difference), so after S steps |δw| ≲ S·lr·|δg|/ε = 3 · 5e-4 · |δg| / 1e-4 = 15·|δg| — under the
1e-5 asserted for any |δg| < 6.7e-7, 25× the measured one (hosts differ in summation order and FMA, by a few
ulps). ``train.adam_eps=1e-4`` rather than the default 1e-8: with 1e-8 the roundoff of a gradient that is
exactly 0 (an attention key bias: softmax ignores a shift of every score; ~6e-10 in float32) becomes a step
of up to lr, and the two runs then differ by ~lr·1e-2 however correct they are (measured 8.5e-6 at lr 1e-3).
The weights move by more than 1e-4 (asserted), ten times the tolerance.

Also: multi-label and retrieval heads (which failed the same way), and NER, train under 2-process DDP; and
``distill`` under FSDP evaluates its student (a child of the sharded distiller: it failed with "mixed
torch.Tensor and DTensor" until the student became an FSDP unit of its own).
"""
from __future__ import annotations

import json
import math
import random
import shutil

import pytest
import torch

from helpers import bertforge_cmd, load_weights, read_metrics, run, sentences, torchrun_cmd, write_tsv

STEPS = 3
TOL = 1e-5


# --------------------------------------------------------------------------------------------- in-process
def _params_reached(out) -> set:
    """ids of the parameters reachable from the tensors of ``out`` (a ModelOutput) through their autograd
    graph: those DDP with ``find_unused_parameters=True`` waits for."""
    stack, seen, found = [], set(), set()
    for v in vars(out).values():
        for t in (v if isinstance(v, tuple) else (v,)):
            if torch.is_tensor(t) and t.grad_fn is not None:
                stack.append(t.grad_fn)
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "variable"):
            found.add(id(fn.variable))
        stack.extend(f for f, _ in fn.next_functions)
    return found


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    from bertforge.checkpoint.read import load_pretrained
    return load_pretrained(minilm_dir, head="base", notes=False)


def _case(name, minilm):
    """(model, batch) for one head on the real MiniLM's encoder (shared by the cases); the pooling is the one
    the checkpoint declares (mean), as ``finetune`` sets it, except where the case names another."""
    from bertforge.task_model import TaskModel
    b, t = 4, 12
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 8:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    kw = {"pooling": "mean"}
    if name == "sequence_classification/pooler":  # model.pooling=pooler: the head reads the tanh pooler
        head, kw = "sequence_classification", {"pooling": None, "num_labels": 2}
        batch["labels"] = torch.tensor([0, 1, 1, 0])
    elif name == "sequence_classification/cls":
        head, kw = "sequence_classification", {"pooling": "cls", "num_labels": 2}
        batch["labels"] = torch.tensor([0, 1, 1, 0])
    elif name == "sequence_classification/mean":
        head, kw = "sequence_classification", {**kw, "num_labels": 2}
        batch["labels"] = torch.tensor([0, 1, 1, 0])
    elif name == "regression":
        head, kw = "sequence_classification", {**kw, "num_labels": 1, "problem_type": "regression"}
        batch["labels"] = torch.tensor([0.5, 1.0, 4.0, 2.5])
    elif name == "multi_label":
        head, kw = "sequence_classification", {**kw, "num_labels": 5, "problem_type": "multi_label_classification"}
        batch["labels"] = (torch.rand(b, 5, generator=g) < 0.3).float()
    elif name == "token_classification":
        head, kw = "token_classification", {**kw, "num_labels": 9}
        labels = torch.randint(0, 9, (b, t), generator=g)
        batch["labels"] = labels.masked_fill(mask == 0, -100)
    elif name == "question_answering":
        head, kw = "question_answering", {**kw, "num_labels": 2}
        batch["start_positions"], batch["end_positions"] = torch.tensor([1, 2, 3, 0]), torch.tensor([2, 4, 3, 0])
    else:  # embedding: (B, C, T) query / positive columns, in-batch negatives
        head = "embedding"
        batch = {"input_ids": ids.reshape(2, 2, t), "attention_mask": mask.reshape(2, 2, t)}
    torch.manual_seed(0)
    minilm.encoder.zero_grad(set_to_none=True)
    return TaskModel(minilm.config.replace(**kw), head=head, encoder=minilm.encoder), batch


HEADS = ["sequence_classification/mean", "sequence_classification/cls", "sequence_classification/pooler",
         "regression", "multi_label", "token_classification", "question_answering", "embedding"]


@pytest.mark.parametrize("kernels", ["none", "cpu"])
@pytest.mark.parametrize("name", HEADS)
def test_every_parameter_in_the_outputs_graph_gets_a_gradient(minilm, name, kernels):
    """What DDP needs of a forward: no parameter is reachable from the outputs without being in the loss."""
    from bertforge.engine.kernels import apply_kernels
    model, batch = _case(name, minilm)
    apply_kernels(model, kernels)
    model.train()
    out = model(**batch)
    reached = _params_reached(out)
    out.loss.backward()
    names = {id(p): n for n, p in model.named_parameters()}
    waiting = sorted(names[i] for i in reached
                     if i in names and dict(model.named_parameters())[names[i]].grad is None)
    assert not waiting, f"{name}: in the outputs' graph but not the loss's: {waiting}"
    pooler = model.encoder.pooler
    assert pooler is not None  # the checkpoint has one
    assert (out.pooler_output is not None) == (name == "sequence_classification/pooler")
    assert (pooler.weight.grad is not None) == (name == "sequence_classification/pooler")
    assert model.encoder.layers[0].attention.qkv.weight.grad is not None  # the encoder did train


# ------------------------------------------------------------------------------------------------ torchrun
def _args(model, train, out, *extra):
    return ["finetune", "--model", model, "--task", "sst2", "--train", train, "--out", out,
            "--max-steps", STEPS, "--batch-size", 8, "--max-seq-len", 32, "--seed", 0, "--no-progress",
            "train.dropout_off=true", "train.log_every=1", "train.lr=5e-4", "train.adam_eps=1e-4",
            "train.schedule=constant", "train.warmup_steps=0", *extra]


@pytest.fixture(scope="module")
def sst2(tmp_path_factory, minilm_dir):
    d = tmp_path_factory.mktemp("minilm-dist")
    train = write_tsv(d / "train.tsv", sentences(8 * STEPS, 3))
    one = d / "one"
    r = run(bertforge_cmd(*_args(minilm_dir, train, one)))
    assert r.returncode == 0, r.stderr[-3000:]
    return d, train, one


def _compare(one, two):
    m1 = [m for m in read_metrics(one) if "loss" in m]
    m2 = [m for m in read_metrics(two) if "loss" in m]
    assert [m["step"] for m in m1] == [m["step"] for m in m2] == list(range(1, STEPS + 1))
    for a, b in zip(m1, m2):
        assert abs(a["loss"] - b["loss"]) <= TOL * max(1.0, abs(a["loss"])), (a, b)
    w1, w2 = load_weights(one / "model.safetensors"), load_weights(two / "model.safetensors")
    assert w1.keys() == w2.keys()
    diff = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert diff <= TOL, diff
    return w1


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_finetune_minilm_as_one(sst2, minilm_dir, parallel):
    d, train, one = sst2
    two = d / parallel
    r = run(torchrun_cmd(2, *_args(minilm_dir, train, two, f"impl.parallel={parallel}")))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mean pooling declared" in r.stderr  # the head read the mean, not the pooler: the case
    w1 = _compare(one, two)
    start = load_weights(minilm_dir / "model.safetensors")
    moved = max((w1["bert." + k] - v).abs().max().item() for k, v in start.items() if "bert." + k in w1)
    assert moved > 10 * TOL, moved  # the weights compared really changed
    assert torch.equal(w1["bert.pooler.dense.weight"], start["pooler.dense.weight"])  # not read: not trained
    shutil.rmtree(two)


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _conll(path, n, seed):
    rng = random.Random(seed)
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(n):
        for _ in range(rng.randint(3, 9)):
            if rng.random() < 0.25:
                lines += [f"{rng.choice(['Alice', 'Bob', 'Paris', 'Rome'])} NNP B-NP B-{rng.choice(['PER', 'LOC'])}"]
            else:
                lines += [f"{rng.choice(['film', 'good', 'the', 'was', 'plot'])} NN I-NP O"]
        lines.append("")
    return _write(path, "\n".join(lines) + "\n")


def _data(task, path):
    rng = random.Random(1)
    texts = [s for s, _ in sentences(32, 4)]
    if task == "conll2003":
        return _conll(path / "ner.txt", 16, 0)
    if task == "goemotions":  # text, comma-separated label ids, id (the GoEmotions TSV)
        rows = [f"{s}\t{','.join(map(str, sorted(rng.sample(range(28), rng.randint(1, 2)))))}\tid{i}\n"
                for i, s in enumerate(texts[:16])]
        return _write(path / "go.tsv", "".join(rows))
    rows = [json.dumps({"query": f"{i} {a}", "positive": f"{b} {i}"}) + "\n"  # retrieval: query/positive pairs
            for i, (a, b) in enumerate(zip(texts[:16], texts[16:]))]
    return _write(path / "pairs.jsonl", "".join(rows))


@pytest.mark.parametrize("task", ["conll2003", "goemotions", "retrieval"])
def test_other_heads_train_under_ddp(tmp_path, minilm_dir, task):
    """Token classification (conll2003), multi-label classification (goemotions) and a bi-encoder (retrieval:
    query and positive columns, in-batch negatives) on the embedded model: 2-process DDP steps run, every
    step's loss is finite, the encoder moved."""
    out = tmp_path / task
    args = ["finetune", "--model", minilm_dir, "--task", task, "--train", _data(task, tmp_path), "--out", out,
            "--max-steps", 2, "--batch-size", 4, "--max-seq-len", 24, "--no-progress",
            "train.dropout_off=true", "train.log_every=1", "train.lr=5e-4"]
    r = run(torchrun_cmd(2, *args))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 2
    losses = [m["loss"] for m in read_metrics(out) if "loss" in m]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    w = load_weights(out / "model.safetensors")
    start = load_weights(minilm_dir / "model.safetensors")
    k = "encoder.layer.0.attention.self.query.weight"
    assert (w.get("bert." + k, w.get(k)) - start[k]).abs().max().item() > 1e-5


def test_distill_under_fsdp_evaluates_the_student(sst2):
    """``distill`` shards the distiller (student + projections) with FSDP and evaluates its student alone: the
    student is an FSDP unit of its own, so that call gathers its weights (it used to stop with "aten.embedding
    got mixed torch.Tensor and DTensor"). Teacher: the MiniLM fine-tuned above; student: two of its layers."""
    d, train, teacher = sst2
    out = d / "kd-fsdp"
    r = run(torchrun_cmd(2, "distill", "--teacher", teacher, "--student", "layers:0,2", "--method", "kd",
                         "--task", "sst2", "--train", train, "--eval", train, "--out", out, "--max-steps", 2,
                         "--batch-size", 4, "--max-seq-len", 24, "--no-progress", "train.dropout_off=true",
                         "impl.parallel=fsdp"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["step"] == 2 and res["eval_step"] == 2 and 0.0 <= res["accuracy"] <= 1.0
    assert (out / "model.safetensors").is_file()
