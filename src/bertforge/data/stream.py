"""Text records read lazily from files larger than memory, cut into shards that can be read independently.

Two formats, chosen by extension:

* ``.txt`` — one text per line; the id is the line number (1-based; ``NAME:LINE`` when several files are
  given, so ids stay unique);
* ``.jsonl`` — one JSON object per line with ``text`` (and optionally ``title``, prepended with a space, as
  BEIR corpora are embedded) and an id in ``id`` or ``_id`` (kept as given, string or number).

:func:`plan_shards` reads every file once, line by line (memory: one line at a time plus one entry per
shard, and 8 bytes per record to refuse a repeated id), checks each record and returns where each shard of ``shard_size`` records starts (file, byte
offset, line). :func:`read_shard` then seeks there and yields exactly that shard's ``(id, text)`` pairs, so
any process (a ``torchrun`` rank, a resumed run) reads only its own shards. An empty text, an unreadable
file, bad UTF-8 or JSON, a record without text / id, or an id given twice is a one-line :class:`~bertforge.errors.DataError`
naming ``FILE:LINE``.
"""
from __future__ import annotations

import hashlib
import json
from array import array
from pathlib import Path
from typing import Iterator

from ..errors import DataError

#: the input formats by file extension
FORMATS = {".txt": "txt", ".jsonl": "jsonl"}


def input_format(path) -> str:
    """``txt`` or ``jsonl`` by extension; DataError for anything else."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise DataError(f"--input {path}: unknown format; pass a .txt file (one text per line) or a .jsonl "
                        f"file (one {{\"id\": …, \"text\": …}} object per line)")
    return fmt


def check_inputs(paths) -> list:
    """The input paths as ``Path``s, each an existing readable file of a known format (DataError if not)."""
    out = []
    for p in paths:
        p = Path(p)
        input_format(p)
        if not p.is_file():
            raise DataError(f"--input {p} does not exist or is not a file; pass a .txt or .jsonl file")
        try:
            with open(p, "rb") as f:
                f.read(1)
        except OSError as e:
            raise DataError(f"--input {p} cannot be read ({e.strerror}); check its permissions") from None
        out.append(p)
    return out


def parse_line(raw: bytes, fmt: str, path: Path, lineno: int, multi: bool):
    """One line → ``(id, text)``; DataError (naming ``path:lineno``) for an empty or malformed record."""
    try:
        line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise DataError(f"{path}:{lineno}: not UTF-8 text; re-encode the file as UTF-8") from None
    if fmt == "txt":
        if not line.strip():
            raise DataError(f"{path}:{lineno}: empty text; remove empty lines (each line is one text to embed)")
        return (f"{path.name}:{lineno}" if multi else lineno), line
    try:
        rec = json.loads(line)
    except ValueError:
        raise DataError(f"{path}:{lineno}: not a JSON object; each line of a .jsonl input is "
                        f"{{\"id\": …, \"text\": …}}") from None
    if not isinstance(rec, dict):
        raise DataError(f"{path}:{lineno}: not a JSON object; each line of a .jsonl input is "
                        f"{{\"id\": …, \"text\": …}}")
    rid = rec.get("id", rec.get("_id"))
    if rid is None or isinstance(rid, (dict, list)):
        raise DataError(f"{path}:{lineno}: no \"id\" (or \"_id\") string or number; give every record an id")
    text = rec.get("text")
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{path}:{lineno}: empty text for id {rid!r}; give every record a non-empty \"text\"")
    title = rec.get("title")
    if isinstance(title, str) and title.strip():
        text = f"{title} {text}"
    return rid, text


def _lines(path: Path, offset: int = 0, lineno: int = 1) -> Iterator[tuple]:
    """``(byte offset, line number, raw line)`` from ``offset`` on; a final line without newline counts, an
    empty file or a lone trailing newline gives no record."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"--input {path} cannot be read ({e.strerror}); check its permissions") from None
    with f:
        f.seek(offset)
        pos = offset
        for raw in f:
            yield pos, lineno, raw
            pos += len(raw)
            lineno += 1


