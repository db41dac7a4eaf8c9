"""``Evolution``: the original EvoAttention project's Python API, a search that writes its report.

    evolution = Evolution(config, train_loader, eval_loader)   # or data=..., out_dir=...
    best = evolution.run()                                     # the search, then every report file
    # it prints its run directory, a line per trial and where the report is (quiet=True: nothing)
    evolution.population[0].perplexity; evolution.history
    evolution.save_results("results"); evolution.plot_history("results/evolution.png")

The search itself is ``search.driver.Search``; this adds what needs the report layer.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import warnings
from pathlib import Path

from evo_attention.data import LoaderData
from evo_attention.data.base import TaskData
from evo_attention.report import load_run, write_report
from evo_attention.report.attachments import CHECK_PENDING
from evo_attention.search.driver import Search
from evo_attention.search.executors import Executor
from evo_attention.studies.fresh_check import DEFAULT_TOP, fresh_check
from evo_attention.train.config import Config
from evo_attention.util.errors import UserError
from evo_attention.util.files import InTheWay
from evo_attention.util.progress import log
from evo_attention.util.threads import turned_off

CHECK_ENV = "EVO_ATTENTION_FRESH_CHECK"
CHECK_META = "fresh_check_top"  # the store's meta: how many top genes the run's fresh-seed check trains (0: none)


def end_of_run_lines(run_dir: str | Path, *, kept: int = 0, suite: bool = False) -> list[str]:
    """What a finished search says last: where its report is, and the commands that come next."""
    run_dir = Path(run_dir)
    run, hf, journal = (shlex.quote(str(path)) for path in (run_dir, run_dir / "hf", run_dir / "optuna.log"))
    export = (f"next: evo-attention export --from-run {run} --rank 1 --format hf --out {hf}"
              "   # the best kept model for transformers" if kept else
              "next: search with --keep-models K to keep the best models for evo-attention export")
    return [f"report: {run_dir / 'report.html'} (and report.md, final_results.json, evaluations.csv, "
            f"evolution_progress.png{', suite.png' if suite else ''})",
            f"next: evo-attention validate --from-run {run}   # the best genes on fresh seeds against the baseline",
            export] + ([f"next: evo-attention report {run} --optuna-journal {journal}   # for optuna-dashboard"]
                       if importlib.util.find_spec("optuna") else [])  # suggested only where it can be written


class Evolution(Search):
    """A ``Search`` that writes the run's report files when it finishes (unless ``report=False``),
    after training its ``check`` best genes (default 3; 0: none) and the vanilla gene on 2 fresh
    seeds (``studies.fresh_check``; ``checked`` holds the result).
    Unless ``quiet``, it prints its run directory (``out_dir``, else a new temporary directory), a
    line (or live bars) per trial, and at the end where the report is and the next commands
    (``announce=False``: not the run directory and the end, for a caller that says them itself)."""

    def __init__(self, config: Config, train_loader=None, eval_loader=None, *, data: TaskData | None = None,
                 out_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
                 executor: Executor | None = None, quiet: bool = False, report: bool = True, trackers=(),
                 keep_models: int | None = None, announce: bool = True, check: int | None = None):
        given = [name for name, value in (("train_loader", train_loader), ("eval_loader", eval_loader), ("data", data))
                 if value is not None]
        if given not in ([], ["data"], ["train_loader", "eval_loader"]):
            raise UserError(f"Evolution was given {' and '.join(given)}: pass train_loader with eval_loader, or data= "
                            "alone", setting=given[-1])
        task = getattr(train_loader, "task_data", None)
        if task is not None and getattr(eval_loader, "task_data", None) is task:
            data = task  # loaders made by utils.get_dataloaders: the dataset behind them
        elif train_loader is not None:
            data = LoaderData(train_loader, eval_loader, vocab_size=config.vocab_size, seq_len=config.max_seq_len)
        check_off = turned_off(os.environ, CHECK_ENV)  # a mistyped value is refused before the store is made
        super().__init__(config, data, out_dir=out_dir, resume=resume, overwrite=overwrite, executor=executor,
                         quiet=quiet, trackers=trackers, keep_models=keep_models)
        self.write_reports = report
        self.announce = announce and not quiet
        # the fresh-seed check of the top genes (studies.fresh_check); None: the default, off only where
        # EVO_ATTENTION_FRESH_CHECK=off (the test suite's setting: a check per tiny search would double its time)
        stored = self.store.get_meta(CHECK_META)  # a resumed run keeps the check it started with
        if check is None:
            check = stored if stored is not None else 0 if check_off else DEFAULT_TOP
        elif stored is not None and check != stored:  # dropping (or resizing) it would lose a started check
            self.close()  # the lock and the store are let go again
            raise UserError(f"check {check} differs from the {stored} the run in {self.out_dir} started with: drop "
                            "check to resume (the run keeps its check), or start a new run with overwrite",
                            setting=("check", "overwrite"))
        if isinstance(check, bool) or not isinstance(check, int) or check < 0:
            raise UserError(f"check {check!r} must be a whole number >= 0 (the top genes to train on fresh seeds; "
                            "0: no check)", setting="check")
        self.store.set_meta(CHECK_META, check)
        self.check, self.checked = check, None

    def run(self):
        if self.announce:
            log(f"evo-attention: run directory {self.out_dir} ({self.planned} evaluations planned)")
        best = super().run()
        if self.check:
            self.store.set_meta(CHECK_PENDING, True)  # until it ends, status calls the run interrupted
            try:
                self.checked = fresh_check(self.store, self.executor, top=self.check, quiet=self.quiet, data=self.data)
            except InTheWay:  # the check ran (its trainings are stored) but its files could not be written
                raise
            except UserError as exc:  # e.g. fresh seeds past 2^63-1: the search stands, the check is said skipped
                warnings.warn(f"the fresh-seed check was not run: {exc}")
                self.checked = None
        self.store.set_meta(CHECK_PENDING, False)  # ended, or the run has none
        if self.write_reports:
            self.write_report()
            if self.announce:
                for line in end_of_run_lines(self.out_dir, kept=self.keep_models, suite=self.suite is not None):
                    log(line)
        return best

    def write_report(self) -> dict:
        return write_report(self.out_dir)

    def save_results(self, directory: str | Path) -> Path:
        """Write the report files (final_results.json, evaluations.csv, figures, report.md) into
        ``directory`` (they are regenerated from the run store)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for path in self.write_report().values():
            if path.parent.resolve() != directory.resolve():
                shutil.copy2(path, directory / path.name)
        return directory

    def plot_history(self, path: str | Path) -> Path:
        from evo_attention.report.figures import plot_evolution

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        plot_evolution(load_run(self.out_dir), path)
        return path
