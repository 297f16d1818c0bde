"""Atomic file and directory writes: write to a temporary name in the same folder, then rename.

A kill during a write leaves the previous file (or directory) in place and loadable.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import BertforgeError, CheckpointError


def current_umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _explain(e: OSError, path: Path) -> BertforgeError:
    import errno
    if e.errno == errno.ENOSPC:
        return BertforgeError(f"disk full while writing {path}; free space or write to another disk")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return BertforgeError(f"permission denied writing {path}; choose a writable output location")
    return BertforgeError(f"cannot write {path} ({e.strerror}); check the path")


def owner_tag() -> str:
    """``HOST_PID_``: put into the names of temporary siblings so that a later process on this host can tell
    that their writer was killed (``kill -9``, power loss) and remove them (:func:`remove_stale_siblings`)."""
    host = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
    return f"{host}_{os.getpid()}_"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: a process of another user holds that pid
        return True
    return True


def remove_stale_siblings(path: Path) -> list:
    """Delete the temporaries ``.NAME.…HOST_PID_…`` beside ``path`` (staging dirs, half-written dirs,
    renamed-away old dirs) whose writer on this host is no longer running. Those of live processes and of
    other hosts (a shared filesystem) stay. Returns the removed paths."""
    path = Path(path)
    host = owner_tag().split("_")[0]
    pattern = re.compile(r"^\." + re.escape(path.name) + r"\.(?:staging-|old-)?" + re.escape(host) + r"_(\d+)_")
    removed = []
    if not path.parent.is_dir():
        return removed
    for sib in path.parent.iterdir():
        m = pattern.match(sib.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(sib, ignore_errors=True) if sib.is_dir() else sib.unlink(missing_ok=True)
            removed.append(sib)
    return removed


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; the result gets a normal file's mode
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise _explain(e, path) from None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def normal_file_mode(f: Path) -> None:
    """Give a file written 0600 (safetensors, ``mkstemp``) the mode the umask gives any new file."""
    mode = 0o666 & ~current_umask()
    f = Path(f)
    if f.is_file() and not f.is_symlink() and f.stat().st_mode & 0o777 == 0o600 and mode != 0o600:
        os.chmod(f, mode)


def move_files_into(src: Path, dst: Path) -> None:
    """Move every file of ``src`` into ``dst`` (each an atomic rename), with the umask's mode."""
    for f in Path(src).iterdir():
        normal_file_mode(f)
        f.replace(Path(dst) / f.name)


def staging_dir(path: Path, label: str = "", suffix: str = "") -> Path:
    """A new empty directory ``.NAME.<label>HOST_PID_xxxx<suffix>`` beside ``path``, with the mode the umask gives
    a new directory (``mkdtemp`` makes 0700); the writer's host and pid in its name let
    :func:`remove_stale_siblings` clear it away after a kill. Creates ``path``'s parent when missing.

    Raises:
        OSError: the parent cannot be created or written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{label}{owner_tag()}", suffix=suffix,
                                dir=path.parent))
    os.chmod(tmp, 0o777 & ~current_umask())
    return tmp


def swap_in(tmp: Path, path: Path) -> None:
    """Put the complete directory ``tmp`` at ``path`` (a sibling of it): the old ``path``, if any, is renamed
    away, ``tmp`` renamed into its place, then the old one deleted — at every moment one of the two is
    complete. Files written 0600 get the umask's mode (:func:`normal_file_mode`).

    Raises:
        OSError: a rename failed (``path`` is then the old directory again).
    """
    tmp, path = Path(tmp), Path(path)
    for f in tmp.rglob("*"):
        normal_file_mode(f)
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{owner_tag()}")
        os.replace(path, old)
    try:
        os.replace(tmp, path)
    except OSError:
        if old is not None:
            os.replace(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``path`` (the old one is removed
    only after the new one is complete). On any exception the temporary directory is deleted and
    ``path`` is untouched."""
    path = Path(path)
    try:
        remove_stale_siblings(path)
        tmp = staging_dir(path, suffix=".tmp")
    except OSError as e:
        raise _explain(e, path) from None
    try:
        yield tmp
        swap_in(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _explain(e, path) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


#: the files of a model dir that decide what a run computes or saves: config, tokenizer, weights
FINGERPRINT_GLOBS = ("config.json", "tokenizer*.json", "special_tokens_map.json", "vocab.*", "merges.txt",
                     "*.model", "*.safetensors", "*.bin")


def dir_fingerprint(d) -> dict:
    """``{"path": resolved dir, "sha256": hex}`` over the names and bytes of ``d``'s top-level
    :data:`FINGERPRINT_GLOBS` files (≈ 0.3 s for BERT-base's 440 MB), so that ``--resume`` can tell
    whether a run is continued from the same model dir it started from, even after the dir moved."""
    import hashlib
    d = Path(d).resolve()
    h = hashlib.sha256()
    files = sorted({f for g in FINGERPRINT_GLOBS for f in d.glob(g) if f.is_file()})
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return {"path": str(d), "sha256": h.hexdigest()}


def json_safe(obj):
    """``obj`` with every non-finite float (a metric of a constant prediction: NaN) as None (JSON null):
    ``NaN`` / ``Infinity`` are not JSON, and JSON readers other than Python's reject them."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) or (hasattr(obj, "dtype") and getattr(obj, "shape", None) == ()):
        try:
            f = float(obj)
        except (TypeError, ValueError):
            return obj
        return f if math.isfinite(f) else None
    return obj


def append_jsonl(path: Path, record: dict) -> None:
    """Append ``record`` as one JSON line (non-finite floats as null, see :func:`json_safe`)."""
    import json
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(json_safe(record), default=float, allow_nan=False) + "\n")
        f.flush()
