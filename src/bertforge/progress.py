"""Progress of long loops, for a person at a terminal and for a log file alike.

:class:`Progress` is the one progress display of bertforge's long loops (the Trainer's steps, and so QAT and
distillation with their teacher cache; ``embed``'s shards; the static-embedding vocabulary pass; the latency and
quality rounds of ``embed-eval``). When stderr is a terminal (or a notebook) and progress is on, it is a tqdm bar.
Otherwise — stderr redirected to a file or a pipe, ``--no-progress``, ``impl.progress=false`` or
``$BERTFORGE_NO_PROGRESS`` — it writes a plain line to stderr every ``$BERTFORGE_PROGRESS_EVERY`` seconds
(default :data:`DEFAULT_EVERY`, 30), with what is done out of the total, the rate, the time spent and the time
left (ETA, from the mean rate so far), and one line at the end when it wrote any before, e.g.::

    bertforge train: step 120 of 300 (40%), 1.52 s/step, 3m02s elapsed, ETA 4m34s, loss 0.0123
    bertforge train: step 300 of 300 (100%), 1.50 s/step, 7m30s elapsed, done

A loop shorter than the interval writes nothing, as before. ``$BERTFORGE_PROGRESS_EVERY=0`` writes a line at
every update (tests); the lines are written between updates, so one update that takes long (a single huge
step) shows only when it ends.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Optional

#: seconds between two plain progress lines when ``$BERTFORGE_PROGRESS_EVERY`` is not set
DEFAULT_EVERY = 30.0
#: the environment variable that sets the interval (seconds, a float ≥ 0)
EVERY_ENV = "BERTFORGE_PROGRESS_EVERY"


_warned: set = set()


def progress_every() -> float:
    """Seconds between plain progress lines: ``$BERTFORGE_PROGRESS_EVERY`` or :data:`DEFAULT_EVERY` (unset or
    empty gives the default; a value that is not a number of seconds ≥ 0 gives it too, with one warning line on
    stderr naming the variable)."""
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return DEFAULT_EVERY
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if v >= 0:
        return v
    if raw not in _warned:
        _warned.add(raw)
        print(f"bertforge: warning: ${EVERY_ENV}={raw!r} is not a number of seconds ≥ 0; progress lines come "
              f"every {DEFAULT_EVERY:g} s", file=sys.stderr, flush=True)
    return DEFAULT_EVERY


def _is_terminal(stream) -> bool:
    if stream is sys.stderr and "ipykernel" in sys.modules:  # a notebook: tqdm.auto draws a widget there
        return True
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or file-like stream without isatty
        return False


def fmt_duration(seconds: float) -> str:
    """``42s``, ``4m34s``, ``2h05m`` (``0.4s`` below ten seconds)."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_rate(done: float, seconds: float, unit: str) -> str:
    """``3.20 steps/s`` at a rate of at least one per second, else ``1.52 s/step``."""
    if done <= 0 or seconds <= 0:
        return f"? s/{unit}"
    r = done / seconds
    return f"{r:.2f} {unit}s/s" if r >= 1 else f"{1 / r:.2f} s/{unit}"


class Progress:
    """A progress display of ``total`` units (``None``: unknown) named ``name`` (``"train"``: lines read
    ``bertforge train: …``); ``initial`` units are done already (a resumed run: the rate counts only what this
    run does). ``show``: the caller's progress setting (a bar only when it is on and stderr is a terminal);
    ``quiet``: nothing at all (the ranks other than 0). ``every``: seconds between plain lines (default
    :func:`progress_every`); ``stream``: default ``sys.stderr`` when the display is made.

    The tqdm subset the loops use: :meth:`update`, :meth:`set_postfix`, :meth:`close`, a context manager."""

    def __init__(self, total: Optional[int], name: str, unit: str = "step", initial: int = 0, show: bool = True,
                 quiet: bool = False, every: Optional[float] = None, stream=None):
        self.total, self.name, self.unit = total, name, unit
        self.n = self.initial = int(initial)
        self.stream = stream if stream is not None else sys.stderr
        self.every = progress_every() if every is None else float(every)
        self.quiet = quiet
        self.postfix: dict = {}
        self.lines = 0  # plain lines written
        self.closed = False
        self.t0 = self.last = time.perf_counter()
        self.bar = None
        if not quiet and show and not os.environ.get("BERTFORGE_NO_PROGRESS") and _is_terminal(self.stream):
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=name, unit=unit, dynamic_ncols=True,
                            file=self.stream)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        """``n`` more units done; a plain line when the interval has passed since the last one."""
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif not self.quiet and not (self.total and self.n >= self.total):  # the last one: close() says it
            now = time.perf_counter()
            if now - self.last >= self.every:
                self.last = now
                self._line(now, final=False)

    def set_total(self, total: Optional[int]) -> None:
        """A new total (work found done already, a run cut short)."""
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def set_postfix(self, **kw) -> None:
        """Figures shown after the counts (the bar's postfix; ``, key value`` on a plain line)."""
        self.postfix = kw
        if self.bar is not None:
            self.bar.set_postfix(**kw)

    def close(self) -> None:
        """Close the bar, or write the final plain line when any line was written before."""
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        elif not self.quiet and self.lines:
            self._line(time.perf_counter(), final=True)

    def line(self, now: Optional[float] = None, final: bool = False) -> str:
        """The plain progress line (without the newline)."""
        now = time.perf_counter() if now is None else now
        dt, done = now - self.t0, self.n - self.initial
        if self.total:
            head = f"{self.unit} {self.n} of {self.total} ({100 * self.n / self.total:.0f}%)"
        else:
            head = f"{self.n} {self.unit}s"
        parts = [head, fmt_rate(done, dt, self.unit), f"{fmt_duration(dt)} elapsed"]
        if final:
            parts.append("done" if self.total is None or self.n >= self.total else "stopped")
        elif self.total and done > 0:
            parts.append(f"ETA {fmt_duration(max(0, self.total - self.n) * dt / done)}")
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        return f"bertforge {self.name}: " + ", ".join(parts)

    def _line(self, now: float, final: bool) -> None:
        self.lines += 1
        try:
            print(self.line(now, final), file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed or broken stream: progress is never worth a crash
            pass


def track(iterable: Iterable, name: str, total: Optional[int] = None, unit: str = "item", show: bool = True,
          quiet: bool = False):
    """Yield the items of ``iterable`` under a :class:`Progress` (``total``: default ``len(iterable)``), one
    unit per item."""
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with Progress(total, name, unit=unit, show=show, quiet=quiet) as p:
        for x in iterable:
            yield x
            p.update(1)
