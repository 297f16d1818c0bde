"""Readers for labelled sentence (pair) data: GLUE TSV, generic CSV/TSV/JSONL, and hub datasets.

Every reader returns a list of :class:`Example` and raises :class:`~bertforge.errors.DataError`
naming the file (and line) and the fix for: a missing or empty file, non-UTF-8 bytes, missing columns,
a row with more or fewer fields than the header (or, without a header, than the file's other rows: a
stray tab or comma inside a text would otherwise shift or cut it), an empty or blank text, and labels outside the task's label set.

Each example carries an ``id``: its value in the task's id column (a column named ``id``, ``idx``, ``index``
or ``guid`` when the task names none; as the file writes it), else its 1-based line number (JSON arrays:
its 1-based position). A task's unlabelled test file laid out otherwise than its train/dev files (GLUE's
``test.tsv``: a header, an ``index``, no label; :class:`~bertforge.tasks.base.UnlabelledLayout`) is
recognised by its header row.
"""
from __future__ import annotations

import csv
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Union

from ..errors import DataError

csv.field_size_limit(sys.maxsize)


@dataclass
class Example:
    text_a: str
    text_b: Optional[str] = None
    label: Optional[Union[int, float]] = None  # class id or float target; None when unlabelled
    guid: Optional[str] = None  # "file:line"
    id: Optional[Union[str, int]] = None  # the row's id column (text as in the file), else its line number


#: column names taken as a row's id when the task names no id column (first found wins)
ID_COLUMNS = ("id", "idx", "index", "guid")


def _check_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"{path} does not exist; check the path")
    if path.is_dir():
        raise DataError(f"{path} is a directory; pass a data file (TSV, CSV or JSONL)")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty; pass a file with a header and data rows")


def split_lines(text: str) -> list:
    """``text`` cut at line ends (``\n``, ``\r\n``, ``\r``) only. ``str.splitlines`` also cuts at U+2028,
    U+0085, form feed and \x1c–\x1e, which may stand inside a field (JSON writes U+2028 raw)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _read_text(path: Path) -> str:
    _check_file(path)
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise DataError(f"{path} is not UTF-8 (bad byte at line {line}); re-encode it as UTF-8") from None


def read_examples(path, task, max_samples: Optional[int] = None, require_labels: bool = True) -> list:
    """Read ``path`` for ``task``; the format is chosen by suffix (.tsv, .csv, .jsonl/.json).

    Args:
        path: data file.
        task: the :class:`~bertforge.tasks.base.Task` (columns, labels).
        max_samples: keep only the first N examples.
        require_labels: raise when the label column is missing (False: read unlabelled test files).
    Raises:
        DataError: see module doc.
    """
    path = Path(path)
    if task.hub and not path.exists() and not path.suffix and "/" not in str(path).strip("./"):
        return read_hub(str(path), task, max_samples)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows, header = _read_jsonl(path), None
    else:
        rows, header, task = _read_delimited(path, "," if suffix == ".csv" else "\t", task, require_labels)
    return _rows_to_examples(rows, header, task, path, max_samples, require_labels)


def _unlabelled_task(task, path: Path, require_labels: bool):
    """``task`` reading its unlabelled test file (:class:`~bertforge.tasks.base.UnlabelledLayout`); a
    DataError where labels are needed."""
    lay = task.test_layout
    if require_labels:
        raise DataError(f"{path} is task {task.name}'s unlabelled test file (columns: {', '.join(lay.header)}); "
                        f"pass a labelled train/dev file here (predict reads test files)")
    return replace(task, text_columns=tuple(lay.text_columns), label_column=None, header=True,
                   id_column=lay.id_column)


def _check_field_counts(rows: list, header, path: Path, delim: str) -> None:
    """DataError at the first row with more or fewer fields than the header (without one: than most of
    the file's rows; a tie counts the fewer fields as right)."""
    if header is not None:
        want, where = len(header), "the header has"
    else:
        counts = Counter(len(r) for _, r in rows)
        want = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0]
        where = "the file's other rows have"
    for lineno, r in rows:
        if len(r) == want:
            continue
        if len(r) > want:
            fix = ("remove the stray tab (a tab inside a text splits it into fields)" if delim == "\t" else
                   'quote a text that holds a comma ("a, b") or remove the stray comma')
        else:
            fix = "fill in the missing fields (a line break inside a text cuts its row in two)"
        raise DataError(f"{path}:{lineno} has {len(r)} field{'s' if len(r) != 1 else ''} where {where} {want}; "
                        f"{fix}")


