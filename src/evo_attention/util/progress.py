"""Terminal progress: a live bar when stderr is a terminal, plain log lines otherwise.

``training_bar`` follows one training run (steps, loss); ``SearchView`` follows a search
(generation, individual, step, loss, best so far, ETA). Both stay quiet with ``enabled=False``
and fall back to a line per finished evaluation when output is not a TTY (logs, CI, nohup).

Progress output is best-effort: when its reader goes away (a closed pipe such as ``| head -1``, a
closed terminal) the rest goes to /dev/null and the work goes on (``best_effort``). Warnings show
as one line each (``user_warnings``: ``evo-attention: warning: ...``, no source path).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from evo_attention.util.format import number


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich exits the program when its reader goes away; here the output stops, the work goes on."""
        output_gone()


console = _Console(stderr=True, highlight=False)


def is_interactive() -> bool:
    try:
        return sys.stderr.isatty()
    except (OSError, ValueError):  # closed
        return False


def output_gone() -> None:
    """The reader of our stderr went away (a closed pipe, a closed terminal): the rest of the output
    goes to /dev/null, so no later write fails and the work goes on (progress is best-effort)."""
    devnull = open(os.devnull, "w")
    try:
        if sys.stderr is sys.__stderr__ and sys.stderr is not None:
            os.dup2(devnull.fileno(), sys.stderr.fileno())  # the process's own stderr: every writer of it
            devnull.close()
            return
    except (OSError, ValueError, AttributeError):
        pass
    sys.stderr = devnull


@contextmanager
def best_effort():
    """Run progress output; a write that fails (EPIPE, EIO, a closed file) silences the rest."""
    try:
        yield
    except OSError:
        output_gone()
    except ValueError as exc:
        if "closed file" not in str(exc):  # only "I/O operation on closed file" is the reader gone
            raise
        output_gone()


def warning_line(message, prefix: str = "evo-attention") -> str:
    """A warning as users see it: one line, ``evo-attention: warning: ...``, no source path."""
    return f"{prefix}: warning: {' '.join(str(message).split())}"


def format_warning(message, category=None, filename=None, lineno=None, line=None) -> str:
    """``warnings.formatwarning`` for users: one ``warning_line``, no source path or line."""
    return warning_line(message) + "\n"


@contextmanager
def user_warnings():
    """Within: every warning shown prints as one ``warning_line`` on stderr (never Python's
    ``file:line: UserWarning`` form with a source line). Python's own writer ignores a stderr that
    is gone; code that records warnings (``catch_warnings(record=True)``) still gets them."""
    with warnings.catch_warnings():
        warnings.formatwarning = format_warning
        yield


def log(message: str, quiet: bool = False) -> None:
    """A line of progress on stderr (best-effort: a closed pipe or terminal never stops the work)."""
    if not quiet:
        with best_effort():
            console.print(message, markup=False, soft_wrap=True)


@contextmanager
def training_bar(description: str, total: int, enabled: bool = True):
    """Yield a progress callback (step, total, loss) for one training run."""
    if not enabled or not is_interactive():
        yield None
        return
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total, loss="-")

        def update(step: int, total_steps: int, loss: float) -> None:
            with best_effort():
                bar.update(task, completed=step, total=total_steps, loss=number(loss, ".3f"))

        yield update


