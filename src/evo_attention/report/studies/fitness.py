"""The fitness check's words and tables (``studies.fitness`` makes the numbers): the one-line verdicts
a search prints and the markdown of ``fitness_check.md``, both read from the result's dict alone."""

from __future__ import annotations

from typing import Mapping, Sequence

from evo_attention.report.studies.common import partial_note
from evo_attention.util.format import code, fmt, markdown_table


PHRASES = {"saturated": "saturated", "no lookup": "at its floor (chance or the no-recall level)",
           "near ceiling": "near the ceiling"}


def points_verdict(result: Mapping) -> str:
    """One line on the vanilla gene's levels: saturated, without lookup, or with headroom everywhere."""
    points, lr = result["points"], f"lr {result['lr']:g}"
    if any(row["metric"] != "accuracy" for row in points.values()):
        (label, row), = points.items()
        return f"{label} at {lr}: vanilla val loss {row['mean']:.4f} ± {row['sd']:.4f} over {len(row['values'])} seeds"
    by_status: dict[str, list[str]] = {}
    for label, row in points.items():
        by_status.setdefault(row["status"], []).append(label)
    if result.get("saturated"):
        return f"this fitness is saturated at {lr}: the vanilla gene scores >= {result['ceiling']} on every point"
    parts = [f"{PHRASES[status]} on {', '.join(labels)}" for status, labels in by_status.items()
             if status != "headroom"]
    if not parts:
        return (f"every point has headroom at {lr}: the vanilla gene's mean lies between its floor and "
                f"{result['headroom_ceiling']} on each of the {len(points)} points")
    return f"at {lr} the vanilla gene is " + "; ".join(parts) + f" ({len(by_status.get('headroom', []))} of " \
           f"{len(points)} points with headroom)"


def improvement_verdict(row: Mapping, evaluations: Sequence[int]) -> str:
    """One line on one improvement: seen in one evaluation, seen with k, or not seen."""
    name, p = row["name"], row.get("p_one")
    if p is None:
        return f"{name}: too few finished seeds to measure ({row['n']})"
    size = "-" if row.get("effect_sd") is None else f"{row['effect_sd']:+.1f}"
    if row["effect"] <= 0:
        return (f"this fitness ranks {name} the wrong way round: effect {size} sd, one evaluation ranks it right "
                f"with probability {p:.2f}")
    if p >= 0.9:
        return f"this fitness can see {name} in one evaluation with probability {p:.2f} (effect {size} sd)"
    needed = row.get("evaluations_to_see")
    more = (f"{needed} evaluations averaged reach 0.9" if needed else "no number of evaluations up to 64 reaches 0.9")
    return f"this fitness cannot reliably see {name}: one evaluation ranks it right with probability {p:.2f} " \
           f"(effect {size} sd); {more}"


def points_table(result: Mapping) -> str:
    accuracy = all(row["metric"] == "accuracy" for row in result["points"].values())
    headers = ["point", "steps", "vanilla mean", "sd", "chance", "no-recall", "seeds >= ceiling", "variance share",
               "status"] if accuracy else ["point", "steps", "vanilla val loss", "sd"]
    rows = []
    for label, row in result["points"].items():
        steps = result["fitness"]["points"][label]["steps"]
        cells = [label, fmt(steps), fmt(row["mean"], 3), fmt(row["sd"], 3)]
        if accuracy:
            cells += [fmt(row["chance"], 3), fmt(row["no_recall"], 3), fmt(row["saturated_share"], 2),
                      fmt(row["variance_share"], 2), row["status"]]
        rows.append(cells)
    return markdown_table(headers, rows, "l" + "r" * (len(headers) - 2) + ("l" if accuracy else "r"))


def improvements_table(result: Mapping) -> str:
    ks = sorted({int(k) for row in result["improvements"] for k in row.get("p_by_evaluations") or {}})
    headers = ["improvement", "better", "than", "effect", "effect (sd)", "seeds ranked right",
               *[f"P(right), {k} eval{'s' if k > 1 else ''}" for k in ks], "evals for 0.9"]
    rows = []
    for row in result["improvements"]:
        by = row.get("p_by_evaluations") or {}
        right = "-" if row.get("seeds_ranked_right") is None else f"{row['seeds_ranked_right']:g} of {row['n']}"
        rows.append([row["name"], code(row["better"]), code(row["worse"]), fmt(row.get("effect"), 4),
                     fmt(row.get("effect_sd"), 1), right, *[fmt(by.get(str(k)), 2) for k in ks],
                     fmt(row.get("evaluations_to_see"))])
    return markdown_table(headers, rows, "lll" + "r" * (len(headers) - 3))


def fitness_markdown(result: Mapping) -> str:
    """``fitness_check.md``: the verdicts, the rate, the points' table and the improvements' table."""
    fitness, seeds = result["fitness"], result.get("seeds") or []
    name = f"suite {fitness['suite']}" if fitness.get("suite") else ", ".join(p["data"] for p in fitness["points"]
                                                                                 .values())
    lines = [f"# Fitness check: {name}", "", *[f"- {v}" for v in result["verdicts"]], ""]
    grid = result.get("grid")
    if grid:
        curve = ", ".join(f"{p['lr']:g}: {fmt(p['mean'], 4)}" for p in grid["curve"])
        lines += [f"Rate: {result['lr']:g}, the vanilla gene's best of the grid on tuning seeds "
                  f"{', '.join(map(str, grid['tuning_seeds']))} ({curve})"
                  + ("; **at an end of the grid: widen it**" if grid["at_edge"] else "") + ".", ""]
    else:
        lines += [f"Rate: {result['lr']:g}, given.", ""]
    lines += [f"{len(seeds)} seeds ({', '.join(map(str, seeds))}), metric {fitness['metric']}"
              f" ({'lower' if fitness['lower_is_better'] else 'higher'} is better); fitness id `{fitness['id']}`.",
              "", "## The vanilla gene per point", "", points_table(result),
              *([partial, ""] if (partial := partial_note(result)) else []),
              "## Known improvements", "",
              "P(right) is the probability that one evaluation (or k, averaged) of each gene ranks the "
              "improvement the right way round: the lower of a paired (same seed) and an unpaired normal model "
              "of the per-seed values (an approximation; with few seeds an estimate).", "",
              improvements_table(result)]
    return "\n".join(lines)
