"""A search's fresh-seed check (``studies.fresh_check`` trains it): its end-of-run line and ``fresh_check.md``,
both read from the result's dict alone."""

from __future__ import annotations

from evo_attention.util.format import code, fmt, markdown_table


def check_line(result, baseline: str) -> str:
    """The end-of-run line: whether the winner held against the ``baseline`` ("vanilla" or "baseline") gene, the
    result's ``vanilla``, and the rank correlation."""
    name = "val loss" if result["metric"] == "val_loss" else "suite accuracy"
    winner, vanilla, n = result["genes"][0], result["vanilla"], len(result["seeds"])
    scores = f"{name} {fmt(winner['fresh'], 4)}" + (f" vs the {baseline} gene's {fmt(vanilla['fresh'], 4)}"
                                                    if vanilla["fresh"] is not None else
                                                    f"; the {baseline} gene failed there")
    corr = result["rank_correlation"]
    tail = "" if corr is None else f"; rank correlation of search and fresh scores over the top " \
                                   f"{len(result['genes'])}: {corr:+.2f}"
    if result["held"]:
        return (f"the winner held on {n} fresh seeds: the best of the top {len(result['genes'])} there, and ahead "
                f"of the {baseline} gene ({scores}){tail}; a check, not a verdict: validate for that")
    return f"the winner did not hold on {n} fresh seeds ({scores}){tail}"


def check_markdown(result, baseline: str) -> str:
    rows = [[r["rank"], code(r["gene"]), fmt(r["search"], 4), fmt(r["fresh"], 4)] for r in result["genes"]]
    rows.append(["-", f"{code(result['vanilla']['gene'])} ({baseline})", "-", fmt(result["vanilla"]["fresh"], 4)])
    return "\n".join([f"# Fresh-seed check of the search's top {len(result['genes'])}", "", result["line"], "",
                      f"Search: one training on seed {result['search_seed']}; fresh: the mean over seeds "
                      f"{', '.join(map(str, result['seeds']))} ({result['metric']}, "
                      f"{'lower' if result['lower_is_better'] else 'higher'} is better).", "",
                      markdown_table(["rank", "gene", "search", "fresh"], rows, "rlrr")])
