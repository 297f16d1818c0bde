"""Training checkpoints on disk: writing them atomically, rotating them, reading them back.

Layout of a run directory ``out_dir``::

    recipe.yaml              the resolved recipe (re-run from it)
    metrics.jsonl            one JSON object per log/eval event
    config.json, model.safetensors, tokenizer.json …   the final (or best) model, HF layout
    checkpoints/step-N/      model (HF layout) + trainer_model.safetensors + trainer_state.json
                             + optimizer.pt + scheduler.pt + rng.pt (one RNG state per rank)

Every checkpoint directory is written under a hidden temporary name and renamed when complete
(:func:`bertforge.io.atomic_dir`), so a kill at any moment leaves the previous checkpoint loadable; old
ones are renamed away before they are deleted, and :func:`clean_stale` removes the temporaries of a write
that a kill interrupted. Weights are safetensors; ``optimizer.pt``/``scheduler.pt``/``rng.pt`` hold only
tensors and plain containers and are read with ``torch.load(weights_only=True)`` (never unpickled).

``trainer_state.json`` records the step, the best evaluation, and what fixes the data position (seed,
training-set size, batch size, accumulation, processes): :func:`check_state` refuses to continue a
checkpoint under other values, since its step would then point at other data. Whether a run directory
*may* be resumed under a changed recipe is the CLI's policy (``bertforge.pipelines.resume_policy``).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional

import torch

from ...errors import BertforgeError, CheckpointError, ConfigError, TrainingError
from ...io import _explain, atomic_dir, atomic_write_text
from . import distributed as dist_utils
from .rng import rng_state, set_rng_state

#: the files :func:`load_training_state` needs besides the HF-layout model
STATE_FILES = ("trainer_state.json", "trainer_model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt")


def step_of(p: Path) -> int:
    """N of a ``step-N`` directory."""
    return int(p.name.split("-")[1])


def latest_checkpoint(root: Path) -> Optional[Path]:
    """The complete ``step-N`` directory with the largest N under ``root`` (``out_dir/checkpoints``), or None."""
    ckpts = [p for p in Path(root).glob("step-*") if (p / "trainer_state.json").is_file()]
    return max(ckpts, key=step_of) if ckpts else None


def read_state(path: Path) -> dict:
    """``trainer_state.json`` of checkpoint ``path`` as a dict.

    Raises:
        CheckpointError: the file is not valid JSON.
    """
    try:
        return json.loads((Path(path) / "trainer_state.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}/trainer_state.json is unreadable ({e}); resume from another "
                              f"checkpoint") from None


def check_state(path: Path, state: dict, expected: dict, sources: Optional[dict] = None) -> None:
    """Refuse a checkpoint whose data position means something else in this run.

    Args:
        path: the checkpoint directory (for the message).
        state: its ``trainer_state.json``.
        expected: this run's values of the state keys that fix the data position — any of ``seed``,
            ``n_examples``, ``batch_size``, ``grad_accum_steps``, ``global_micro_batch``; a key the state
            does not record is not checked.
        sources: name → :func:`bertforge.io.dir_fingerprint` of each model directory the run reads; one whose
            SHA-256 differs from the checkpoint's record is refused.

    Raises:
        CheckpointError: with ``reason="source_changed"`` (facts ``path, name, was, now``) or
            ``reason="state_mismatch"`` (facts ``path, key, saved, now, world_size`` — the processes that
            wrote it). The seed is checked first: it may also change the data.
    """
    for name, now in (sources or {}).items():
        was = (state.get("sources") or {}).get(name)
        if was and was.get("sha256") != now.get("sha256"):
            same = Path(was.get("path", "")) == Path(now.get("path", ""))
            raise CheckpointError(f"checkpoint {path} was written by a run started from {name} {was.get('path')}"
                                  + (", whose files have changed since" if same else
                                     f", not {now.get('path')}"),
                                  reason="source_changed", path=path, name=name, was=was, now=now)
    for key in ("seed", "n_examples", "batch_size", "grad_accum_steps", "global_micro_batch"):
        if key in expected and key in state and state[key] != expected[key]:
            raise CheckpointError(f"checkpoint {path} was written with {state[key]} {key} but this run has "
                                  f"{expected[key]}", reason="state_mismatch", path=path, key=key,
                                  saved=state[key], now=expected[key], world_size=state.get("world_size"))


def torch_save(obj, path: Path) -> None:
    """``torch.save`` that reports a failed write as the OSError it is (torch wraps it in RuntimeError)."""
    try:
        torch.save(obj, path)
    except RuntimeError as e:
        free = shutil.disk_usage(path.parent).free
        code = errno.ENOSPC if free < 1 << 20 or "No space" in str(e) else errno.EIO
        raise OSError(code, os.strerror(code)) from None


def write_checkpoint(target: Path, save_model: Callable[[Path], None], optimizer_state: dict,
                     scheduler_state: dict, rng: dict, state: dict) -> None:
    """Write checkpoint directory ``target`` all at once or not at all.

    Args:
        save_model: writes the model files into the directory it is given (HF layout +
            ``trainer_model.safetensors``).
        optimizer_state, scheduler_state: ``state_dict()`` of each (tensors and plain containers).
        rng: ``{"world_size": W, "ranks": [state of rank 0, …]}`` (:func:`bertforge.engine.train.rng.rng_state`).
        state: JSON-able ``trainer_state.json`` content.

    Raises:
        BertforgeError: the write failed (disk full, permission…); ``target`` is as it was before.
    """
    with atomic_dir(target) as tmp:
        save_model(tmp)
        torch_save(optimizer_state, tmp / "optimizer.pt")
        torch_save(scheduler_state, tmp / "scheduler.pt")
        torch_save(rng, tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")


def rotate(root: Path, keep: int, best_step: Optional[int] = None) -> None:
    """Delete all but the newest ``keep`` (≥ 1) checkpoints under ``root``, and the best one; each is renamed
    to a hidden name first (atomic), so a kill during the deletion leaves no half-deleted ``step-N``."""
    ckpts = sorted(Path(root).glob("step-*"), key=step_of)
    kept = set(ckpts[-max(1, keep):])
    if best_step is not None:
        kept.add(Path(root) / f"step-{best_step}")
    for p in ckpts:
        if p not in kept:
            gone = p.with_name(f".{p.name}.deleting")
            os.replace(p, gone)
            shutil.rmtree(gone, ignore_errors=True)


def clean_stale(root: Path) -> None:
    """Remove the hidden temporaries of checkpoint writes and deletions that a kill interrupted."""
    if Path(root).is_dir():
        for p in Path(root).glob(".step-*"):
            shutil.rmtree(p, ignore_errors=True)


def require_complete(path: Path) -> None:
    """CheckpointError (``reason="incomplete"``, facts ``path, missing``) unless ``path`` has every file of
    :data:`STATE_FILES`."""
    missing = [f for f in STATE_FILES if not (Path(path) / f).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} has no {missing[0]}; resume from another checkpoint",
                              reason="incomplete", path=path, missing=missing[0])


def load_training_state(path: Path, load_model: Callable[[Path], None], optimizer, scheduler,
                        load_optimizer: Optional[Callable[[dict], None]] = None) -> dict:
    """Load model weights, optimizer and scheduler state from checkpoint ``path``; return its RNG record.

    Args:
        load_model: loads ``trainer_model.safetensors`` (the path it is given) into the model; may raise
            CheckpointError itself (e.g. names that do not fit).
        optimizer, scheduler: receive their ``state_dict`` (read with ``torch.load(weights_only=True)``).
        load_optimizer: loads the optimizer's state dict instead of ``optimizer.load_state_dict`` (FSDP).

    Raises:
        CheckpointError: a file is truncated, holds a pickle that is not plain data, or does not fit.
    """
    try:
        load_model(Path(path) / "trainer_model.safetensors")
        opt = torch.load(Path(path) / "optimizer.pt", weights_only=True)
        (load_optimizer or optimizer.load_state_dict)(opt)
        scheduler.load_state_dict(torch.load(Path(path) / "scheduler.pt", weights_only=True))
        return torch.load(Path(path) / "rng.pt", weights_only=True)
    except CheckpointError:
        raise
    except Exception as e:  # truncated file, unpickling refused, shape mismatch …
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "size mismatch" in ln or "Missing" in ln), lines[0] if lines
                   else type(e).__name__)
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({why[:200]}); resume with the options "
                              f"and model.* overrides the run was started with, or, if the files are "
                              f"damaged, delete that step-N dir to resume from the one before it") from None


def copy_model_files(src: Path, dst: Path) -> None:
    """Copy the HF-layout model files of checkpoint ``src`` to ``dst`` (each file replaced atomically), and
    the sentence-transformers module folders of an embedding dir (``1_Pooling/``, ``2_Normalize/``)."""
    for f in Path(src).iterdir():
        if f.is_dir() and re.fullmatch(r"\d+_[A-Za-z]+", f.name):
            tmp = Path(dst) / f".{f.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(f, tmp)
            shutil.rmtree(Path(dst) / f.name, ignore_errors=True)
            os.replace(tmp, Path(dst) / f.name)
            continue
        if f.suffix in (".json", ".safetensors", ".txt", ".model") and \
                f.name not in ("trainer_state.json", "trainer_model.safetensors"):
            tmp = Path(dst) / f".{f.name}.tmp"
            shutil.copyfile(f, tmp)
            os.replace(tmp, Path(dst) / f.name)


class Checkpointer:
    """The checkpoints of one training run: writes every rank's state into ``root/step-N`` and reads it back.

    Args:
        root: ``out_dir/checkpoints``.
        model: the (unwrapped) module being trained; under FSDP, sharded in place.
        optimizer, scheduler: their state is saved and restored with the model's.
        ctx: the process group (:class:`bertforge.engine.train.distributed.DistContext`).
        save_fn: ``save_fn(module, dir)`` writes a module in HF layout.
        skeleton: under FSDP, a weightless ``deepcopy(model).to("meta")`` taken before sharding, from which a
            plain module is rebuilt to carry the gathered weights; None otherwise.
    """

    def __init__(self, root: Path, model, optimizer, scheduler, ctx: dist_utils.DistContext,
                 save_fn: Callable, skeleton=None):
        self.root, self.model, self.optimizer, self.scheduler = Path(root), model, optimizer, scheduler
        self.ctx, self.save_fn, self.skeleton = ctx, save_fn, skeleton

    def latest(self) -> Optional[Path]:
        return latest_checkpoint(self.root)

    def _module(self, full_state: Optional[dict]):
        """The module to save: the model itself, or under FSDP a plain copy carrying the gathered weights."""
        return self.model if full_state is None else dist_utils.plain_copy(self.skeleton, full_state)

    def _full_state(self) -> tuple:
        """(model state dict or None, optimizer state dict), gathered unsharded under FSDP (a collective)."""
        if self.skeleton is None:
            return None, self.optimizer.state_dict()
        return dist_utils.full_state_dicts(self.model, self.optimizer)

    def save(self, step: int, state: dict, keep: int, best_step: Optional[int]) -> None:
        """Write ``step-N`` (``state``: its ``trainer_state.json``) on rank 0, then keep the newest ``keep``
        and the best. A collective: call it on every rank.

        Raises:
            BertforgeError: the write failed (disk full, permission…); nothing half-written is left under
                ``step-N`` and older checkpoints are intact. Other ranks: TrainingError
                (``reason="rank0_write_failed"``).
        """
        from safetensors.torch import save_model
        rng = dist_utils.gather_object(rng_state(), self.ctx)
        model_sd, optim_sd = self._full_state()
        err = None
        if self.ctx.rank == 0:
            target = self.root / f"step-{step}"

            def write_model(tmp: Path) -> None:
                module = self._module(model_sd)
                self.save_fn(module, tmp)
                save_model(module, str(tmp / "trainer_model.safetensors"))
            try:
                write_checkpoint(target, write_model, optim_sd, self.scheduler.state_dict(),
                                 {"world_size": self.ctx.world_size, "ranks": rng}, state)
                rotate(self.root, keep, best_step)
            except OSError as e:
                err = _explain(e, target)
            except BertforgeError as e:
                err = e
        if dist_utils.any_rank(err is not None, self.ctx):
            raise err or TrainingError("rank 0 could not write a checkpoint (see its message); free space or "
                                       "choose a writable output directory", reason="rank0_write_failed")

    def load(self, path: Path, expected: dict, sources: Optional[dict], total_steps: int) -> dict:
        """Check checkpoint ``path`` against this run (:func:`check_state` with ``expected`` and ``sources``;
        its step ≤ ``total_steps``), then restore model weights, optimizer, scheduler and this rank's RNG
        state from it. Returns its ``trainer_state.json``.

        Raises:
            CheckpointError: a file is missing (``reason="incomplete"``), unreadable or does not fit the
                model; the data position means something else in this run (see :func:`check_state`).
            ConfigError: the checkpoint is past this run's last step (``reason="past_end"``).
        """
        require_complete(path)
        state = read_state(path)
        check_state(path, state, expected, sources)
        if state["step"] > total_steps:
            raise ConfigError(f"checkpoint {path} is at step {state['step']}, past this run's {total_steps} "
                              f"steps (train.max_steps, or train.epochs); pass more steps to train further, or "
                              f"use the run as it is", reason="past_end", path=path, step=state["step"],
                              total=total_steps)
        load_optimizer = None
        if self.skeleton is not None:
            load_optimizer = lambda sd: dist_utils.load_full_state(self.model, self.optimizer, None, sd)  # noqa: E731
        rng = load_training_state(path, self._load_weights, self.optimizer, self.scheduler, load_optimizer)
        ranks = rng["ranks"] if isinstance(rng, dict) and "ranks" in rng else [rng]  # [rng]: earlier format
        set_rng_state(ranks[self.ctx.rank % len(ranks)])
        return state

    def _load_weights(self, file: Path) -> None:
        from safetensors.torch import load_model
        if self.skeleton is not None:
            plain = dist_utils.plain_copy(self.skeleton, {})
            load_model(plain, str(file))
            dist_utils.load_full_state(self.model, self.optimizer, plain.state_dict())
            return
        missing, unexpected = load_model(self.model, str(file), strict=False)
        if missing or unexpected:
            raise CheckpointError(f"{file.parent} does not fit this model ({(missing or unexpected)[0]}); "
                                  f"resume with the same model and recipe")

    def write_final(self, out_dir: Path, step: int, best: Optional[float], best_step: Optional[int],
                    load_best: bool, save_every: Optional[int] = None) -> int:
        """Write the final model at the top of ``out_dir`` and its ``trainer_state.json``: with ``load_best``,
        the model files of the best step's checkpoint (a warning where there is none: ``save_every``, the
        run's ``train.save_every``, skipped it), else the current weights. A collective (gathers under
        FSDP). Returns the step whose weights it wrote.

        Raises:
            BertforgeError: the write failed.
        """
        src = None
        if load_best and best_step is not None and best_step != step:
            if (self.root / f"step-{best_step}").is_dir():
                src = self.root / f"step-{best_step}"
            elif self.ctx.rank == 0:
                sys.stderr.write(f"bertforge: warning: the best evaluation was at step {best_step}, which has no "
                                 f"checkpoint (train.save_every={save_every}); the final model is step {step}'s. "
                                 f"Save at every evaluation (train.save_every = train.eval_every) to keep the best\n")
        record = {"step": step, "best": best, "best_step": best_step, "final_from": str(src.name) if src else "last"}
        model_sd = self._full_state()[0] if self.skeleton is not None else None
        err = None
        if self.ctx.rank == 0:
            try:
                if src is not None:
                    copy_model_files(src, out_dir)
                else:
                    self.save_fn(self._module(model_sd), out_dir)
                atomic_write_text(Path(out_dir) / "trainer_state.json", json.dumps(record))
            except OSError as e:
                err = _explain(e, out_dir)
            except BertforgeError as e:
                err = e
        if dist_utils.any_rank(err is not None, self.ctx):
            raise err or TrainingError("rank 0 could not write the final model (see its message)")
        return best_step if src is not None else step


__all__ = ["STATE_FILES", "step_of", "latest_checkpoint", "read_state", "check_state", "torch_save",
           "write_checkpoint", "rotate", "clean_stale", "require_complete", "load_training_state",
           "copy_model_files", "Checkpointer"]
