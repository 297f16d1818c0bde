"""Low-bit weights of a checkpoint (``bertforge quantize --bits 2|3|4|8|mixed``): Q-BERT (Shen et al. 2020).

Steps, each in :mod:`bertforge.compress`:

1. **sensitivity** (``--bits mixed``; Q-BERT §3.1): per encoder layer, the top Hessian eigenvalue (power
   iteration) and trace (Hutchinson) of the loss on calibration batches, with Hessian-vector products only
   (:mod:`bertforge.compress.hessian`). The loss is the task loss with the FP32 model's own predictions as the
   targets (calibration texts carry no labels): soft cross-entropy for classification, MSE for regression,
   MSE of the pooled sentence embedding for an encoder without a head;
2. **bits per layer** from {2, 3, 4, 8} under ``--size-budget`` MB (:func:`bertforge.compress.lowbit.
   allocate_bits`: greedy on Ω × quantization-error drop per byte); ``--bits N`` puts every layer at N;
3. **group-wise grids** (§3.2): one scale and zero point per ``--group-size`` input columns of each row. The
   word-embedding table gets ``embed_bits`` (4) and the pooler / task head 8 bits; LayerNorm, biases and
   position embeddings stay FP32;
4. **quantization-aware fine-tuning** (``--qat-steps``): the fake-quantized model (straight-through
   estimator) is the student and the FP32 model the teacher, KD on the logits (an encoder: pooled-embedding
   MSE), through the one :class:`~bertforge.engine.train.trainer.Trainer`; kept only if it brings the model
   closer to FP32 on held-out calibration texts (:func:`guarded_qat`), else round-to-nearest stays;
5. **export**: the FP32 graph of the on-grid model, its weights replaced by ``MatMulNBits`` /
   ``GatherBlockQuantized`` (:mod:`bertforge.compress.lowbit_onnx`), so ``bench`` / ``evaluate`` / ``serve``
   run it in ONNX Runtime. ``lowbit.json`` records bits per layer, the true size (bits × weights + scales +
   zero points) beside the file size, and round-to-nearest (the same grids, no fine-tuning) beside the result.
"""
from __future__ import annotations

import copy
import math
import json
from pathlib import Path

from ..errors import ConfigError

#: bits of the matrices outside the encoder layers (word-embedding table; pooler and task head)
HEAD_BITS = 8


def parse_bits(bits):
    """``"mixed"`` or an int of :data:`~bertforge.compress.lowbit.BITS`; ConfigError otherwise (one line)."""
    if isinstance(bits, str) and bits.strip().lower() == "mixed":
        return "mixed"
    try:
        b = int(str(bits).strip())
    except ValueError:
        raise ConfigError(f"--bits {bits}: choose one of 2, 3, 4, 8 or mixed") from None
    if b not in (2, 3, 4, 8):
        raise ConfigError(f"--bits {bits}: choose one of 2, 3, 4, 8 or mixed")
    return b


def check_options(args, md) -> None:
    """One line for low-bit options that contradict each other or the model (before anything is read)."""
    from ..compress.lowbit import check_group_size
    args.bits = parse_bits(args.bits)
    if md.format == "static":
        raise ConfigError(f"{md.path} is a static embedding table (ModelDir format static): it has no Linear "
                          f"layers for --bits; quantize a transformer checkpoint, or drop --bits for INT8")
    if md.format != "fp32" or md.graph is not None:
        raise ConfigError(f"{md.path} holds {md.describe()}; --bits needs the FP32 checkpoint dir")
    if args.bits == "mixed" and args.size_budget is None:
        raise ConfigError("--bits mixed allocates bits under --size-budget MB; pass it (or a fixed --bits N)")
    if args.bits != "mixed" and args.size_budget is not None:
        raise ConfigError(f"--size-budget applies to --bits mixed; with --bits {args.bits} every layer has "
                          f"{args.bits} bits")
    if args.size_budget is not None and not 0 < args.size_budget < math.inf:
        raise ConfigError(f"--size-budget {args.size_budget:g}: a finite size in MB above 0")
    int8_only = [f for f, on in (("--backend torch", args.backend != "onnxruntime"), ("--target", args.target),
                                 ("--scheme", args.scheme), ("--per-tensor", args.per_tensor),
                                 ("--reduce-range", args.reduce_range), ("--calibration", args.calibration),
                                 ("--max-drop", args.max_drop is not None), ("--fusions", args.fusions))
                 if on]
    if int8_only:
        raise ConfigError(f"{int8_only[0]} sets up INT8; drop it with --bits")
    args.group_size = check_group_size(64 if args.group_size is None else args.group_size)
    if args.accuracy_level not in (0, 4):
        raise ConfigError(f"--accuracy-level {args.accuracy_level}: 0 (FP32 products) or 4 (int8 products)")
    if args.embed_bits not in (4, 8):
        raise ConfigError(f"--embed-bits {args.embed_bits}: ONNX Runtime's GatherBlockQuantized takes 4 or 8")
    if args.qat_steps is None:
        args.qat_steps = 300
    if args.qat_steps < 0:
        raise ConfigError(f"--qat-steps {args.qat_steps}: a number of steps ≥ 0")
    if args.qat_train and not Path(args.qat_train).is_file():
        from ..errors import DataError
        raise DataError(f"--qat-train {args.qat_train} is not a file; pass the task's training file")