def _read_delimited(path: Path, delim: str, task, require_labels: bool = True):
    """(rows as (line number, cells), header or None, the task as it reads this file)."""
    text = _read_text(path)
    lines = split_lines(text)
    # GLUE TSVs contain bare quotes: read them with quoting disabled, like the GLUE reference code
    # (each line keeps its "\n": a quoted CSV field that spans lines keeps its line break)
    reader = csv.reader((ln + "\n" for ln in lines), delimiter=delim,
                        quoting=csv.QUOTE_NONE if delim == "\t" else csv.QUOTE_MINIMAL)
    rows = []
    while True:
        start = reader.line_num + 1  # a quoted CSV field may span lines: a row is named by its first
        try:
            r = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise DataError(f"{path}:{reader.line_num} cannot be read as {'CSV' if delim == ',' else 'TSV'} "
                            f"({e}); fix the row") from None
        if r and any(c.strip() for c in r):
            rows.append((start, r))
    if not rows:
        raise DataError(f"{path} has no rows; pass a non-empty file")
    if task.test_layout is not None and [c.strip() for c in rows[0][1]] == list(task.test_layout.header):
        task = _unlabelled_task(task, path, require_labels)
    header = None
    has_header = task.header
    if has_header is None:  # guess: a header row names (some of) the columns the task asks for; a missing
        # one is then reported against the header's names rather than as "no header row"
        want = [c for c in (*task.text_columns, task.label_column) if isinstance(c, str)]
        has_header = any(w in [c.strip() for c in rows[0][1]] for w in want)
    if has_header:
        header, rows = [c.strip() for c in rows[0][1]], rows[1:]
        if not rows:
            raise DataError(f"{path} has a header but no data rows; add examples")
    _check_field_counts(rows, header, path, delim)
    return rows, header, task


def _read_jsonl(path: Path):
    text = _read_text(path)
    out = []
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); fix the file") from None
        if not isinstance(data, list):
            raise DataError(f"{path} holds a JSON {type(data).__name__}, not a list of objects; write one JSON "
                            f"object per example")
        out = [(i + 1, r) for i, r in enumerate(data)]
    else:
        for i, line in enumerate(split_lines(text), 1):
            if not line.strip():
                continue
            try:
                out.append((i, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{i} is not valid JSON ({e.msg}); write one JSON object per line") from None
    if not out:
        raise DataError(f"{path} has no JSON lines; pass a non-empty file")
    kind = list if isinstance(out[0][1], list) else dict  # positional rows, or objects of named fields
    for i, row in out:
        if not isinstance(row, kind):
            what = "an object" if kind is dict else "a list (positional columns, as row 1)"
            raise DataError(f"{path}:{i} is a JSON {type(row).__name__}, not {what}; write one object of "
                            f'named fields per example, e.g. {{"sentence": "...", "label": "1"}}')
    return out


def _col_index(col, header, path: Path, task):
    if isinstance(col, int):
        return col
    if header is None:
        raise DataError(f"{path} has no header row but task {task.name} names column {col!r}; add a "
                        f"header or give positional columns (data.text_columns=[0,1])")
    if col not in header:
        other = "," if path.suffix.lower() == ".tsv" else "\t"
        hint = (f"; its header looks {'comma' if other == ',' else 'tab'}-separated: name the file "
                f"{'.csv' if other == ',' else '.tsv'}") if len(header) == 1 and other in header[0] else ""
        raise DataError(f"{path} has no column {col!r} (columns: {', '.join(header)}); task {task.name} "
                        f"expects {', '.join(str(c) for c in (*task.text_columns, task.label_column))}{hint}")
    return header.index(col)


def _id_column(task, names) -> Optional[Union[str, int]]:
    """The task's id column if ``names`` (a header, or a JSON object's keys) hold it, else the first of
    :data:`ID_COLUMNS` there; None when there is none."""
    if task.id_column is not None:
        return task.id_column if isinstance(task.id_column, int) or task.id_column in names else None
    return next((c for c in ID_COLUMNS if c in names), None)


def _rows_to_examples(rows, header, task, path: Path, max_samples, require_labels) -> list:
    is_json = bool(rows) and isinstance(rows[0][1], dict)
    label_map = {lab: i for i, lab in enumerate(task.labels)} if task.labels else None
    out = []
    id_idx = None
    if not is_json:
        id_col = _id_column(task, header or ())
        id_idx = id_col if isinstance(id_col, int) else (header.index(id_col) if id_col is not None else None)
        text_idx = [_col_index(c, header, path, task) for c in task.text_columns]
        label_idx = None
        if task.label_column is not None:
            try:
                label_idx = _col_index(task.label_column, header, path, task)
            except DataError:
                if require_labels:
                    raise
    for lineno, row in rows:
        if max_samples is not None and len(out) >= max_samples:
            break
        if is_json:
            missing = [c for c in task.text_columns if str(c) not in row]
            if missing:
                raise DataError(f"{path}:{lineno} has no field {missing[0]!r}; task {task.name} expects "
                                f"fields {', '.join(map(str, task.text_columns))}")
            bad = next((c for c in task.text_columns if row[str(c)] is None or isinstance(row[str(c)], (dict, list))), None)
            if bad is not None:
                raise DataError(f"{path}:{lineno} field {str(bad)!r} is {json.dumps(row[str(bad)])[:40]}, not "
                                f"text; give the example's text")
            texts = [str(row[str(c)]) for c in task.text_columns]
            raw_label = row.get(str(task.label_column)) if task.label_column is not None else None
            if raw_label is None and require_labels:
                raise DataError(f"{path}:{lineno} has no label field {task.label_column!r}; add it")
            id_key = _id_column(task, row)
            row_id = row.get(id_key) if id_key is not None else None
            if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
                row_id = lineno  # no id, or one that is not a string or an integer
        else:
            # an unlabelled file (require_labels False: predict) may stop after the text columns
            need = max(text_idx + ([label_idx] if label_idx is not None and require_labels else []))
            if len(row) <= need:
                raise DataError(f"{path}:{lineno} has {len(row)} columns but task {task.name} needs "
                                f"column {need + 1}; check the delimiter and the file layout")
            texts = [row[i] for i in text_idx]
            raw_label = row[label_idx] if label_idx is not None and label_idx < len(row) else None
            row_id = row[id_idx].strip() if id_idx is not None and id_idx < len(row) else lineno
        blank = next((c for c, t in zip(task.text_columns, texts) if not t.strip()), None)
        if blank is not None:  # as `embed` and the server refuse it: a model given no text answers its bias
            raise DataError(f"{path}:{lineno} has an empty text in column {str(blank)!r}; give the example's "
                            f"text or remove the row")
        label = None
        if raw_label is not None:
            label = _parse_label(raw_label, task, label_map, path, lineno)
        out.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label, f"{path.name}:{lineno}",
                           row_id))
    if not out:
        raise DataError(f"{path} has no examples; pass a non-empty file")
    return out