def search_columns(width: int = 80) -> list:
    """The columns of a search's bars on a terminal ``width`` columns wide (80 at least counts): the
    count, a short bar and the ETA keep their width; the description and the info (best so far,
    loss) share what is left (3 : 2) and are cut with an ellipsis."""
    def text(template: str, width: int) -> TextColumn:
        return TextColumn(template, markup=False,
                          table_column=Column(max_width=width, no_wrap=True, overflow="ellipsis"))

    free = max(20, width - 33)  # 9 (count) + 10 (bar) + 9 (ETA) + 5 spaces
    return [text("{task.description}", free * 3 // 5), MofNCompleteColumn(), BarColumn(bar_width=10),
            TextColumn("{task.fields[eta]}", markup=False), text("{task.fields[info]}", free * 2 // 5)]


class SearchView:
    """Live view of a search: one bar for the evaluations, one per worker for its training run.

    ``worker`` names who trains (``"local"``, ``"w0"``, ``"ray:host:pid"``); each worker gets its
    own line while it trains (one line for callers that give no worker). The ETA counts only the
    evaluations that trained here (a replay from the store is instant and says nothing of speed).
    The live bars vanish when the view closes (one summary line stays), so an interruption (Ctrl-C)
    leaves no half-drawn bar behind. ``console`` (default stderr's) is where it draws.
    """

    def __init__(self, planned: int, enabled: bool = True, console: Console | None = None):
        self.console = console or globals()["console"]
        self.enabled = enabled
        self.live = enabled and (self.console.is_terminal if console is not None else is_interactive())
        self.planned = planned
        self.best: tuple[str, float] | None = None
        self._progress = None
        self._workers: dict[str, int] = {}  # worker -> its bar
        self._start = time.monotonic()
        self._done = 0
        self._trained = 0  # evaluations finished by a training (not a replay from the store)
        self._first_start: float | None = None

    def __enter__(self):
        with best_effort():
            if self.live:
                self._progress = Progress(*search_columns(self.console.width), console=self.console, transient=True)
                self._progress.__enter__()
                self._search = self._progress.add_task("search", total=self.planned, info="", eta="ETA -")
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._progress is not None:
            with best_effort():
                for bar in self._workers.values():
                    self._progress.update(bar, visible=False)
                self._progress.__exit__(exc_type, exc, tb)
                elapsed = time.monotonic() - self._start
                what = "interrupted at" if exc_type is KeyboardInterrupt else "search:"
                self.console.print(f"{what} {self._done}/{self.planned} evaluations in {elapsed:.0f}s"
                                   + (f", {self._best_text()}" if self.best else ""), markup=False)
        return False

    def eta_text(self) -> str:
        """``ETA 3m20s`` from the evaluations trained so far (cached ones excluded), ``ETA -`` before one."""
        left = max(0, self.planned - self._done)
        if left == 0:
            return "ETA 0s"
        if not self._trained or self._first_start is None:
            return "ETA -"
        seconds = (time.monotonic() - self._first_start) / self._trained * left
        minutes, seconds = divmod(int(seconds), 60)
        hours, minutes = divmod(minutes, 60)
        return "ETA " + (f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s")

    def set_best(self, gene: str, perplexity: float) -> None:
        self.best = (gene, perplexity)

    def _best_text(self) -> str:
        return "" if self.best is None else f"best {number(self.best[1], '.3f')} {self.best[0]}"

    def _bar(self, worker: str | None) -> int:
        name = worker or ""
        if name not in self._workers:
            self._workers[name] = self._progress.add_task("training", total=1, info="", eta="", visible=False)
        return self._workers[name]

    def start(self, label: str, gene: str, total_steps: int, worker: str | None = None) -> None:
        if self._first_start is None:
            self._first_start = time.monotonic()
        with best_effort():
            if self._progress is not None:
                prefix = f"[{worker}] " if worker and worker != "local" else ""
                self._progress.update(self._bar(worker), description=f"{prefix}{label} {gene}", completed=0,
                                      total=total_steps, info="", eta="", visible=True)
                self._progress.update(self._search, info=self._best_text())

    def step(self, step: int, total: int, loss: float, worker: str | None = None) -> None:
        with best_effort():
            if self._progress is not None:
                self._progress.update(self._bar(worker), completed=step, total=total,
                                      info=f"loss {number(loss, '.3f')}")

    def extend(self, more: int) -> None:
        """Trainings the plan could not foresee (racing re-measures a would-be elite): the plan grows."""
        self.planned += more
        with best_effort():
            if self._progress is not None:
                self._progress.update(self._search, total=self.planned)

    def refused(self, label: str, gene: str, reason: str) -> None:
        """A planned evaluation that will not run (a gene refused before training): the plan
        shrinks by one, so the counter ends at its total, and the refusal is printed."""
        self.planned = max(0, self.planned - 1)
        with best_effort():
            line = f"{label} {gene} refused: {reason}"
            if self._progress is not None:
                self._progress.update(self._search, total=self.planned)
                self._progress.console.print(line, markup=False)
            elif self.enabled:
                log(f"[{self.planned} planned {time.monotonic() - self._start:.0f}s] {line}")

    def finished(self, label: str, gene: str, record: dict, cached: bool, done: int, worker: str | None = None) -> None:
        self._done = min(done, self.planned)
        if not cached:
            self._trained += 1
        with best_effort():
            status = record.get("status")
            result = f"ppl {number(record.get('val_perplexity'), '.3f')}" if status == "ok" \
                else f"{status}: {record.get('error') or ''}"
            budget = record.get("budget")
            steps = f" at {record.get('steps')}/{budget} steps" if budget and record.get("steps") != budget else ""
            where = f" [{worker}]" if worker and worker != "local" else ""
            twin = record.get("equivalent_to") if cached else None
            how = f" (equivalent to {twin}: not trained)" if twin else (" (cached)" if cached else "")
            line = f"{label} {gene} {result}{steps}{how}{where}"
            if self._progress is not None:
                if (worker or "") in self._workers and not cached:
                    self._progress.update(self._workers[worker or ""], visible=False)
                self._progress.update(self._search, completed=min(done, self.planned), info=self._best_text(),
                                      eta=self.eta_text())
                self._progress.console.print(line, markup=False)
            elif self.enabled:
                elapsed = time.monotonic() - self._start
                log(f"[{done}/{self.planned} {elapsed:.0f}s {self.eta_text()}] {line}")