# ------------------------------------------------------------------------------------- what gets quantized
def split_model(model, embed_bits: int, group_size: int) -> tuple:
    """``(layers, fixed, fixed_bytes, other_bytes)``: the allocation units (one
    :class:`~bertforge.compress.lowbit.LayerCost` per encoder layer with its Linear weights, keyed
    ``encoder.layers.i``), the matrices of fixed bits outside them (module name → bits: word embeddings,
    pooler, head), their bytes at those bits, and the bytes of everything kept FP32."""
    from torch import nn
    from ..compress.lowbit import LayerCost, matrix_bytes
    layers, fixed = {}, {}
    quantized_params = set()
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and m.weight.numel() > 0:
            parts = name.split(".")
            if "layers" in parts:
                i = parts.index("layers")
                unit = ".".join(parts[:i + 2])
                layers.setdefault(unit, LayerCost(unit, [], 0.0)).shapes.append(tuple(m.weight.shape))
            else:
                fixed[name] = HEAD_BITS
            quantized_params.add(id(m.weight))
        elif isinstance(m, nn.Embedding) and name.endswith("word_embeddings"):
            fixed[name] = embed_bits
            quantized_params.add(id(m.weight))
    mods = dict(model.named_modules())
    fixed_bytes = sum(matrix_bytes(tuple(mods[n].weight.shape), b, group_size) for n, b in fixed.items())
    other = sum(p.numel() * 4 for p in model.parameters() if id(p) not in quantized_params)
    return list(layers.values()), fixed, fixed_bytes, other


def layer_plan(model, units: dict) -> dict:
    """Module name → bits for every Linear of each unit (``encoder.layers.i`` → bits)."""
    from torch import nn
    return {n: units[u] for u in units for n, m in model.named_modules()
            if n.startswith(u + ".") and isinstance(m, nn.Linear) and m.weight.numel() > 0}


def loss_fn_for(teacher, pooling: str = "mean"):
    """The calibration loss (module doc, step 1): ``loss(model, batch)`` with the FP32 ``teacher``'s outputs as
    the targets (computed once per batch and kept)."""
    import torch
    import torch.nn.functional as F
    from ..models.pooling import pool
    cache = {}

    def outputs(m, batch):
        out = m(**batch)
        if getattr(out, "logits", None) is not None:
            return out.logits.float()
        return pool(out.last_hidden_state, batch["attention_mask"], pooling).float()

    def loss(model, batch):
        key = id(batch)
        if key not in cache:
            with torch.no_grad():
                cache[key] = outputs(teacher, batch)
        t, s = cache[key], outputs(model, batch)
        if getattr(teacher, "head", None) is not None and s.shape[-1] > 1:
            return -(F.softmax(t, -1) * F.log_softmax(s, -1)).sum(-1).mean()
        return F.mse_loss(s, t)
    return loss


def sensitivities(model, batches: list, layers: list, loss_fn, iters: int, samples: int) -> dict:
    """Q-BERT's Ω per encoder layer on ``batches`` (:func:`bertforge.compress.hessian.block_sensitivities`)."""
    from ..compress.hessian import block_sensitivities
    from torch import nn
    blocks = {l.name: [m.weight for n, m in model.named_modules()
                       if n.startswith(l.name + ".") and isinstance(m, nn.Linear) and m.weight.numel() > 0]
              for l in layers}
    return block_sensitivities(model, loss_fn, batches, blocks, iters=iters, trace_samples=samples)