def plan_shards(paths, shard_size: int) -> dict:
    """Read every record of ``paths`` once (checking it) and cut them into shards of ``shard_size``.

    Returns ``{"records": N, "shards": [{"index", "start", "count", "file", "offset", "line"}, …]}`` —
    ``start`` the shard's first record (0-based over all files), ``file`` the index into ``paths`` where it
    starts, ``offset`` / ``line`` its byte offset and line number there. Raises DataError for a bad record
    or an input without any."""
    if shard_size < 1:
        raise DataError(f"--shard-size {shard_size}: pass a positive number of records per shard")
    paths = [Path(p) for p in paths]
    multi = len(paths) > 1
    shards: list = []
    n = 0
    digests = array("q")  # 8 bytes per record: the ids' hashes, checked for repeats after the pass
    for fi, path in enumerate(paths):
        fmt = input_format(path)
        for pos, lineno, raw in _lines(path):
            rid, _ = parse_line(raw, fmt, path, lineno, multi)
            digests.append(_id_digest(rid))
            if n % shard_size == 0:
                shards.append({"index": len(shards), "start": n, "count": 0, "file": fi, "offset": pos,
                               "line": lineno})
            shards[-1]["count"] += 1
            n += 1
    if n == 0:
        raise DataError(f"--input {', '.join(map(str, paths))} holds no text; pass files with one text per line")
    _refuse_repeated_ids(paths, digests)
    return {"records": n, "shards": shards}


def _id_digest(rid) -> int:
    """A signed 64-bit hash of a record id as text (``1`` and ``"1"`` are one id: both are written as 1)."""
    return int.from_bytes(hashlib.blake2b(str(rid).encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def _refuse_repeated_ids(paths: list, digests) -> None:
    """DataError naming the first repeated id and both places, when two records of ``paths`` share an id (a
    vector per id: the second would silently stand for the first). ``digests``: :func:`_id_digest` of every
    record in order; only when two digests agree are the files read again to compare the ids themselves."""
    import numpy as np
    h = np.sort(np.frombuffer(digests, dtype=np.int64)) if len(digests) else np.zeros(0, np.int64)
    twice = set(h[1:][h[1:] == h[:-1]].tolist())
    if not twice:
        return
    multi, seen = len(paths) > 1, {}
    for path in paths:
        fmt = input_format(path)
        for _, lineno, raw in _lines(path):
            rid, _ = parse_line(raw, fmt, path, lineno, multi)
            if _id_digest(rid) not in twice:
                continue
            key = str(rid)
            if key in seen:
                hint = ("give each input file a distinct name (ids are NAME:LINE)" if fmt == "txt"
                        else "give every record its own id")
                raise DataError(f"{path}:{lineno} repeats id {rid!r} (first at {seen[key]}); {hint}")
            seen[key] = f"{path}:{lineno}"


def read_shard(paths, shard: dict) -> Iterator[tuple]:
    """The ``(id, text)`` records of one shard of :func:`plan_shards`, read from its start on."""
    paths = [Path(p) for p in paths]
    multi = len(paths) > 1
    left = shard["count"]
    fi, offset, lineno = shard["file"], shard["offset"], shard["line"]
    while left > 0 and fi < len(paths):
        fmt = input_format(paths[fi])
        for _, ln, raw in _lines(paths[fi], offset, lineno):
            yield parse_line(raw, fmt, paths[fi], ln, multi)
            left -= 1
            if left == 0:
                return
        fi, offset, lineno = fi + 1, 0, 1
    if left:
        raise DataError(f"{paths[min(fi, len(paths) - 1)]} changed while it was read (shard {shard['index']} "
                        f"ends early); re-run on unchanged inputs")


__all__ = ["FORMATS", "input_format", "check_inputs", "parse_line", "plan_shards", "read_shard"]
