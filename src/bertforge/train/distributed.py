"""Distributed data parallel under ``torchrun`` — PyTorch's own DDP, no home-made layer.

``torchrun --nproc_per_node N bertforge finetune …`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
:func:`init_distributed` then joins the process group (gloo on CPU, NCCL on GPU). Without those
variables everything runs in one process and these helpers are no-ops.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")


def init_distributed() -> DistContext:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world <= 1:
        return DistContext(device=torch.device("cuda") if cuda else torch.device("cpu"))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return DistContext(rank, world, local, device)


def wrap_ddp(model: nn.Module, ctx: DistContext) -> nn.Module:
    if ctx.world_size <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DDP(model, device_ids=ids, find_unused_parameters=False)


def barrier(ctx: DistContext) -> None:
    if ctx.world_size > 1 and dist.is_initialized():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.world_size > 1 and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