def choose_bits(model, layers: list, args, fixed_bytes: int, other_bytes: int, batches: list, loss_fn) -> tuple:
    """``(units → bits, sensitivity record)``: every unit at ``args.bits``, or, for ``mixed``, the allocation
    under ``args.size_budget`` MB (fixed and FP32 bytes counted in)."""
    from ..compress.lowbit import BITS, allocate_bits, ceil_mb, matrix_bytes, quant_error
    from torch import nn
    g = args.group_size
    if args.bits != "mixed":
        return {l.name: args.bits for l in layers}, None
    floor = fixed_bytes + other_bytes + sum(sum(matrix_bytes(s, BITS[0], g) for s in l.shapes) for l in layers)
    budget = args.size_budget * 2 ** 20
    if floor > budget:  # before the Hessian is computed
        raise ConfigError(f"--size-budget {args.size_budget:g} MB is below what {BITS[0]} bits allow "
                          f"({floor / 2**20:.4f} MB for this model); pass at least {ceil_mb(floor)}")
    sens = sensitivities(model, batches, layers, loss_fn, args.hessian_iters, args.trace_samples)
    for l in layers:
        l.sensitivity = sens[l.name]["omega"]
        ws = [m.weight for n, m in model.named_modules()
              if n.startswith(l.name + ".") and isinstance(m, nn.Linear) and m.weight.numel() > 0]
        l.error = {b: sum(quant_error(w, b, g) for w in ws) for b in BITS}
    plan = allocate_bits(layers, budget, g, fixed_bytes + other_bytes)
    return plan, sens


def sizes(model, plan: dict, group_size: int, other_bytes: int) -> dict:
    """True bytes (bits × weights + scales + zero points, FP32 rest) and the average bits of the quantized
    matrices, for the module plan ``plan`` (name → bits)."""
    from ..compress.lowbit import matrix_bytes
    mods = dict(model.named_modules())
    n = sum(mods[k].weight.numel() for k in plan)
    true = sum(matrix_bytes(tuple(mods[k].weight.shape), b, group_size) for k, b in plan.items()) + other_bytes
    avg = sum(mods[k].weight.numel() * b for k, b in plan.items()) / max(n, 1)
    return {"true_mb": round(true / 2**20, 3), "average_bits": round(avg, 3), "quantized_weights": int(n)}


def qat(student, teacher, items: list, collate, args, work: Path, pooling) -> dict:
    """Quantization-aware fine-tuning of ``student`` (fake-quantized) from the FP32 ``teacher`` through the
    one Trainer: KD on logits (T = 1, soft targets only) or, for an encoder, pooled-embedding MSE."""
    from ..config import ImplConfig, Recipe, TrainConfig
    from ..distillation.distiller import Distiller, build_terms
    from ..engine.train.trainer import Trainer
    n_s = student.config.num_hidden_layers
    if student.head is not None:
        entries = [{"loss": "kd", "temperature": 1.0, "alpha": 1.0}]
    else:  # (2 − 2 cos) / H for normalised embeddings: scaled by H back to the size of a cosine
        entries = [{"loss": "pooled_mse", "weight": float(student.config.hidden_size)}]
    distiller = Distiller(student, [teacher], build_terms(entries, n_s, n_s))
    if student.head is None:
        distiller.pooling, distiller.normalize = pooling.mode, bool(pooling.normalize)
    recipe = Recipe(train=TrainConfig(max_steps=args.qat_steps, batch_size=min(args.qat_batch_size, len(items)),
                                      lr=args.qat_lr, warmup_ratio=0.1, save_every=10 ** 9, log_every=50,
                                      load_best_at_end=False, keep_checkpoints=1, seed=args.seed),
                    impl=ImplConfig(kernels="none"))  # its progress: a bar, or lines with rate and ETA in a log
    trainer = Trainer(distiller, items, collate, recipe, work, save_fn=lambda m, d: None)
    res = trainer.fit()
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return {"steps": res["step"], "lr": args.qat_lr, "batch_size": recipe.train.batch_size,
            "examples": len(items), "loss": " + ".join(e["loss"] for e in entries)}


