"""PyTorch dynamic INT8 quantization of the Linear layers, and an INT8 checkpoint format.

:func:`quantize_dynamic` wraps :func:`torch.ao.quantization.quantize_dynamic` (``qint8`` weights with one scale
per output channel by default, or per tensor; activations quantized on the fly per call, int32
accumulation; Zafrir et al. 2019, "Q8BERT", §2 — linear quantization of GEMM inputs). Per-channel scales
matter for MiniLM: on SST-2 dev per-tensor INT8 lost 1.7 points (docs/compress.md). Embeddings, LayerNorm
and softmax stay FP32. Linear layers with no units (a layer whose heads were all pruned) stay FP32.

A quantized model is saved as ``model.int8.safetensors`` (int8 weight + scale + zero point per Linear,
FP32 for everything else — no pickling) beside ``config.json`` (``bertforge.quantization``) and the
tokenizer files; :func:`load_quantized` rebuilds it. ``bertforge quantize --backend onnxruntime`` (the
faster path on x86) is in :mod:`bertforge.compress.onnx`.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..checkpoint.read import config_from_hf
from ..checkpoint.write import config_to_hf
from ..errors import CheckpointError
from ..io import atomic_dir
from ..task_model import TaskModel
from ..tokenizer import copy_tokenizer_files

from ..checkpoint.layout import INT8_FILE, is_quantized_dir, with_meta  # noqa: F401


def scheme(per_channel: bool = True) -> str:
    """The quantization recorded in ``config.json`` (``bertforge.quantization``) and printed by ``quantize``."""
    return (f"torch dynamic int8 (qint8 weights, one scale per {'output channel' if per_channel else 'matrix'}, "
            f"Linear only)")


def quantizable_linears(model) -> set:
    """Names of the Linear modules that get INT8 weights (all with at least one unit)."""
    return {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.weight.numel() > 0}


def quantize_dynamic(model, per_channel: bool = True) -> nn.Module:
    """Return an INT8 copy of ``model`` (FP32, CPU): every non-empty ``nn.Linear`` → dynamic INT8 Linear
    (``per_channel``: one weight scale per output unit, else one per matrix).

    Input/output shapes are those of ``model``; the copy runs on CPU only."""
    import copy
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig
    model = copy.deepcopy(model).float().cpu().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qc = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
        return torch.ao.quantization.quantize_dynamic(model, {n: qc for n in quantizable_linears(model)},
                                                      dtype=torch.qint8)


def _is_qlinear(m) -> bool:
    return type(m).__name__ == "Linear" and type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")


def int8_state(qmodel) -> dict:
    """Flat tensor dict: ``{name}.weight.int8`` / ``.weight.scale`` / ``.weight.zero_point`` (one entry, or
    one per output channel; then also ``.weight.axis``) / ``.bias`` per quantized Linear, plus every other
    parameter and buffer under its own name."""
    out, skip = {}, set()
    for name, m in qmodel.named_modules():
        if _is_qlinear(m):
            w = m.weight()
            out[f"{name}.weight.int8"] = w.int_repr().contiguous()
            if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                out[f"{name}.weight.scale"] = w.q_per_channel_scales().to(torch.float64).contiguous()
                out[f"{name}.weight.zero_point"] = w.q_per_channel_zero_points().to(torch.int64).contiguous()
                out[f"{name}.weight.axis"] = torch.tensor([w.q_per_channel_axis()], dtype=torch.int64)
            else:
                out[f"{name}.weight.scale"] = torch.tensor([w.q_scale()], dtype=torch.float64)
                out[f"{name}.weight.zero_point"] = torch.tensor([w.q_zero_point()], dtype=torch.int64)
            if m.bias() is not None:
                out[f"{name}.bias"] = m.bias().detach().contiguous()
            skip.add(name + ".")
    for k, v in list(qmodel.state_dict().items()):
        if not torch.is_tensor(v) or v.is_quantized or any(k.startswith(s) for s in skip):
            continue
        out[k] = v.detach().contiguous().clone()
    return out


def _per_channel(state: dict) -> bool:
    """Whether an :func:`int8_state` dict holds per-channel weights (they carry a quantization axis)."""
    return any(k.endswith(".weight.axis") for k in state)


def save_quantized(qmodel, fp32_model, out_dir, tokenizer_dir=None) -> None:
    """Write ``config.json`` + ``model.int8.safetensors`` (+ tokenizer files) atomically to ``out_dir``."""
    cfg = config_to_hf(fp32_model.config, fp32_model.head_name)
    state = int8_state(qmodel)
    cfg = with_meta(cfg, quantization=scheme(_per_channel(state)))
    with atomic_dir(Path(out_dir)) as tmp:
        save_file(state, str(tmp / INT8_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        if tokenizer_dir is not None:
            copy_tokenizer_files(Path(tokenizer_dir), tmp)
            from ..checkpoint.layout import carry_declarations
            carry_declarations(tokenizer_dir, tmp)  # an embedding model keeps its pooling, length, truncate_dim


def load_quantized(path):
    """Rebuild a model saved by :func:`save_quantized` (INT8 Linear layers, CPU).

    Raises:
        CheckpointError: missing files or tensors that do not match ``config.json``.
    """
    from ..checkpoint.modeldir import ModelDir
    md = ModelDir.open(path)
    path, d = md.path, md.config
    if md.format != "torch-int8":
        raise CheckpointError(f"{path} has no {INT8_FILE}; run `bertforge quantize --backend torch` first")
    config = config_from_hf(d)
    head = md.head or "base"
    fp32 = TaskModel(config, head=head)
    state = load_file(str(path / INT8_FILE))
    qmodel = quantize_dynamic(fp32, per_channel=_per_channel(state))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, m in qmodel.named_modules():
            if not _is_qlinear(m):
                continue
            try:
                wi = state.pop(f"{name}.weight.int8")
                scale = state.pop(f"{name}.weight.scale")
                zp = state.pop(f"{name}.weight.zero_point")
                axis = state.pop(f"{name}.weight.axis", None)
            except KeyError:
                raise CheckpointError(f"{path / INT8_FILE} lacks the INT8 weight of {name}; re-run "
                                      "`bertforge quantize`") from None
            if axis is not None:
                qw = torch._make_per_channel_quantized_tensor(wi, scale, zp, int(axis[0]))
            else:
                qw = torch._make_per_tensor_quantized_tensor(wi, float(scale[0]), int(zp[0]))
            m.set_weight_bias(qw, state.pop(f"{name}.bias", None))
    own = {**dict(qmodel.named_parameters()), **dict(qmodel.named_buffers())}
    saved_keys = set(qmodel.state_dict())  # not the non-persistent buffers (ModernBERT's RoPE tables)
    own = {k: v for k, v in own.items() if torch.is_tensor(v) and not v.is_quantized and k in saved_keys}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected or any(own[k].shape != v.shape for k, v in state.items()):
        raise CheckpointError(f"{path / INT8_FILE} does not match config.json (missing {missing[:2]}, "
                              f"unexpected {unexpected[:2]}); re-run `bertforge quantize`")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)
    qmodel.source_dir = str(path)
    return qmodel.eval()


def file_size_mb(path) -> float:
    return round(Path(path).stat().st_size / 2**20, 3)


__all__ = ["quantize_dynamic", "scheme", "save_quantized", "load_quantized", "is_quantized_dir", "int8_state"]
