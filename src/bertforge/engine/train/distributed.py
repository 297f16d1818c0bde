"""Data parallelism under ``torchrun`` — PyTorch's own DDP / FSDP, no home-made layer.

``torchrun --nproc_per_node N bertforge finetune …`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
:func:`init_distributed` then joins the process group (gloo on CPU, NCCL on GPU). Without those
variables everything runs in one process and these helpers are no-ops.

Two wrappers (``impl.parallel``):

* ``ddp`` (default) — :class:`torch.nn.parallel.DistributedDataParallel` (Li et al. 2020, "PyTorch
  Distributed: Experiences on Accelerating Data Parallel Training"): every rank holds the whole model;
  gradients are all-reduced (averaged) in buckets during ``backward``.
* ``fsdp`` — ``torch.distributed.fsdp.fully_shard`` (FSDP2; Zhao et al. 2023, "PyTorch FSDP"): parameters,
  gradients and optimizer state are sharded across ranks, each encoder layer is gathered just in time.
  For models whose optimizer state does not fit one device.

A global micro-batch is collated whole on every rank, then :func:`shard_batch` takes this rank's rows and
:func:`loss_normalizer` the divisor of a token-mean loss. The collectives used by the Trainer
(:func:`all_reduce_sum`, :func:`any_rank`, :func:`gather_object`, :func:`broadcast_object`, :func:`barrier`)
are thin wrappers that do nothing in a single process. For FSDP: :func:`full_state_dicts`,
:func:`load_full_state` and :func:`plain_copy` move full state dicts in and out of a sharded model.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from ...task_model import TaskModel

PARALLEL = ("ddp", "fsdp")


@dataclass
class DistContext:
    """``rank`` in [0, world_size); ``local_rank`` picks the GPU on a node; ``device`` of this rank."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")


def init_distributed() -> DistContext:
    """Join the ``torchrun`` process group (gloo on CPU, NCCL on GPU) or return a 1-process context."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world <= 1:
        return DistContext(device=torch.device("cuda") if cuda else torch.device("cpu"))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return DistContext(rank, world, local, device)


def set_deterministic() -> None:
    """Deterministic kernels (``torch.use_deterministic_algorithms``), no cuDNN autotuning, and the
    cuBLAS workspace setting that deterministic GEMMs need on CUDA."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def wrap_ddp(model: nn.Module, ctx: DistContext, find_unused_parameters: bool = True) -> nn.Module:
    """DDP-wrap ``model`` (returned unchanged in a single process). Rank 0's parameters are broadcast
    to every rank at construction. ``find_unused_parameters`` lets heads that skip a module (e.g. a
    pooler a RoBERTa head does not read) train without a reduction hang."""
    if ctx.world_size <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(model, device_ids=ids, find_unused_parameters=find_unused_parameters)