#: the task kind whose label field is a list of labels (:mod:`bertforge.tasks.multilabel`)
MULTI_LABEL = "multi_label_classification"


def _parse_label_set(raw, task, label_map, path: Path, lineno: int) -> tuple:
    """A multi-label field → the sorted tuple of its label ids. ``raw``: a JSON list (a JSONL value, or a
    cell written ``[3, 12]`` / ``["anger", "fear"]``) or comma-separated ids or names (``3,12``). DataError
    (``file:line``) for a label outside the set, a label repeated in the row, an empty field where the task
    needs at least one label (``allow_empty_labels`` False)."""
    if isinstance(raw, (list, tuple)):
        items = list(raw)
    else:
        text = str(raw).strip()
        items = None
        if text.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError:
                items = None
            if not isinstance(items, list):
                raise DataError(f"{path}:{lineno} label field {text[:40]!r} is not a JSON list; write it as "
                                f"[3, 12] or 3,12")
        if items is None:
            items = [x for x in (p.strip() for p in text.split(","))] if text else []
            if any(x == "" for x in items):
                raise DataError(f"{path}:{lineno} label field {text[:40]!r} has an empty entry between commas; "
                                f"write labels as 3,12")
    if not items and not getattr(task, "allow_empty_labels", False):
        raise DataError(f"{path}:{lineno} has an empty label field; task {task.name} needs at least one label "
                        f"per row (set data.allow_empty_labels=true if rows may carry none)")
    ids = []
    for x in items:
        if isinstance(x, (dict, list)) or x is None:
            raise DataError(f"{path}:{lineno} label {json.dumps(x)[:40]} is not a label id or name; fix the row")
        j = _label_id(x, task, label_map, path, lineno)
        if j in ids:
            raise DataError(f"{path}:{lineno} repeats label {task.labels[j]!r} in one row; give each label once")
        ids.append(j)
    return tuple(sorted(ids))


