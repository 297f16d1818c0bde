"""A verb's output folder (``--out``) from the first check to the swap: :class:`RunDir`.

Every verb that writes a folder goes through one ``RunDir``: the training verbs (finetune, pretrain,
distill, translate train) and the verbs that write a model in one go (prune, quantize, export)::

    run_dir = RunDir(args.out, inputs=(model_dir,), overwrite=args.overwrite, resume=args.resume)  # check
    ...                          # load and validate everything else: nothing is written yet
    with run_dir as work:        # stage
        ...                      # run: write the folder's files into ``work``
    # swapped in: --out is the new folder, the old one is gone

1. **check** (on construction): the ``--out`` rules, each broken one a one-line BertforgeError. ``--out``
   is never a file; never is, contains or lies inside an input model dir, nor lies inside another run,
   checkpoint or export dir (a later ``--overwrite`` or ``--resume`` of that one would delete or trip
   over it); a non-empty ``--out`` needs ``--overwrite`` (a training verb: or ``--resume``), and
   ``--overwrite`` replaces only a folder bertforge or ``transformers`` wrote — never a folder of other
   files, the working directory or a folder that contains it.
2. **stage**: the folder the verb writes into. A temporary sibling ``.NAME.staging-HOST_PID_…`` whenever
   ``--out`` is to be replaced, and always for a one-shot verb, so the old folder stays whole until the new
   one is; ``--out`` itself for ``--resume`` and for a training run into a new or empty ``--out`` (a crash
   then leaves its checkpoints there for ``--resume``).
3. **swap in**: on success the staging dir takes ``--out``'s place (:func:`bertforge.io.swap_in`).
4. **clean up**: on any exception — Ctrl-C, and SIGTERM, which the CLI raises as a KeyboardInterrupt,
   included — the staging dir is removed and an old ``--out`` stays as it was; a new or empty ``--out`` a
   training run wrote into is returned to how it was found, unless a checkpoint was saved (kept for
   ``--resume``). ``kill -9`` leaves no chance to clean up: the next RunDir on that ``--out`` removes the
   staging dirs whose writer (this host, the pid in the name) is gone
   (:func:`bertforge.io.remove_stale_siblings`).

Under ``torchrun`` every rank of a training run writes into the same folder (a staging dir named after the
run id) and only rank 0 swaps it in or cleans it up.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from ..errors import BertforgeError, ConfigError
from ..io import _explain, remove_stale_siblings, staging_dir, swap_in

#: what a folder bertforge wrote holds at its top: a run, a checkpoint, or an exported graph
OUTPUT_MARKERS = ("recipe.yaml", "config.json", "checkpoints", "model.onnx")


def holds_output(path: Path) -> bool:
    """Whether ``path`` is a run, checkpoint or export dir (one of :data:`OUTPUT_MARKERS` at its top)."""
    return any((Path(path) / f).exists() for f in OUTPUT_MARKERS)


#: weight files one of which, beside a ``config.json``, makes a dir a model bertforge (or transformers) wrote
WEIGHT_FILES = ("model.safetensors", "model.int8.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")


def replaceable_output(path: Path) -> bool:
    """Whether ``--overwrite`` may replace ``path``: a training run (``recipe.yaml``), an export
    (``model.onnx``), a bundle (``manifest.json`` of ``bertforge bundle``), a dir of saved checkpoints (``checkpoints/step-N``) or a model (``config.json`` and its
    weights). Stricter than :func:`holds_output`: a folder that merely holds a ``config.json`` or an empty
    ``checkpoints/`` beside the user's own files is not replaced."""
    path = Path(path)
    if (path / "recipe.yaml").is_file() or (path / "model.onnx").is_file():
        return True
    if (path / "manifest.json").is_file():  # a bundle (bertforge bundle): its manifest says so
        from ..checkpoint.layout import read_json_object
        return bool(read_json_object(path / "manifest.json").get("bundle"))
    if (path / "checkpoints").is_dir() and any(p.name.startswith("step-") for p in (path / "checkpoints").iterdir()):
        return True
    return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


def enclosing_output(path: Path) -> Optional[Path]:
    """The nearest directory above ``path`` (resolved) that holds a run, checkpoint or export, or None."""
    return next((p for p in Path(path).resolve().parents if holds_output(p)), None)


