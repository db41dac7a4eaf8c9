"""What the seed-based studies share: fresh seeds, the training of (gene, seed) pairs through the
runner, per-gene samples, provenance, and writing a result as JSON + markdown.

The seeds of a study are ``seed + 1 ... seed + N``, never the search seed on which a search picked
its winners (a winner's score on that seed is biased low: the winner's curse).
"""

from __future__ import annotations

import os
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from evo_attention.genes import AttentionGene
from evo_attention.report.attachments import output_stem
from evo_attention.report.studies import metric_info
from evo_attention.search.executors import EvalTask, Executor, make_executor
from evo_attention.search.runner import Runner
from evo_attention.train.record import EvaluationRecord, objective_value, usable_metric
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir, write_text
from evo_attention.util.jsonio import dumps
from evo_attention.util.progress import SearchView

DEFAULT_SEEDS = 5


def validation_seeds(base_seed: int, n: int, search_seed: int | None = None) -> list[int]:
    """``base_seed + 1 ... base_seed + n``; refuses n < 2 and a list that holds ``search_seed``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise UserError(f"n_seeds {n!r} is too few: a spread and a confidence interval need at least 2 seeds "
                        "(5 is the default)", setting="n_seeds")
    seeds = list(range(int(base_seed) + 1, int(base_seed) + n + 1))
    if search_seed is not None and search_seed in seeds:
        raise UserError(f"the validation seeds {seeds[0]}..{seeds[-1]} include {search_seed}, on which the search picked "
                        f"its winners: use seed {search_seed} (seeds {search_seed + 1}..) or leave seed unset",
                        setting="seed")
    return seeds


def run_seeds(genes: Iterable[AttentionGene | str], config, data, seeds: Sequence[int], *, steps: int | None = None,
              eval_split: str = "valid", role: str = "validate", store=None, executor: Executor | None = None,
              quiet: bool = True) -> dict[tuple[str, int], EvaluationRecord]:
    """Records of every (gene, seed): from ``store`` when there, else trained by ``executor``
    (default: the local one) and stored at once. Keys are (gene key, seed)."""
    keys = list(dict.fromkeys(AttentionGene.parse(g).key for g in genes))
    steps = int(config.train_steps if steps is None else steps)
    tasks = [EvalTask(key, int(seed), steps, eval_split=eval_split, role=role, label=f"seed {seed}")
             for key in keys for seed in seeds]
    own = executor is None
    executor = make_executor("local") if own else executor
    try:
        with SearchView(len(tasks), enabled=not quiet) as view:
            runner = Runner(config, data, executor, store=store, view=view, activity=f"{role}:")
            records = runner.evaluate(tasks)
    finally:
        if own:
            executor.close()
    return {(task.gene, task.seed): record for task, record in records.items()}


# what a gene costs, beside its quality: the record's cost objectives (all minimised)
# (not peak memory: on a CPU it is the worker process's high-water mark over every training it ran)
COSTS = ("params", "flops", "train_ms_per_step", "latency_ms")


def samples(records: Mapping[tuple[str, int], Mapping], key: str, seeds: Sequence[int], metric: str) -> dict:
    """``{"seeds", "values", "statuses", "n_failed", "errors", "cost"}`` of one gene (values None
    where failed); ``cost``: each of ``COSTS``, the median over the finished trainings (timings
    are the machine's where they trained, so the median damps one slow neighbour)."""
    rows = [records[key, s] for s in seeds]
    values = [usable_metric(r, metric) for r in rows]
    errors = sorted({str(r.get("error") or r.get("status")) for r, v in zip(rows, values) if v is None})
    cost = {}
    for name in COSTS:
        measured = [v for v in (objective_value(r, name) for r in rows) if v is not None]
        cost[name] = statistics.median(measured) if measured else None
    return {"seeds": list(seeds), "values": values, "statuses": [str(r.get("status")) for r in rows],
            "n_failed": sum(v is None for v in values), "errors": errors, "cost": cost}


def provenance(config, data, eval_split: str, metric: str, confidence: float, seeds: Sequence[int],
               steps: int, search_seed: int | None, source_run: str | os.PathLike | None) -> dict:
    """The settings block every study result carries (enough to reproduce it)."""
    from evo_attention.train.environment import versions

    import matplotlib
    import numpy
    import scipy

    label, lower, _ = metric_info(metric, eval_split)
    return {
        "metric": metric, "metric_label": label, "lower_is_better": lower, "eval_split": eval_split,
        "confidence": confidence, "seeds": list(seeds), "search_seed": search_seed, "steps": steps,
        "source_run": None if source_run is None else str(source_run),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_dict(), "data": data.describe(),
        "versions": {**versions(), "numpy": numpy.__version__, "scipy": scipy.__version__,
                     "matplotlib": matplotlib.__version__},
    }


def write_json_and_markdown(kind: str, result: Mapping, out_dir: str | os.PathLike, markdown: str) -> dict[str, Path]:
    """Write ``KIND.json`` and ``KIND.md`` (``KIND_test.*`` for the test split) into ``out_dir``;
    returns their paths and the path the caller's figure goes to (``png``)."""
    out = output_dir(out_dir)
    stem = output_stem(kind, result.get("eval_split", "valid"))
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    write_text(paths["json"], dumps(result) + "\n")
    write_text(paths["md"], markdown)
    return paths
