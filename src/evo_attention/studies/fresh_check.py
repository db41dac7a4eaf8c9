"""The fitness reliability of a finished search: its top genes trained again on fresh seeds.

    from evo_attention.studies.fresh_check import fresh_check
    result = fresh_check(store, executor, top=3, n_seeds=2)   # the run's own store and an executor
    result["line"]    # "the winner held: best of the top 3 on 2 fresh seeds, ahead of the vanilla gene ..."

The check trains the search's ``top`` genes and the run's vanilla gene (its ``baseline_gene`` where
set) again on ``n_seeds`` fresh seeds (``validate --from-run``'s first, ``seed + 1 ...``: a later
validation reuses them) at the run's settings, scores them on the search's own fitness
(``studies.fitness.Fitness``), and reports each gene's search and fresh score, their rank
correlation (Spearman) and whether the winner **held**: the best of the top genes on the fresh seeds
and better than the vanilla gene there. A check, not a verdict (``validate`` gives that). The
trainings are stored with the role ``check``; the result is ``fresh_check.json`` and
``fresh_check.md`` in the run directory.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from evo_attention.report import load_run
from evo_attention.report.attachments import FRESH_CHECK_FILE, FRESH_CHECK_ROLE as ROLE
from evo_attention.report.studies.fresh_check import check_line, check_markdown
from evo_attention.studies.common import StudySetup
from evo_attention.studies.fitness import Fitness
from evo_attention.train.config import Config
from evo_attention.util.files import write_text
from evo_attention.util.jsonio import write_json

DEFAULT_TOP = 3
DEFAULT_SEEDS = 2


def fresh_check(store, executor, *, top: int = DEFAULT_TOP, n_seeds: int = DEFAULT_SEEDS, quiet: bool = True,
                data=None) -> dict | None:
    """Check the search in ``store`` (see the module docstring); None when it has no ranked gene."""
    from evo_attention.data.suites import load_suite

    config = Config.from_dict(store.config())
    run = load_run(store.run_dir)
    suite = run.suite is not None
    ranked = ([(row["gene"], row["suite_accuracy"]) for row in run.suite["genes"] if row.get("rank")] if suite
              else [(row["gene"], math.log(row["perplexity"])) for row in run.ranking])[:top]
    if not ranked:
        return None
    fitness = Fitness.of(config, data, load_suite(config.suite) if suite else None)
    setup = StudySetup.resolve(fitness.first, None if suite else fitness.datasets[str(config.data)], role=ROLE,
                               n_seeds=n_seeds, min_seeds=1, metric=fitness.metric, store=store, executor=executor,
                               search_seed=config.seed, quiet=quiet)
    # the baseline as the search trained it (with rate_grid: at its own best rate)
    vanilla = (run.baseline or {}).get("gene") or config.resolved_baseline().key
    keys = list(dict.fromkeys([key for key, _ in ranked] + [vanilla]))
    records = fitness.train(setup, keys, setup.seeds, config.learning_rate, {vanilla: "vanilla"}, role=ROLE)
    fresh = {}
    for key in keys:
        scores = [fitness.score([records[key, label, s] for label in fitness.points]) for s in setup.seeds]
        fresh[key] = statistics.fmean(scores) if None not in scores else None
    sign = -1.0 if fitness.lower_is_better else 1.0
    rows = [{"rank": i + 1, "gene": key, "search": value, "fresh": fresh[key]} for i, (key, value) in enumerate(ranked)]
    winner = rows[0]
    finished = [r for r in rows if r["fresh"] is not None]
    best_fresh = max(finished, key=lambda r: sign * r["fresh"]) if finished else None
    held = (winner["fresh"] is not None and best_fresh is winner and fresh[vanilla] is not None
            and sign * (winner["fresh"] - fresh[vanilla]) > 0)
    result = {"kind": "fresh_check", "metric": fitness.metric, "lower_is_better": fitness.lower_is_better,
              "seeds": list(setup.seeds), "search_seed": config.seed, "genes": rows,
              "vanilla": {"gene": vanilla, "fresh": fresh[vanilla]},
              "rank_correlation": _spearman([r["search"] for r in finished], [r["fresh"] for r in finished]),
              "held": held}
    baseline = "vanilla" if config.baseline_gene is None else "baseline"  # the gene of "vanilla", in words
    result["line"] = check_line(result, baseline)
    write_json(Path(store.run_dir) / FRESH_CHECK_FILE, result)
    write_text(Path(store.run_dir) / "fresh_check.md", check_markdown(result, baseline))
    return result


def _spearman(a, b) -> float | None:
    if len(a) < 3:
        return None
    from scipy.stats import spearmanr

    value = float(spearmanr(a, b).statistic)
    return value if math.isfinite(value) else None
