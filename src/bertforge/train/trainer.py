"""The only training loop in bertforge.

Every verb (finetune, pretrain, distill, translate train) builds a model whose ``forward(**batch)``
returns an object with ``loss`` (scalar) and optionally ``terms`` (dict of named loss components,
logged), a dataset and a collator, and hands them to :class:`Trainer`. The Trainer owns the rest:
AdamW + warmup/decay, gradient accumulation and clipping, bf16 autocast (``impl.dtype``), DDP under
``torchrun`` (gloo on CPU, NCCL on GPU), periodic evaluation with best-checkpoint keeping, atomic
checkpoints with optimizer/scheduler/RNG state and data position, ``--resume``, tqdm progress and
``metrics.jsonl``.

Layout of ``out_dir``::

    recipe.yaml              the resolved recipe (re-run from it)
    metrics.jsonl            one JSON object per log/eval event
    config.json, model.safetensors, tokenizer.json …   the final (or best) model, HF layout
    checkpoints/step-N/      model (HF layout) + trainer_state.json + optimizer.pt + scheduler.pt + rng.pt
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config import Recipe
from ..errors import TrainingError
from ..io import append_jsonl, atomic_dir, atomic_write_text
from . import distributed as dist_utils
from .optim import make_optimizer, make_scheduler


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class EpochSampler(Sampler):
    """Shuffles with a generator seeded by (seed, epoch) and shards across ranks.

    The order of epoch e is a pure function of (seed, e), so a resumed run skips exactly the batches it
    already saw. With world size W each rank takes every W-th index of the shuffled order (padded by
    repetition so every rank has the same count, as ``DistributedSampler``).
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1):
        self.n, self.seed, self.shuffle, self.rank, self.world = n, seed, shuffle, rank, world
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> list:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed * 1000003 + self.epoch)
            idx = torch.randperm(self.n, generator=g).tolist()
        else:
            idx = list(range(self.n))
        per = math.ceil(self.n / self.world)
        idx = idx + idx[: per * self.world - self.n]
        return idx[self.rank::self.world]

    def __iter__(self):
        return iter(self.order())

    def __len__(self) -> int:
        return math.ceil(self.n / self.world)


