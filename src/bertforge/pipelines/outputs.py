"""Output paths beside a run folder: an output *file* (``--out results.json``, ``--output hyp.txt``), the files a
verb writes into a plain folder, and a cache dir (``--cache-dir``) — refused, before anything is written, where
they would land inside a model, run, checkpoint or export dir or on an input (the rules of
:mod:`bertforge.pipelines.rundir`, for paths that are not a run folder).

Imports nothing heavy (the verbs' option checks run before torch loads)."""
from __future__ import annotations

from pathlib import Path

from ..errors import BertforgeError, ConfigError
from .rundir import enclosing_output, holds_output


def check_cache_dir(cache: Path, out: Path, inputs: tuple = (), *, reuse_hint: str, kind: str = "a cache",
                    is_cache=None, inside_out: bool = False) -> None:
    """Refuse a ``--cache-dir`` before anything is written when it is a file; is, contains or lies inside an
    input model dir or ``--out`` (with ``inside_out`` a dir below ``--out`` is fine, e.g. distill's default
    ``<out>/teacher_cache``); holds files that ``is_cache(dir)`` rejects; or is / lies inside another run,
    model, checkpoint or export dir, unless ``is_cache`` accepts it filled (an earlier distill run's
    ``teacher_cache`` may be reused). Cache files would otherwise land where bertforge promises not to write.

    Raises:
        ConfigError: one line naming the overlap and the fix (``reuse_hint``: what else may be passed).
    """
    if cache.exists() and not cache.is_dir():
        raise ConfigError(f"--cache-dir {cache} is a file; pass a directory (new, or {reuse_hint})")
    res, out_res = cache.resolve(), Path(out).resolve()
    for what, d in [("the input", Path(i).resolve()) for i in inputs] + [("--out", out_res)]:
        below_out = inside_out and d == out_res
        if d == res or res in d.parents or (d in res.parents and not below_out):
            raise ConfigError(f"--cache-dir {cache} overlaps {what} {d}; choose a directory outside it")
    if is_cache is not None and not is_cache(cache):
        raise ConfigError(f"--cache-dir {cache} holds files that are not {kind}; pass a new or empty directory, "
                          f"or {reuse_hint}")
    parent = res if (cache.is_dir() and holds_output(res)) else enclosing_output(res)
    reused = is_cache is not None and cache.is_dir() and any(cache.iterdir())
    if parent is not None and not (inside_out and parent == out_res) and not reused:
        raise ConfigError(f"--cache-dir {cache} lies inside {parent}, which holds a bertforge run or model; "
                          f"choose a directory outside it")


def check_out_file(out: Path, protected=(), inputs=(), overwrite: bool = False, flag: str = "--out",
                   example: str = "preds.jsonl") -> Path:
    """Refuse an output *file* path that is a directory, lies inside one of the ``protected`` dirs (the
    verb's input models) or inside any run, model, checkpoint or export dir, is one of the ``inputs`` files,
    or exists without ``overwrite``: a verb's output never replaces a checkpoint's, a run's or its input's
    files.

    Raises:
        BertforgeError: one line naming ``flag``, the path and the fix.
    """
    out = Path(out)
    if out.is_dir():
        res = out.resolve()
        taken = (any(Path(d).resolve() == res for d in protected) or holds_output(res)
                 or enclosing_output(res) is not None)  # a file there would be refused too
        hint = f"a file path outside it, such as {example}" if taken else f"a file path such as {out}/{example}"
        raise BertforgeError(f"{flag} {out} is a directory; pass {hint}")
    target = out.resolve()
    for d in protected:
        if Path(d).resolve() in target.parents:
            raise BertforgeError(f"{flag} {out} lies inside the model directory {d}; write elsewhere")
    parent = enclosing_output(target)
    if parent is not None:
        raise BertforgeError(f"{flag} {out} lies inside {parent}, which holds a bertforge run or model; "
                             f"write outside it")
    for i in inputs:
        if i and Path(i).exists() and Path(i).resolve() == target:
            raise BertforgeError(f"{flag} {out} is the input file; choose another {flag}")
    if out.exists() and not overwrite:
        raise BertforgeError(f"{flag} {out} exists; pass --overwrite to replace it, or another {flag}")
    return out


def check_out_files(out_dir: Path, names: tuple, overwrite: bool, inputs: tuple = (), flag: str = "--out") -> Path:
    """:func:`check_out_file` for each of the files ``names`` a verb writes into the folder ``out_dir``
    (``qa-split``, ``embedded-corpus``), after refusing an ``out_dir`` that is a file."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BertforgeError(f"{flag} {out_dir} is a file; pass a folder (new or empty)")
    for n in names:
        check_out_file(out_dir / n, inputs=inputs, overwrite=overwrite, flag=flag)
    return out_dir


__all__ = ["check_cache_dir", "check_out_file", "check_out_files"]