def write_dir(student, states: dict, tmp: Path, model_dir: Path, record: dict, group_size: int,
              accuracy_level: int = 0) -> dict:
    """Export the on-grid ``student`` to ``tmp/model.onnx`` with its low-bit weights; config, tokenizer,
    declarations and ``lowbit.json`` beside it. Returns the graph's counts."""
    import onnx
    from ..checkpoint.layout import LOWBIT_RECORD, carry_declarations, with_meta
    from ..checkpoint.write import config_to_hf
    from ..compress.lowbit_onnx import rewrite_graph
    from ..compress.onnx import export_onnx
    from ..tokenizer import copy_tokenizer_files
    from ..checkpoint.modeldir import ModelDir
    tables = {k: v for k, v in states.items() if k.endswith("word_embeddings")}
    layers = {k: v for k, v in states.items() if k not in tables}
    raw = tmp / ".fp32.onnx"
    export_onnx(student, raw, fused=False, cls_only=False)
    proto = onnx.load(str(raw))
    counts = rewrite_graph(proto, layers, tables, group_size, accuracy_level)
    onnx.save(proto, str(tmp / "model.onnx"))
    raw.unlink()
    meta = ModelDir.open(model_dir).meta
    cfg = config_to_hf(student.config, student.head_name)
    cfg = with_meta(cfg, **{k: v for k, v in meta.raw.items()},
                    quantization={"bits": record["average_bits"], "method": "q-bert", "group_size": group_size})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    copy_tokenizer_files(model_dir, tmp)
    carry_declarations(model_dir, tmp)
    record["graph"] = {k: v for k, v in counts.items() if k != "replaced"}
    record["file_mb"] = round((tmp / "model.onnx").stat().st_size / 2**20, 3)
    (tmp / LOWBIT_RECORD).write_text(json.dumps(record, indent=2), encoding="utf-8")
    return counts


