"""What a training run read, recorded in its ``recipe.yaml``, so that the recipe alone re-runs it.

Every training verb (``finetune``, ``pretrain``, ``distill``, ``translate train``) records each input under
``sources``, by the flag that names it (``--model``, ``--train``, ``--eval``, ``--teacher`` or
``--teacher #2`` …, ``--corpus #1`` …, ``--src`` …)::

    sources:
      --model: {path: /abs/runs/base, sha256: 3f1…}           # a model dir (bertforge.io.dir_fingerprint)
      --train: {path: /abs/data/train.tsv, bytes: 81234, sha256: 9c0…}   # a data file
      --eval:  {name: glue/sst2:validation}                   # a hub dataset: its name only

(a model given as ``minilm`` or as a hub id also keeps that ``name``), and writes the data paths of its
``data`` / verb sections resolved (absolute). ``bertforge <verb> --recipe RUN/recipe.yaml --out NEW`` then
needs no other flag, from any working directory: each input flag it is not given is taken from the recipe,
and before it is read it must still be where the run found it, with the same size and SHA-256 — a moved or
changed input is one ``bertforge: error: …`` line naming it, never silently used. A flag given on the
command line (or a ``KEY=VALUE`` override naming another file) is the user's choice and is not checked.
Recipes without ``sources`` (written by hand or by an older version) load as before.

The model-dir fingerprints are the ones ``--resume`` already compares (the Trainer's ``sources``): each is
computed once per run (:class:`Sources` keeps them by path).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import ConfigError


def file_fingerprint(path) -> dict:
    """``{"path": resolved file, "bytes": size, "sha256": hex}`` of a data file (a directory: its path
    only; the readers say what they make of it)."""
    import hashlib
    p = Path(path).resolve()
    if not p.is_file():
        return {"path": str(p)}
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return {"path": str(p), "bytes": p.stat().st_size, "sha256": h.hexdigest()}


def numbered(flag: str, i: int, n: int) -> str:
    """The name of the ``i``-th (0-based) of ``n`` values of a many-valued flag: ``--teacher`` for one,
    ``--teacher #2`` for the second of several (the names :func:`bertforge.pipelines.distill.
    source_fingerprints` gives the teachers)."""
    return flag if n == 1 else f"{flag} #{i + 1}"


def _short(h: Optional[str]) -> str:
    return f"{h[:12]}…" if h else "?"


class Sources:
    """The inputs of one training run: those its ``--recipe`` recorded (checked when reused) and those it
    reads now (:attr:`now`, written to its own recipe by :meth:`record`).

    Args:
        recipe: the run's recipe as loaded (its ``sources`` are the recorded inputs).
        recipe_file: the ``--recipe`` path (named in the messages).
    """

    def __init__(self, recipe, recipe_file=None):
        self.recorded = dict(getattr(recipe, "sources", None) or {})
        self.recipe_file = recipe_file
        self.now: dict = {}
        self._dirs: dict = {}  # resolved dir → dir_fingerprint (hashed once per run)

    # ------------------------------------------------------------------------------------------- models
    def model_spec(self, flag: str, given: Optional[str], fallback: Optional[str] = None) -> Optional[str]:
        """The model spec (dir, ``minilm`` or hub id) this run reads for ``flag``: ``given`` (the flag's
        value), else ``fallback`` (a verb section's value), else the recipe's record; a recorded model
        reused without the flag is checked first (:meth:`check_model`)."""
        rec = self.recorded.get(flag)
        spec = given or fallback or (rec and (rec.get("name") or rec.get("path")))
        self.now.setdefault(flag, {})  # recorded in the order read: the models first
        if spec and not given and rec and _same(spec, rec):
            self.check_model(flag, rec)
        return spec

    def model_specs(self, flag: str, given: Optional[list]) -> list:
        """:meth:`model_spec` of a repeatable flag (``--teacher``): the given values, else the recorded
        ``flag`` or ``flag #1``, ``flag #2`` …, each checked."""
        if given:
            for i in range(len(given)):
                self.now.setdefault(numbered(flag, i, len(given)), {})
            return list(given)
        recs = self._numbered(flag)
        for name, rec in recs:
            self.now.setdefault(name, {})
            self.check_model(name, rec)
        return [rec.get("name") or rec.get("path") for _, rec in recs]

    def check_model(self, flag: str, rec: dict) -> None:
        """ConfigError unless the model dir recorded as ``rec`` for ``flag`` is still there with the same
        files (the same :func:`bertforge.io.dir_fingerprint`)."""
        from ..checkpoint.modeldir import resolve
        d = resolve(rec["name"]) if rec.get("name") else Path(rec["path"])  # a name such as 'minilm': its path
        shown = rec.get("name") or rec.get("path")
        if not Path(d).is_dir():
            raise ConfigError(self._moved(flag, shown))
        fp = self.fingerprint_dir(d)
        if rec.get("sha256") and fp["sha256"] != rec["sha256"]:
            raise ConfigError(f"{flag} {shown} has changed since the run recorded in {self.recipe_file} (its "
                              f"files' sha256 {_short(rec['sha256'])} → {_short(fp['sha256'])}); restore it, or "
                              f"pass {flag} {shown} to train from it as it is now")

    def fingerprint_dir(self, d) -> dict:
        """:func:`bertforge.io.dir_fingerprint` of ``d``, computed once per run."""
        from ..io import dir_fingerprint
        key = str(Path(d).resolve())
        if key not in self._dirs:
            self._dirs[key] = dir_fingerprint(d)
        return dict(self._dirs[key])

    def record_model(self, flag: str, spec: str, model_dir) -> dict:
        """Record model dir ``model_dir`` (given as ``spec``) for ``flag``; returns its fingerprint
        ``{path, sha256}`` (the Trainer's ``sources`` entry)."""
        fp = self.fingerprint_dir(model_dir)
        entry = dict(fp)
        if not Path(str(spec)).exists():  # minilm or a hub id: the name finds it again elsewhere
            entry = {"name": str(spec), **entry}
        self.now[flag] = entry
        return fp

    # --------------------------------------------------------------------------------------------- data
    def data_path(self, flag: str, value: Optional[str], given: bool) -> Optional[str]:
        """The data input ``value`` of ``flag`` (a file, or a hub dataset name) as this run reads it: checked
        when it is the recipe's record and the flag was not ``given``, recorded, and returned resolved
        (absolute) when it is a local path."""
        if value is None:
            return None
        value = str(value)
        rec = self.recorded.get(flag)
        if not given and rec and _same(value, rec):
            self.check_file(flag, rec)
        return self._record_file(flag, value)

    def data_paths(self, flag: str, values: Optional[list], given: bool) -> list:
        """:meth:`data_path` for each value of a many-valued flag (``--corpus``), named ``flag #i``."""
        values = [str(v) for v in (values or [])]
        recs = dict(self._numbered(flag)) if not given else {}
        out = []
        for i, v in enumerate(values):
            name = numbered(flag, i, len(values))
            rec = recs.get(name)
            if rec and _same(v, rec):
                self.check_file(name, rec)
            out.append(self._record_file(name, v))
        return out

    def check_file(self, flag: str, rec: dict) -> None:
        """ConfigError unless the data file recorded as ``rec`` is still there with the same size and
        SHA-256 (a hub dataset, recorded by name, is not checked)."""
        if not rec.get("path"):
            return
        p = Path(rec["path"])
        if not p.exists():
            raise ConfigError(self._moved(flag, rec["path"]))
        if "sha256" not in rec:
            return
        now = file_fingerprint(p)
        if now.get("sha256") != rec["sha256"]:
            what = (f"{rec.get('bytes')} → {now.get('bytes')} bytes" if now.get("bytes") != rec.get("bytes")
                    else f"same size, sha256 {_short(rec['sha256'])} → {_short(now.get('sha256'))}")
            raise ConfigError(f"{flag} {rec['path']} has changed since the run recorded in {self.recipe_file} "
                              f"({what}); restore it, or pass {flag} {rec['path']} to use it as it is now")

    def _record_file(self, flag: str, value: str) -> str:
        if Path(value).exists():
            entry = file_fingerprint(value)
            self.now[flag] = entry
            return entry["path"]
        self.now[flag] = {"name": value}  # a hub dataset (or a missing file, which the reader reports)
        return value

    # ------------------------------------------------------------------------------------------ helpers
    def _numbered(self, flag: str) -> list:
        """[(name, record)] of ``flag`` (one value) or ``flag #1``, ``flag #2`` … in order."""
        if flag in self.recorded:
            return [(flag, self.recorded[flag])]
        out, i = [], 1
        while f"{flag} #{i}" in self.recorded:
            out.append((f"{flag} #{i}", self.recorded[f"{flag} #{i}"]))
            i += 1
        return out

    def _moved(self, flag: str, shown: str) -> str:
        return (f"{flag} {shown}, recorded in {self.recipe_file}, no longer exists (moved or deleted since that "
                f"run); put it back, or pass {flag} with its new place")

    def record(self, recipe) -> None:
        """Write what this run reads into ``recipe.sources`` (saved with ``recipe.yaml``)."""
        recipe.sources = {k: v for k, v in self.now.items() if v}


def _same(value: str, rec: dict) -> bool:
    """Whether ``value`` (a path or name as the run is about to read it) is the input ``rec`` records."""
    if rec.get("name") is not None and str(value) == str(rec["name"]):
        return True
    return bool(rec.get("path")) and Path(str(value)).resolve() == Path(rec["path"])


def require(value, message: str):
    """``value``, or ConfigError(``message``) when it is missing (an input neither given nor recorded)."""
    if not value:
        raise ConfigError(message)
    return value


__all__ = ["Sources", "file_fingerprint", "numbered", "require"]