class RunDir:
    """The ``--out`` folder of one verb run: checked on construction, staged by ``with``, swapped in when
    the ``with`` body succeeds, cleaned up when it raises (see the module docstring for the rules).

    Args:
        out: the ``--out`` path.
        inputs: model dirs the verb reads; ``out`` may not be, contain or lie inside one of them.
        overwrite: ``--overwrite`` was given: a run in ``out`` may be replaced.
        resume: a training verb's ``--resume`` (True or False); None for a one-shot verb (no ``--resume``;
            its folder is always staged, and an ``OSError`` while writing it is reported as one line).

    Attributes:
        out: the ``--out`` path as given.
        work: the folder to write into, set by ``with`` (``out`` itself or a staging sibling).

    Raises:
        BertforgeError: on construction, a one-line message naming the broken rule and the fix.
    """

    def __init__(self, out, *, inputs: tuple = (), overwrite: bool = False, resume: Optional[bool] = None):
        self.out = Path(out)
        self.inputs = tuple(Path(i) for i in inputs)
        self.overwrite = bool(overwrite)
        self.resume = bool(resume)
        self.trains = resume is not None
        self.work: Optional[Path] = None
        self._staged = False
        self._created: Optional[bool] = None  # written in place: created by this run (True) or found empty
        self.check()

    # ------------------------------------------------------------------------------------------ check
    def check(self) -> None:
        """Apply the ``--out`` rules; also removes the staging dirs of killed runs beside ``out``.

        Raises:
            BertforgeError: ``out`` is a file, overlaps an input or another run, is not empty without
                ``--overwrite`` / ``--resume``, or is not a folder ``--overwrite`` may replace.
        """
        out = self.out
        if self.resume and self.overwrite:
            raise BertforgeError("--resume continues the run in --out and --overwrite replaces it; pass one "
                                 "of them")
        if out.exists() and not out.is_dir():
            raise BertforgeError(f"--out {out} is a file; pass a directory path")
        remove_stale_siblings(out.resolve())
        if self.resume:
            if not (out / "checkpoints").is_dir():
                raise BertforgeError(f"--resume: {out} has no checkpoints/; run without --resume first")
            return
        busy = out.is_dir() and any(out.iterdir())
        # of two broken rules, a training verb names what --overwrite may not replace, a one-shot verb
        # where --out may not lie
        if busy and self.overwrite and self.trains:
            self._check_replaceable()
        self._check_placement()
        if busy and not self.overwrite:
            if not self.trains:
                raise BertforgeError(f"--out {out} is not empty; pass --overwrite or another --out")
            if not holds_output(out):
                raise BertforgeError(f"--out {out} is a non-empty directory that holds no run; pass an empty "
                                     f"or new --out")
            raise BertforgeError(f"--out {out} already holds a run; pass --resume to continue it, "
                                 f"--overwrite to replace it, or another --out")
        if busy and self.overwrite and not self.trains:
            self._check_replaceable()

    def _check_placement(self) -> None:
        out, res = self.out, self.out.resolve()
        for src in self.inputs:
            src = src.resolve()
            how = ("would replace the input" if src == res else "contains the input" if res in src.parents
                   else "is inside the input" if src in res.parents else None)
            if how:
                raise BertforgeError(f"--out {out} {how} {src}; choose an --out outside it")
        parent = enclosing_output(res)
        if parent is not None:
            raise BertforgeError(f"--out {out} is inside {parent}, which holds a bertforge run or model; "
                                 f"choose an --out outside it")

    def _check_replaceable(self) -> None:
        out, res, cwd = self.out, self.out.resolve(), Path.cwd().resolve()
        if res == cwd or res in cwd.parents:
            raise BertforgeError(f"--out {out} is the current directory or contains it; --overwrite cannot "
                                 f"replace it, pass a path below it")
        if not replaceable_output(out):
            raise BertforgeError(f"--out {out} holds files that are not a bertforge run; --overwrite replaces "
                                 f"only a run or checkpoint dir, pass an empty or new --out")

    # ------------------------------------------------------------------------------------------ stage
    def __enter__(self) -> Path:
        self.work = self._stage()
        return self.work

    def _stage(self) -> Path:
        out = self.out
        if self.resume:
            return out
        if self.trains and not (out.is_dir() and any(out.iterdir())):  # new or empty: train in place
            existed = out.exists()
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise BertforgeError(f"cannot create --out {out} ({e.strerror}); choose a writable path") from None
            self._created = not existed
            return out
        self._staged = True
        res = out.resolve()  # staged beside the resolved path ("runs/x/.." has no name of its own)
        if self.trains and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: the ranks agree on one dir
            st = res.with_name(f".{res.name}.staging-{os.environ.get('TORCHELASTIC_RUN_ID', 'ddp')}")
            st.mkdir(exist_ok=True)
            return st
        try:
            return staging_dir(res, label="staging-")
        except OSError as e:
            raise _explain(e, out) from None

    # --------------------------------------------------------------------------- swap in / clean up
    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._swap_in()
            return False
        self._clean_up()
        if isinstance(exc, OSError) and not self.trains:  # a failed write of the folder
            raise _explain(exc, self.out) from None
        return False

    def _rank0(self) -> bool:
        """Whether this process swaps in and cleans up: any one-shot verb, a training run's rank 0."""
        return not self.trains or int(os.environ.get("RANK", "0")) == 0

    def _swap_in(self) -> None:
        if not self._staged or not self._rank0():
            return
        try:
            swap_in(self.work, self.out.resolve())
        except OSError as e:
            shutil.rmtree(self.work, ignore_errors=True)
            raise _explain(e, self.out) from None

    def _clean_up(self) -> None:
        if self.work is None or not self._rank0():
            return
        if self._staged:
            shutil.rmtree(self.work, ignore_errors=True)
            return
        if self._created is None or any((self.out / "checkpoints").glob("step-*")):
            return  # the folder of --resume, or a run that saved a checkpoint: kept for --resume
        if self._created:
            shutil.rmtree(self.out, ignore_errors=True)
            return
        for child in self.out.iterdir():
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