def run_lowbit(args, model_dir: Path, run_dir, eval_data, adapter, task, items: list, collate) -> dict:
    """The whole job (module doc) into ``run_dir``; returns the record (``lowbit.json`` + evaluation).
    ``items``: the encoded calibration texts (the Hessian's batches, QAT's texts without --qat-train), batched
    by ``collate``."""
    import numpy as np
    import torch
    from ..checkpoint.modeldir import ModelDir
    from ..checkpoint.read import load_pretrained
    from ..compress.lowbit import attach_fake_quant, bake_fake_quant
    from ..runtime import load_runner
    from ..runtime.torch import TorchRunner
    md = ModelDir.open(model_dir)
    torch.manual_seed(args.seed)
    teacher = load_pretrained(model_dir).eval()
    batches = [collate(items[i:i + args.hessian_batch_size])
               for i in range(0, min(len(items), args.hessian_batches * args.hessian_batch_size),
                              args.hessian_batch_size)]
    layers, fixed, fixed_bytes, other = split_model(teacher, args.embed_bits, args.group_size)
    student = copy.deepcopy(teacher)
    units, sens = choose_bits(student, layers, args, fixed_bytes, other, batches, loss_fn_for(teacher, md.pooling.mode))
    plan = {**layer_plan(student, units), **fixed}
    rec = {"model": str(model_dir), "out": str(run_dir.out), "method": "q-bert", "bits": args.bits,
           "group_size": args.group_size, "symmetric": False, "accuracy_level": args.accuracy_level,
           "size_budget_mb": args.size_budget,
           "bits_per_layer": units, "fixed_bits": fixed,
           "fp32_file_mb": round(sum(f.stat().st_size for f in md.fp32_weights) / 2**20, 3),
           **sizes(student, plan, args.group_size, other)}
    if sens is not None:
        rec["sensitivity"] = {k: {"omega": round(v["omega"], 6), "top_eigenvalues": [round(e, 6) for e in v["eig"]],
                                  "trace": round(v["trace"], 4), "power_iterations": v["iters"]}
                              for k, v in sens.items()}
    attach_fake_quant(student, plan, args.group_size)
    if eval_data is not None:  # round-to-nearest: the same grids before fine-tuning
        rec["eval"] = {"task": task.name, "n": len(eval_data),
                       "fp32": adapter.evaluate(TorchRunner.from_model(teacher), eval_data),
                       "round_to_nearest": adapter.evaluate(TorchRunner.from_model(student), eval_data)}
    with run_dir as tmp:
        if args.qat_steps > 0:
            train_items, held = qat_split(md, args, items)
            rec["qat"] = guarded_qat(student, teacher, train_items, held, collate, args, tmp / ".qat", md.pooling)
        student.eval()
        states = bake_fake_quant(student)
        write_dir(student, states, tmp, model_dir, rec, args.group_size, args.accuracy_level)
        runner = load_runner(tmp)
        x = {k: v for k, v in collate(items[:4]).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            ref = TorchRunner.from_model(student)(**x)
        got = runner(**x)
        main = "logits" if "logits" in ref else "last_hidden_state"
        diff = np.abs(np.asarray(got[main]) - np.asarray(ref[main]))
        if main == "last_hidden_state":  # the tokens only: padded positions are no output
            diff = diff[x["attention_mask"].numpy().astype(bool)]
        rec["onnx_vs_torch_max_abs_diff"] = float(diff.max())
        if eval_data is not None:
            rec["eval"]["low_bit"] = adapter.evaluate(runner, eval_data)
        from ..checkpoint.layout import LOWBIT_RECORD
        (tmp / LOWBIT_RECORD).write_text(json.dumps(rec, indent=2), encoding="utf-8")
    return rec


#: calibration texts held out of QAT (at most; a quarter of them when there are fewer than 4 × this) to judge it
QAT_HELD_OUT = 64


def qat_split(md, args, calib_items: list) -> tuple:
    """(QAT's texts, the held-out texts that judge it): with --qat-train its rows and the calibration texts; else
    the calibration texts less the last :data:`QAT_HELD_OUT` (a quarter when fewer), which judge it."""
    if args.qat_train:
        return qat_items(md, args, calib_items), calib_items[:QAT_HELD_OUT]
    k = min(QAT_HELD_OUT, len(calib_items) // 4)
    if k == 0:  # too few texts to hold any out: QAT is judged on its own texts
        return calib_items, calib_items
    return calib_items[:-k], calib_items[-k:]


def guarded_qat(student, teacher, items: list, held: list, collate, args, work: Path, pooling) -> dict:
    """:func:`qat`, kept only where it brings the fake-quantized ``student`` closer to the FP32 ``teacher`` on the
    ``held`` texts it did not train on (the calibration loss of :func:`loss_fn_for`, mean per text); otherwise
    the round-to-nearest weights are put back. A few hundred QAT steps with the straight-through estimator can
    move a model away from its FP32 original (measured: STS-B, 40 steps, Pearson 95.1% of FP32 where
    round-to-nearest kept 103%); the held-out loss is the QAT objective on unseen texts, so no label is read.
    Adds ``heldout_loss_rtn``, ``heldout_loss_qat``, ``heldout_texts`` and ``kept`` to QAT's record."""
    import sys

    import torch
    loss = loss_fn_for(teacher, pooling.mode)
    batches = [collate(held[i:i + 16]) for i in range(0, len(held), 16)]

    def held_loss() -> float:
        was = student.training
        student.eval()
        with torch.no_grad():
            total = sum(float(loss(student, b)) * len(b["input_ids"]) for b in batches)
        student.train(was)
        return total / max(1, len(held))

    before = held_loss()
    rtn = {k: v.detach().clone() for k, v in student.state_dict().items()}
    rec = qat(student, teacher, items, collate, args, work, pooling)
    after = held_loss()
    rec.update(heldout_texts=len(held), heldout_loss_rtn=before, heldout_loss_qat=after, kept=after <= before)
    if after > before:
        student.load_state_dict(rtn)
        sys.stderr.write(f"bertforge quantize: QAT moved the model away from FP32 on {len(held)} held-out texts "
                         f"(loss {before:.4g} → {after:.4g}); the round-to-nearest weights are kept\n")
    return rec


def qat_items(md, args, calib_items: list) -> list:
    """The texts QAT distils on: the rows of --qat-train (labels dropped: the teacher gives the targets), else
    the calibration texts."""
    if not args.qat_train:
        return calib_items
    from .evaluate import load_for_task
    _, _, adapter, _ = load_for_task(str(md.path), args.task, args.max_seq_len)
    rows = adapter.load(args.qat_train, args.max_qat_samples, require_labels=False)
    return [{k: v for k, v in d.items() if k in ("input_ids", "token_type_ids")} for d in rows]


__all__ = ["parse_bits", "check_options", "split_model", "layer_plan", "choose_bits", "run_lowbit", "loss_fn_for"]