class Trainer:
    """Train ``model`` on ``train_dataset``.

    Args:
        model: ``forward(**batch)`` → object with ``.loss`` and optional ``.terms``.
        train_dataset: a map-style dataset (``len`` + ``__getitem__``) of examples.
        collate_fn: list of examples → batch dict of tensors. It may draw random numbers (dynamic
            masking); the Trainer seeds it per step so runs and resumes are reproducible.
        recipe: the resolved recipe; ``train`` and ``impl`` sections are read here.
        out_dir: run directory (created; see module doc for its layout).
        eval_fn: ``eval_fn(model) -> dict`` of metrics, called every ``train.eval_every`` steps and at
            each epoch end; ``train.metric_for_best`` names the key that picks the best checkpoint
            (higher is better unless it contains "loss").
        save_fn: ``save_fn(model, dir)`` writes the model in HF layout (default: ``model.save_pretrained``).
    Raises:
        TrainingError: the loss became NaN/inf (the last good checkpoint is kept).
    """

    def __init__(self, model: nn.Module, train_dataset: Dataset, collate_fn: Callable, recipe: Recipe,
                 out_dir, eval_fn: Optional[Callable[[nn.Module], dict]] = None,
                 save_fn: Optional[Callable[[nn.Module, Path], None]] = None,
                 global_batch_size: Optional[int] = None):
        self.recipe, self.cfg, self.impl = recipe, recipe.train, recipe.impl
        self.out_dir = Path(out_dir)
        self.ctx = dist_utils.init_distributed()
        self.device = self.ctx.device if self.impl.device == "auto" else torch.device(self.impl.device)
        if self.impl.threads:
            torch.set_num_threads(self.impl.threads)
        if self.cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        set_seed(self.cfg.seed)
        self.model = model.to(self.device)
        if self.cfg.dropout_off:
            for m in self.model.modules():
                if isinstance(m, nn.Dropout):
                    m.p = 0.0
        self.train_dataset, self.collate_fn = train_dataset, collate_fn
        self.eval_fn = eval_fn
        self.save_fn = save_fn or (lambda m, d: m.save_pretrained(d))
        # micro-batch per rank: the global batch is split across ranks
        world = self.ctx.world_size
        if self.cfg.batch_size % world:
            from ..errors import ConfigError
            raise ConfigError(f"train.batch_size={self.cfg.batch_size} is not divisible by the "
                              f"{world} processes; pick a multiple of {world}")
        self.micro_batch = self.cfg.batch_size // world
        self.sampler = EpochSampler(len(train_dataset), self.cfg.seed, True, self.ctx.rank, world)
        self.steps_per_epoch = max(1, len(self.sampler) // self.micro_batch // self.cfg.grad_accum_steps)
        if self.cfg.max_steps:
            self.total_steps = int(self.cfg.max_steps)
        else:
            self.total_steps = max(1, int(math.ceil(self.cfg.epochs * self.steps_per_epoch)))
        warm = self.cfg.warmup_steps if self.cfg.warmup_steps is not None else int(
            self.cfg.warmup_ratio * self.total_steps)
        self.optimizer = make_optimizer(self.model, self.cfg.lr, self.cfg.weight_decay, self.cfg.adam_betas,
                                        self.cfg.adam_eps)
        self.scheduler = make_scheduler(self.optimizer, self.cfg.schedule, warm, self.total_steps)
        self.ddp_model = dist_utils.wrap_ddp(self.model, self.ctx)
        self.step = 0
        self.best: Optional[float] = None
        self.best_step: Optional[int] = None
        self.metrics_path = self.out_dir / "metrics.jsonl"

    # ------------------------------------------------------------------ helpers
    @property
    def is_main(self) -> bool:
        return self.ctx.rank == 0

    def _autocast(self):
        if self.impl.dtype == "bfloat16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _log(self, record: dict) -> None:
        if self.is_main:
            append_jsonl(self.metrics_path, record)

    def _batches(self, epoch: int, skip: int):
        self.sampler.set_epoch(epoch)
        order = self.sampler.order()
        mb = self.micro_batch
        n_micro = (len(order) // mb)
        for j in range(skip * self.cfg.grad_accum_steps, n_micro):
            idx = order[j * mb:(j + 1) * mb]
            # the collator's randomness (dynamic masking) is a function of (seed, epoch, micro-batch, rank)
            seed = (self.cfg.seed * 7919 + epoch * 1_000_003 + j * 31 + self.ctx.rank) % 2**63
            with _seeded(seed):
                batch = self.collate_fn([self.train_dataset[i] for i in idx])
            yield batch

    def _to_device(self, batch: dict) -> dict:
        return {k: (v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v)
                for k, v in batch.items()}

    # -------------------------------------------------------------- checkpoints
    def _ckpt_root(self) -> Path:
        return self.out_dir / "checkpoints"

    def save_checkpoint(self) -> None:
        """Write checkpoints/step-N atomically (all of it, or nothing), then rotate old ones."""
        if not self.is_main:
            dist_utils.barrier(self.ctx)
            return
        target = self._ckpt_root() / f"step-{self.step}"
        with atomic_dir(target) as tmp:
            self.save_fn(self.model, tmp)
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(_rng_state_portable(), tmp / "rng.pt")
            from safetensors.torch import save_model
            save_model(self.model, str(tmp / "trainer_model.safetensors"))
            state = {"step": self.step, "best": self.best, "best_step": self.best_step,
                     "world_size": self.ctx.world_size}
            (tmp / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
        ckpts = sorted(self._ckpt_root().glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
        keep = set(ckpts[-max(1, self.cfg.keep_checkpoints):])
        if self.best_step is not None:
            keep.add(self._ckpt_root() / f"step-{self.best_step}")
        for p in ckpts:
            if p not in keep:
                shutil.rmtree(p, ignore_errors=True)
        dist_utils.barrier(self.ctx)

    def latest_checkpoint(self) -> Optional[Path]:
        root = self._ckpt_root()
        ckpts = [p for p in root.glob("step-*") if (p / "trainer_state.json").is_file()]
        return max(ckpts, key=lambda p: int(p.name.split("-")[1])) if ckpts else None

    def resume(self, path: Optional[Path] = None) -> bool:
        """Load model/optimizer/scheduler/RNG and step from ``path`` (default: the latest checkpoint)."""
        path = Path(path) if path else self.latest_checkpoint()
        if path is None:
            return False
        from safetensors.torch import load_model
        load_model(self.model, str(path / "trainer_model.safetensors"), strict=False)
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        _set_rng_state_portable(torch.load(path / "rng.pt", weights_only=True))
        state = json.loads((path / "trainer_state.json").read_text())
        self.step, self.best, self.best_step = state["step"], state["best"], state["best_step"]
        return True

    # ---------------------------------------------------------------- evaluate
    def evaluate(self) -> dict:
        if self.eval_fn is None:
            return {}
        self.model.eval()
        with torch.no_grad(), self._autocast():
            metrics = self.eval_fn(self.model)
        self.model.train()
        key = self.cfg.metric_for_best or (next(iter(metrics)) if metrics else None)
        if key is not None and key in metrics:
            v = float(metrics[key])
            better = (self.best is None or (v < self.best if "loss" in key else v > self.best))
            if better:
                self.best, self.best_step = v, self.step
        self._log({"step": self.step, "eval": metrics})
        return metrics

    # --------------------------------------------------------------------- fit
    def fit(self, resume: bool = False) -> dict:
        if self.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.recipe.save(self.out_dir / "recipe.yaml")
        if resume and not self.resume():
            if self.is_main:
                print(f"bertforge: no checkpoint in {self._ckpt_root()}; starting from step 0")
        elif not resume and self.is_main and self.metrics_path.exists():
            self.metrics_path.unlink()
        from tqdm.auto import tqdm
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step",
                   disable=not (self.impl.progress and self.is_main), dynamic_ncols=True)
        self.model.train()
        accum = self.cfg.grad_accum_steps
        eval_every = self.cfg.eval_every or self.steps_per_epoch
        save_every = self.cfg.save_every or self.steps_per_epoch
        t0, tokens, examples = time.perf_counter(), 0, 0
        last_metrics: dict = {}
        running: dict = {}
        while self.step < self.total_steps:
            epoch, skip = divmod(self.step, self.steps_per_epoch)
            micro = 0
            for batch in self._batches(epoch, skip):
                batch = self._to_device(batch)
                micro += 1
                sync = micro % accum == 0
                ctx = contextlib.nullcontext() if sync or self.ddp_model is self.model \
                    else self.ddp_model.no_sync()
                with ctx, self._autocast():
                    out = self.ddp_model(**batch)
                    loss = out.loss if not isinstance(out, dict) else out["loss"]
                    (loss / accum).backward()
                if not torch.isfinite(loss.detach()):
                    raise TrainingError(
                        f"loss became {loss.item()} at step {self.step}; lower train.lr or use "
                        f"impl.dtype=float32 (last good checkpoint: {self.latest_checkpoint()})")
                _accumulate(running, "loss", loss.detach().float(), accum)
                terms = getattr(out, "terms", None) if not isinstance(out, dict) else out.get("terms")
                for k, v in (terms or {}).items():
                    _accumulate(running, k, torch.as_tensor(v).detach().float(), accum)
                if "attention_mask" in batch:
                    tokens += int(batch["attention_mask"].sum())
                examples += int(next(iter(v for v in batch.values() if torch.is_tensor(v))).shape[0])
                if not sync:
                    continue
                if self.cfg.max_grad_norm and self.cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                bar.update(1)
                if self.step % self.cfg.log_every == 0 or self.step == self.total_steps:
                    rec = {k: v / max(1, c) for k, (v, c) in _reduce(running, self.ctx).items()}
                    running.clear()
                    dt = time.perf_counter() - t0
                    rec.update(step=self.step, epoch=epoch, lr=self.scheduler.get_last_lr()[0],
                               examples_per_s=examples * self.ctx.world_size / dt,
                               tokens_per_s=tokens * self.ctx.world_size / dt)
                    self._log(rec)
                    bar.set_postfix(loss=f"{rec['loss']:.4f}")
                if self.eval_fn is not None and (self.step % eval_every == 0 or
                                                 self.step == self.total_steps):
                    last_metrics = self.evaluate()
                if self.step % save_every == 0 or self.step == self.total_steps:
                    self.save_checkpoint()
                if self.step >= self.total_steps:
                    break
        bar.close()
        self._finalize()
        return {"step": self.step, "best": self.best, "best_step": self.best_step, **last_metrics}

    def _finalize(self) -> None:
        """Write the final model (the best one when evaluation picked one) at the top of out_dir."""
        if not self.is_main:
            dist_utils.barrier(self.ctx)
            return
        src = None
        if self.cfg.load_best_at_end and self.best_step is not None and self.best_step != self.step:
            cand = self._ckpt_root() / f"step-{self.best_step}"
            if cand.is_dir():
                src = cand
        if src is not None:
            for f in src.iterdir():
                if f.suffix in (".json", ".safetensors", ".txt", ".model") and f.name != "trainer_state.json":
                    tmp = self.out_dir / f".{f.name}.tmp"
                    shutil.copyfile(f, tmp)
                    os.replace(tmp, self.out_dir / f.name)
        else:
            self.save_fn(self.model, self.out_dir)
        atomic_write_text(self.out_dir / "trainer_state.json",
                          json.dumps({"step": self.step, "best": self.best, "best_step": self.best_step,
                                      "final_from": str(src.name) if src else "last"}))
        dist_utils.barrier(self.ctx)


def _accumulate(d: dict, k: str, v: torch.Tensor, accum: int) -> None:
    s, c = d.get(k, (0.0, 0))
    d[k] = (s + float(v), c + 1)


def _reduce(d: dict, ctx) -> dict:
    if ctx.world_size == 1:
        return d
    keys = sorted(d)
    t = torch.tensor([[d[k][0], d[k][1]] for k in keys], dtype=torch.float64)
    dist_utils.all_reduce_sum(t, ctx)
    return {k: (t[i, 0].item(), t[i, 1].item()) for i, k in enumerate(keys)}


@contextlib.contextmanager
def _seeded(seed: int):
    """Run a block under fixed torch/python/numpy RNG seeds, restoring the outer state afterwards."""
    state = _rng_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        _set_rng_state(state)


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])


def _rng_state_portable() -> dict:
    """RNG states as tensors/ints/lists only, so ``torch.load(weights_only=True)`` reads them back."""
    py = random.getstate()
    npst = np.random.get_state()
    return {"python": [py[0], list(py[1]), py[2]],
            "numpy": [npst[0], torch.from_numpy(npst[1].astype(np.int64)), int(npst[2]), int(npst[3]),
                      float(npst[4])],
            "torch": torch.get_rng_state()}


def _set_rng_state_portable(s: dict) -> None:
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))
    n = s["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(s["torch"])