def wrap_fsdp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """Shard ``model`` in place with FSDP2 ``fully_shard``: each encoder layer is its own unit, then a
    ``TaskModel`` held by a wrapper (a distiller's student), then the root. Parameters become ``DTensor``
    shards; build the optimizer after this call. Returns ``model``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if ctx.world_size <= 1:
        return model
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for m in model.modules():
        if any(c.__name__ == "EncoderLayer" for c in type(m).__mro__):  # also a kernel subclass of it
            fully_shard(m, mesh=mesh)
    for m in model.modules():
        # a TaskModel inside a wrapper (the distiller's student) is a unit too: evaluation calls it alone, and
        # only a unit's own forward gathers its parameters (as part of the root's they would stay shards)
        if m is not model and isinstance(m, TaskModel):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def wrap_model(model: nn.Module, ctx: DistContext, parallel: str = "ddp") -> nn.Module:
    """``impl.parallel`` → the wrapped module whose ``forward`` the training step calls."""
    if parallel == "fsdp":
        return wrap_fsdp(model, ctx)
    return wrap_ddp(model, ctx)


def barrier(ctx: DistContext) -> None:
    if ctx.world_size > 1 and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """In-place sum of ``t`` over ranks (gloo on CPU tensors; NCCL needs ``t`` on the rank's GPU)."""
    if ctx.world_size > 1 and dist.is_initialized():
        if ctx.device.type == "cuda" and t.device.type != "cuda":
            g = t.to(ctx.device)
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            t.copy_(g.cpu())
        else:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """True on every rank when ``flag`` is True on at least one (e.g. a NaN loss on one shard)."""
    if ctx.world_size <= 1:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
    return bool(all_reduce_sum(t, ctx).item() > 0)


def gather_object(obj: Any, ctx: DistContext) -> Optional[list]:
    """Every rank's ``obj`` as a list on rank 0 (``None`` elsewhere); ``[obj]`` in one process."""
    if ctx.world_size <= 1:
        return [obj]
    out = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if ctx.world_size <= 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ------------------------------------------------------------------------------- FSDP state handling
def full_state_dicts(model: nn.Module, optimizer) -> tuple:
    """(model state dict, optimizer state dict) of an FSDP-sharded ``model`` as full, unsharded CPU tensors;
    a collective: call it on every rank."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return (get_model_state_dict(model, options=opts),
            get_optimizer_state_dict(model, optimizer, options=opts))


def load_full_state(model: nn.Module, optimizer, model_state: Optional[dict] = None,
                    optimizer_state: Optional[dict] = None) -> None:
    """Load full (unsharded) state dicts into an FSDP-sharded ``model`` and its ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    opts = StateDictOptions(full_state_dict=True)
    if model_state is not None:
        set_model_state_dict(model, model_state, options=opts)
    if optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=opts)


def plain_copy(skeleton: nn.Module, full_state: dict) -> nn.Module:
    """A plain CPU module built from the meta-device ``skeleton`` (a ``deepcopy(model).to("meta")`` taken
    before sharding; tied weights stay tied), carrying ``full_state`` (a gathered state dict) when given."""
    import copy
    plain = copy.deepcopy(skeleton).to_empty(device="cpu")
    if full_state:
        plain.load_state_dict(full_state, strict=True)
    return plain


def no_sync(wrapped: nn.Module, model: nn.Module, fsdp: bool):
    """A context in which ``backward`` accumulates gradients locally, without the all-reduce: DDP's
    ``no_sync``, FSDP2's ``set_requires_gradient_sync(False)``; a null context in one process."""
    if wrapped is not model and hasattr(wrapped, "no_sync"):
        return wrapped.no_sync()
    if fsdp and hasattr(model, "set_requires_gradient_sync"):
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


# ------------------------------------------------------------------ the global micro-batch on W ranks
def shard_batch(batch: dict, rank: int, world: int, b: int) -> dict:
    """This rank's rows of a global micro-batch: rows ``rank, rank+world, …`` of every tensor whose first
    dimension is the batch size ``b``; other entries (scalars, non-batch tensors) are passed unchanged."""
    out = {}
    for k, v in batch.items():
        if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == b:
            out[k] = v[rank::world]
        else:
            out[k] = v
    return out


def takes_loss_normalizer(model: nn.Module) -> bool:
    """Whether ``model.forward`` accepts a ``loss_normalizer`` keyword (by name or through ``**kwargs``)."""
    import inspect
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "loss_normalizer" or p.kind is p.VAR_KEYWORD for p in params)


def loss_normalizer(batch: dict, world: int) -> Optional[torch.Tensor]:
    """The divisor that makes DDP's gradient average the global token mean, for a global micro-batch whose
    ``labels`` are token-level (B, T) integer targets (-100 = none): ``count(labels ≠ -100) / world`` as a
    0-d float32 tensor; None for other batches.

    DDP averages the W shard gradients. For a loss that is a mean over *targets* whose number differs per
    shard (MLM's masked tokens), the average of shard means is not the mean over the global micro-batch; a
    shard that divides its summed loss by ``global count / W`` instead of its own count makes DDP's average
    exactly the global mean. The Trainer passes it to the model as the ``loss_normalizer`` argument (see
    :func:`bertforge.objectives.mlm.mlm_outputs`)."""
    v = batch.get("labels")
    if not (torch.is_tensor(v) and v.dim() == 2 and not v.is_floating_point()):
        return None
    return torch.tensor(float((v != -100).sum()) / world, dtype=torch.float32)