def _parse_label(raw, task, label_map, path: Path, lineno: int):
    if task.kind == MULTI_LABEL:
        return _parse_label_set(raw, task, label_map, path, lineno)
    if task.kind == "regression":
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise DataError(f"{path}:{lineno} label {raw!r} is not a number; task {task.name} is a "
                            f"regression task") from None
        if not math.isfinite(value):  # float() reads "nan" and "inf"; training would diverge on them
            raise DataError(f"{path}:{lineno} label {raw!r} is not a finite number; fix the row (task "
                            f"{task.name} is a regression task)")
        lo, hi = task.label_range or (-math.inf, math.inf)
        if not lo <= value <= hi:
            raise DataError(f"{path}:{lineno} score {raw!r} is outside task {task.name}'s scale [{lo:g}, {hi:g}]; "
                            f"fix the row")
        return value
    return _label_id(raw, task, label_map, path, lineno)


def _label_id(raw, task, label_map, path: Path, lineno: int) -> int:
    """One label (its name, or an id for a label set of names) → its id; DataError outside the set."""
    key = str(raw).strip()
    if isinstance(raw, bool):
        key = str(int(raw))
    if key not in label_map:
        # tolerate "1.0"-style integers and integer ids for string label sets
        try:
            f = float(key)
            if f.is_integer() and str(int(f)) in label_map:
                return label_map[str(int(f))]
            if f.is_integer() and 0 <= int(f) < len(task.labels) and not task.labels[0].isdigit():
                return int(f)
        except ValueError:
            pass
        hint = " (or, fine-tuning a custom task, give its label set: data.labels=[...])" if task.name == "custom" else ""
        raise DataError(f"{path}:{lineno} label {key!r} is not in task {task.name}'s label set "
                        f"{list(task.labels)}; fix the row{hint}")
    return label_map[key]


def _hub_label_ids(ds, column: str, task) -> Optional[list]:
    """Hub class id → the task's label id, when the dataset's ``ClassLabel`` names are the task's label
    names in another order (GLUE MNLI on the hub: entailment, neutral, contradiction; the task and the GLUE
    TSVs: contradiction, entailment, neutral). None when the ids already agree or carry no names."""
    names = getattr(getattr(ds, "features", {}).get(column), "names", None)
    if task.kind != "classification" or not names or list(names) == list(task.labels):
        return None
    if sorted(names) != sorted(task.labels):
        return None  # ids without matching names (e.g. SST-2's negative/positive for labels 0/1)
    return [list(task.labels).index(n) for n in names]


def read_hub(name: str, task, max_samples: Optional[int] = None, split: str = "train") -> list:
    """Read a Hugging Face hub dataset (``datasets.load_dataset``), e.g. ``glue/sst2:validation``.

    Needs network access (or a local ``datasets`` cache). Raises DataError when it cannot be loaded.
    """
    try:
        import datasets
    except ImportError:  # pragma: no cover
        raise DataError("reading hub datasets needs the `datasets` package; pip install datasets") from None
    spec, _, sp = name.partition(":")
    parts = spec.split("/")
    ds_name, cfg = (parts[0], parts[1]) if len(parts) == 2 else (spec, None)
    if task.hub and ds_name == task.hub[0] and cfg is None:
        cfg = task.hub[1]
    import logging
    datasets.logging.set_verbosity_error()
    for lib in ("urllib3", "huggingface_hub", "fsspec", "filelock"):  # retries must not spill onto stderr
        logging.getLogger(lib).setLevel(logging.ERROR)
    try:
        ds = datasets.load_dataset(ds_name, cfg, split=sp or split)
    except Exception as e:
        raise DataError(f"cannot load hub dataset {name!r} ({str(e).splitlines()[0]}); check the name "
                        f"or pass a local file") from None
    cols = task.hub_columns or (*task.text_columns, task.label_column)
    remap = _hub_label_ids(ds, cols[-1], task)
    out = []
    for i, row in enumerate(ds):
        if max_samples is not None and i >= max_samples:
            break
        texts = [row[c] for c in cols[:-1]]
        lab = row.get(cols[-1])
        if lab is not None and task.kind == "classification" and isinstance(lab, int) and lab < 0:
            lab = None  # GLUE test split
        elif lab is not None and remap is not None:
            lab = remap[lab]
        row_id = next((row[c] for c in ID_COLUMNS if isinstance(row.get(c), (str, int))), i + 1)
        out.append(Example(texts[0], texts[1] if len(texts) > 1 else None,
                           float(lab) if task.kind == "regression" and lab is not None else lab, str(i), row_id))
    return out
