"""Every figure of the product, drawn with matplotlib's Agg backend (no display needed): one ``plot_*`` function
per figure (a suite run's ``evolution_progress.png`` draws suite accuracy, higher is better). Each writes its PNG
atomically and closes its figure; jitter is deterministic, so the same input draws the same figure.
"""

from __future__ import annotations

import math
import os
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from evo_attention.report.summary import OBJECTIVE_LABELS, RunSummary, perplexity_of  # noqa: E402
from evo_attention.search.pareto import front  # noqa: E402
from evo_attention.util.files import atomic_target  # noqa: E402
from evo_attention.util.format import finite_or_none, number  # noqa: E402
from evo_attention.util.stats import percent  # noqa: E402

DPI = 120
TOKEN_LABELS_MAX = 40  # tokens are written on the heatmap axes up to this length
# boxplot's ``vert`` became ``orientation`` in matplotlib 3.10
_HORIZONTAL = ({"orientation": "horizontal"} if tuple(int(p) for p in matplotlib.__version__.split(".")[:2]) >= (3, 10)
               else {"vert": False})


@contextmanager
def _figure(*args, **kwargs):
    """``plt.subplots(*args, **kwargs)``, its figure closed when drawing it fails (``save_figure`` closes it
    otherwise)."""
    fig, axes = plt.subplots(*args, **kwargs)
    try:
        yield fig, axes
    except BaseException:
        plt.close(fig)
        raise


def _offsets(n: int, spread: float = 0.25) -> np.ndarray:
    """Fixed (not random) offsets of ``n`` points, so the figure is reproducible."""
    return np.zeros(n) if n < 2 else (np.arange(n) / (n - 1) - 0.5) * spread


def plot_samples(groups: Sequence[dict], path: str | os.PathLike, *, xlabel: str, title: str,
                 ci_label: str = "confidence interval of the mean") -> Path:
    """``groups`` (``{"label", "values", "baseline": bool, "failed": int, "ci": (low, high)}``) top to bottom: a
    box, every value a point, the mean a diamond and its interval a bar under the box; None values skipped."""
    n = max(1, len(groups))
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.55 * n), dpi=DPI)
    ys = list(range(n, 0, -1))
    labels = []
    for y, group in zip(ys, groups):
        values = [float(v) for v in group["values"] if v is not None and math.isfinite(float(v))]
        color = "black" if group.get("baseline") else "tab:blue"
        if values:
            ax.boxplot([values], positions=[y], **_HORIZONTAL, widths=0.5, showfliers=False,
                       medianprops={"color": color}, boxprops={"color": color}, whiskerprops={"color": color},
                       capprops={"color": color})
            ax.scatter(values, y + _offsets(len(values)), s=18, color=color, alpha=0.7, zorder=3)
            ax.plot([np.mean(values)], [y], marker="D", color="tab:orange", markersize=6, zorder=4)
            low, high = group.get("ci") or (None, None)
            if low is not None and high is not None:
                ax.plot([low, high], [y - 0.32, y - 0.32], color="tab:orange", linewidth=2.5, zorder=4)
            if group.get("baseline"):
                ax.axvline(np.mean(values), color="black", linestyle=":", linewidth=1.2, zorder=1)
        failed = group.get("failed") or 0
        labels.append(group["label"] + (f"  ({failed} failed)" if failed else ""))
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set(ylim=(0.4, n + 0.6), xlabel=xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.plot([], [], "D", color="tab:orange", label="mean")
    ax.plot([], [], "-", color="tab:orange", linewidth=2.5, label=ci_label)
    ax.plot([], [], ":", color="black", label="baseline mean")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.3 / n), ncol=3, fontsize=7, frameon=False)
    return save_figure(fig, path)


def plot_contributions(items: Sequence[dict], path: str | os.PathLike, *, xlabel: str, title: str) -> Path:
    """``items``: ``{"label", "value", "low", "high", "kind"}`` each (kind picks the colour;
    low/high the error bar, None for none), drawn top to bottom; a line marks zero."""
    colors = {"remove": "tab:red", "add": "tab:green", "total": "tab:blue"}
    n = max(1, len(items))
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.45 * n), dpi=DPI)
    ys = np.arange(n, 0, -1)
    for y, item in zip(ys, items):
        value = item.get("value")
        if value is None:
            ax.text(0, y, "  no value (failed)", va="center", fontsize=7, color="tab:gray")
            continue
        low, high = item.get("low"), item.get("high")
        err = None if low is None or high is None else [[value - low], [high - value]]
        ax.barh(y, value, height=0.6, color=colors.get(item.get("kind"), "tab:gray"), alpha=0.8,
                xerr=err, capsize=3, error_kw={"elinewidth": 1})
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(ys, [item["label"] for item in items], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    for kind, text in (("remove", "removed from the gene"), ("add", "added to the baseline"),
                       ("total", "whole gene vs baseline")):
        if any(item.get("kind") == kind for item in items):
            ax.barh([np.nan], [np.nan], color=colors[kind], label=text)
    ax.legend(loc="best", fontsize=7)
    return save_figure(fig, path)


def _grid_and_legend(ax, drawn: bool, empty: str = "no finished training") -> None:
    """A study figure's finish: a grid, and the legend of what was drawn or a note that nothing was."""
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(loc="best", fontsize=7)
    else:
        ax.text(0.5, 0.5, empty, ha="center", transform=ax.transAxes)


def plot_distribution(values: Sequence[float], path: str | os.PathLike, *, failed: int = 0,
                      baseline: float | None = None, best: float | None = None,
                      xlabel: str = "Validation perplexity (lower is better)", title: str = "") -> Path:
    """Histogram of ``values`` (finite); the baseline and the best value as vertical lines."""
    fig, ax = plt.subplots(figsize=(8, 4), dpi=DPI)
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if values:
        low, high = min(values + ([baseline] if baseline else [])), max(values + ([baseline] if baseline else []))
        log = low > 0 and high / low > 10
        bins = (np.geomspace(low, high, 30) if log else min(30, max(5, len(values)))) if high > low else 5
        ax.hist(values, bins=bins, color="tab:gray", alpha=0.7, label=f"search evaluations ({len(values)})")
        if log:
            ax.set_xscale("log")
        if baseline is not None:
            ax.axvline(baseline, color="black", linestyle=":", linewidth=1.5, label=f"baseline {baseline:.3g}")
        if best is not None:
            ax.axvline(best, color="tab:blue", linewidth=1.5, label=f"best {best:.3g}")
        ax.legend(fontsize=8)
        ax.set_ylabel("Evaluations")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.text(0.5, 0.5, "No finished evaluation.", transform=ax.transAxes, ha="center", va="center")
        ax.set(xticks=[], yticks=[])
    ax.set_xlabel(xlabel)
    ax.set_title(title + (f" ({failed} failed, not shown)" if failed else ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    return save_figure(fig, path)


def plot_head_grid(weights: np.ndarray, path: str | os.PathLike, *, title: str,
                   tokens: Sequence[str] | None = None, head_titles: Sequence[str] | None = None) -> Path:
    """One layer's weights ``[H, T, T]`` (query rows, key columns) as a grid of heatmaps: exact zeros white,
    positive weights from light to dark (a sparse pattern shows as such), the causally masked future grey; tokens
    label the axes when there are at most ``TOKEN_LABELS_MAX``."""
    heads, t = weights.shape[0], weights.shape[-1]
    cols = math.ceil(math.sqrt(heads))
    rows = math.ceil(heads / cols)
    size = 3.2 if t <= 16 else 3.8 if t <= TOKEN_LABELS_MAX else 3.4
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols + 0.8, size * rows + 0.6), dpi=DPI, squeeze=False,
                             layout="constrained")
    cmap = plt.get_cmap("viridis_r").with_extremes(bad=(0.0, 0.0, 0.0, 0.0))  # zeros: the white axes show
    future = np.ma.masked_where(np.tril(np.ones((t, t))) > 0, np.ones((t, t)))
    grey = ListedColormap(["#d9d9d9"])
    image = None
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        shown = np.ma.masked_where(weights[h] == 0.0, weights[h])
        ax.imshow(future, cmap=grey, interpolation="nearest")
        image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(head_titles[h] if head_titles else f"head {h}", fontsize=8)
        if tokens is not None and len(tokens) <= TOKEN_LABELS_MAX:
            font = 7 if t <= 16 else 5
            ax.set_xticks(range(t), tokens, rotation=90, fontsize=font)
            ax.set_yticks(range(t), tokens, fontsize=font)
        else:
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel("query position", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.7, label="weight (white: exactly 0; grey: future)")
    return save_figure(fig, path, tight=False)


# -- the evolution of a run ---------------------------------------------------------------------
FIGSIZE = (8, 5)
LOG_RATIO = 10.0  # the evolution figure's y axis is logarithmic above this ratio of perplexities
JITTER = 0.3  # total horizontal spread of the points of one generation


def _wide(values) -> bool:
    """Whether positive ``values`` span more than ``LOG_RATIO`` (their axis is then logarithmic)."""
    return min(values) > 0 and max(values) / min(values) > LOG_RATIO


def _title(summary: RunSummary) -> str:
    strategy = summary.strategy.get("name") if isinstance(summary.strategy, dict) else None
    data = (summary.data.get("name") if isinstance(summary.data, dict) else None) or summary.config.get("data")
    parts = [p for p in (f"{strategy} search" if strategy else None, data) if p]
    return "Evolution progress" + (f" ({', '.join(parts)})" if parts else "")


def _legend(ax) -> None:
    """The legend below the axes, so that it never hides a point."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8, frameon=False)


def plot_evolution(summary: RunSummary, path: str | os.PathLike) -> Path:
    """Draw the evolution figure of ``summary`` into the PNG ``path``."""
    with _figure(figsize=FIGSIZE, dpi=DPI) as (fig, ax):
        _draw(ax, summary)
    return save_figure(fig, path, dpi=110)


def save_figure(fig, path: str | os.PathLike, tight: bool = True, dpi: int = DPI) -> Path:
    """Write ``fig`` as a PNG atomically (temp file, then rename) and close it."""
    try:
        if tight:
            fig.tight_layout()
        with atomic_target(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return Path(path)


def _draw(ax, summary: RunSummary) -> None:
    """Every search evaluation (a suite run: every gene's suite accuracy, where it was first trained), the
    best and mean of each generation's population, the best so far and the baseline."""
    suite = summary.suite is not None
    key = "suite_accuracy" if suite else "perplexity"
    ax.set_title(_title(summary))
    ax.set_xlabel("Generation")
    ax.set_ylabel(f"Suite accuracy over {len(summary.suite['points'])} points (higher is better)" if suite
                  else "Validation perplexity (lower is better)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    by_generation: dict[int, list] = {}
    for row in summary.suite["genes"] if suite else summary.search_evaluations:
        value = row["suite_accuracy"] if suite else perplexity_of(row)
        if row.get("generation") is not None and value is not None:
            by_generation.setdefault(int(row["generation"]), []).append(value)
    points = [(x, value) for generation, values in sorted(by_generation.items())
              for x, value in zip(generation + _offsets(len(values), JITTER), values)]
    ok_x, ok_y = [x for x, v in points if not math.isinf(v)], [v for _, v in points if not math.isinf(v)]
    fail_x = [x for x, v in points if math.isinf(v)]

    generations = sorted(set(by_generation) | {h["generation"] for h in summary.history})
    if generations:
        ax.set_xlim(generations[0] - 0.5, generations[-1] + 0.5)
        if generations[-1] - generations[0] <= 20 and not suite:
            ax.set_xticks(range(generations[0], generations[-1] + 1))
    history = [h for h in summary.history if h[f"best_{key}"] is not None]
    baseline = summary.baseline[key] if summary.baseline else None
    baseline = baseline if suite else baseline or None  # a perplexity baseline is drawn when truthy
    if summary.outcome != "ok":  # say plainly why there is no curve
        ax.text(0.5, 0.5, summary.statement, transform=ax.transAxes, ha="center", va="center",
                fontsize=12, wrap=True)
    if not (ok_y or history or baseline is not None) and not suite:
        ax.set_yticks([])
        if not generations:
            ax.set_xticks([])
        if fail_x:
            ax.scatter(fail_x, [0.97] * len(fail_x), transform=ax.get_xaxis_transform(), marker="x",
                       color="tab:red", label=f"failed ({len(fail_x)})")
            _legend(ax)
        return

    if ok_x:
        ax.scatter(ok_x, ok_y, s=14, color="tab:gray", alpha=0.35, linewidths=0,
                   label=f"{'genes' if suite else 'evaluations'} ({len(ok_x)})", zorder=2)
    if history:
        gens = [h["generation"] for h in history]
        ax.plot(gens, [h[f"best_{key}"] for h in history], "o-", color="tab:blue",
                label="best of population", zorder=4)
        means = [(h["generation"], h[f"mean_{key}"]) for h in history if h[f"mean_{key}"] is not None]
        if means:
            ax.plot(*zip(*means), "s--", color="tab:orange", markersize=4, label="mean of population", zorder=3)
        ax.step(gens, [h["best_so_far"] for h in history], where="post", color="tab:green",
                linewidth=2.5, alpha=0.6, label="best so far", zorder=3)
    if baseline is not None:
        ax.axhline(baseline, color="black", linestyle=":", linewidth=1.5,
                   label=f"baseline {summary.baseline['str']}: {baseline:.{3 if suite else 2}f}", zorder=1)
    if suite:
        if ok_x or history or baseline is not None:
            ax.set_ylim(-0.02, 1.02)
            _legend(ax)
        return
    if fail_x:
        ax.scatter(fail_x, [0.97] * len(fail_x), transform=ax.get_xaxis_transform(), marker="x",
                   color="tab:red", alpha=0.8, label=f"failed ({len(fail_x)}, drawn at the top)", zorder=5)
    if _wide(ok_y + [h["best_perplexity"] for h in history] + ([baseline] if baseline else [])):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter("{x:g}")
        ax.yaxis.set_minor_formatter(NullFormatter())
    if summary.best is not None:
        ax.annotate(f"best {summary.best['perplexity']:.2f}",
                    (summary.best["generation"] or 0, summary.best["perplexity"]),
                    textcoords="offset points", xytext=(6, 6), fontsize=8, color="tab:blue")  # above: never clipped by the axis floor
    _legend(ax)

def plot_suite_heatmap(columns: Sequence[str], rows: Sequence[dict], path: str | os.PathLike, *,
                       title: str) -> Path:
    """A heat map of genes (rows: ``{"name", "means", "sds", "failed"}``) x ``columns`` (the points, then the
    suite accuracy), coloured by mean accuracy on [0, 1], each cell showing its mean (± sd) and failures."""
    means = np.array([[np.nan if v is None else float(v) for v in r["means"]] for r in rows], dtype=float)
    width = max(6.0, 1.25 * len(columns) + 2.5)
    with _figure(figsize=(width, max(2.2, 0.55 * len(rows) + 1.6)), dpi=DPI) as (fig, ax):
        image = ax.imshow(np.ma.masked_invalid(means), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        for i, r in enumerate(rows):
            for j, mean in enumerate(r["means"]):
                if mean is None:
                    continue
                sd, failed_here = r["sds"][j], r["failed"][j]
                text = f"{mean:.2f}" + ("" if sd is None else f"\n±{sd:.2f}") + (f"\n{failed_here} failed"
                                                                               if failed_here else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if mean < 0.6 else "black")
        ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)), [_short(str(r["name"]), 40) for r in rows], fontsize=8)
        if len(columns) > 1:
            ax.axvline(len(columns) - 1.5, color="white", linewidth=2.5)  # the suite accuracy apart
        fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="accuracy")
        ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


# -- a comparison of named variants ------------------------------------------------------------------
FAMILY_COLORS = {"baseline": "#222222", "lora": "#1f77b4", "rope": "#ff7f0e", "bias": "#2ca02c",
                 "enhanced": "#9467bd", "evolved": "#d62728"}
OTHER_COLOR = "#7f7f7f"


def _color(name: str) -> str:
    return FAMILY_COLORS.get(name.split("_")[0], OTHER_COLOR)


def _short(name: str, limit: int = 28) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def plot_compare(payload: dict, path: str | Path) -> Path:
    """``compare.png``: (a) the loss ranking with error bars (sd over seeds), (b) loss vs
    parameters, (c) loss vs training time, (d) peak memory; failed configurations are marked."""
    aggregates = payload["aggregates"]
    ranked = sorted(aggregates, key=lambda a: (a["val_loss"] is None, a["val_loss"] or 0.0, a["name"]))
    ok = [a for a in ranked if a["val_loss"] is not None]
    s = payload["settings"]
    with _figure(2, 2, figsize=(13, 9), dpi=110) as (fig, axes):
        ax = axes[0, 0]
        ys = list(range(len(ranked)))[::-1]  # best on top
        if ok:
            lows = [a["val_loss"] - (a["val_loss_sd"] or 0.0) for a in ok]
            highs = [a["val_loss"] + (a["val_loss_sd"] or 0.0) for a in ok]
            span = max(highs) - min(lows) or abs(max(highs)) * 0.05 or 1.0
            left = min(lows) - 0.25 * span
            ax.barh(ys[: len(ok)], [a["val_loss"] - left for a in ok], left=left, color=[_color(a["name"]) for a in ok],
                    xerr=[a["val_loss_sd"] or 0.0 for a in ok] if s["seeds"] > 1 else None, capsize=3, alpha=0.85)
            ax.set_xlim(left, max(highs) + 0.4 * span)
            base = next((a for a in ok if a["name"] == "baseline"), None)
            if base is not None:
                ax.axvline(base["val_loss"], color="#222222", linestyle="--", linewidth=1, label="baseline")
                ax.legend(loc="lower right", fontsize=8)
            for y, a, high in zip(ys, ok, highs):
                ax.text(high, y, f"  {a['val_loss']:.3f}", va="center", fontsize=7)
        for y, a in zip(ys[len(ok):], ranked[len(ok):]):
            ax.text(0.02, y, f"{a['status']}", transform=ax.get_yaxis_transform(), va="center", color="#d62728",
                    fontsize=8)
        ax.set_yticks(ys, [_short(a["name"]) for a in ranked], fontsize=8)
        ax.set_xlabel("validation loss" + (f" (mean ± sd, {s['seeds']} seeds)" if s["seeds"] > 1 else ""))
        ax.set_title("Ranking (lower is better)")

        for ax, key, label, title in ((axes[0, 1], "params", "parameters", "Loss vs parameters"),
                                      (axes[1, 0], "time_s", "time per training (s)", "Loss vs time")):
            points = [a for a in ok if finite_or_none(a[key]) is not None]
            for a in points:
                ax.errorbar(a[key], a["val_loss"], yerr=a["val_loss_sd"] if s["seeds"] > 1 else None, fmt="o",
                            color=_color(a["name"]), capsize=3)
                ax.annotate(_short(a["name"], 18), (a[key], a["val_loss"]), fontsize=7, xytext=(4, 3),
                            textcoords="offset points")
            ax.set(xlabel=label, ylabel="validation loss", title=title)
            ax.grid(alpha=0.3)
            if not points:
                ax.text(0.5, 0.5, "no finished configuration", ha="center", transform=ax.transAxes)

        ax = axes[1, 1]
        mem = [a for a in ranked if finite_or_none(a["peak_memory_mb"]) is not None]
        ax.barh(list(range(len(mem)))[::-1], [a["peak_memory_mb"] for a in mem], color=[_color(a["name"]) for a in mem],
                alpha=0.85)
        ax.set_yticks(list(range(len(mem)))[::-1], [_short(a["name"]) for a in mem], fontsize=8)
        ax.set_xlabel("peak memory (MB" + (", GPU allocated)" if str(s.get("device", "")).startswith("cuda")
                                           else ", process)"))
        ax.set_title("Peak memory")

        fig.suptitle(f"{s['data']}: {s['d_model']}d x {s['n_layers']} layers x {s['n_heads']} heads, "
                     f"{s['steps']} steps, batch {s['batch_size']}, {s['seeds']} seed{'s' if s['seeds'] > 1 else ''}")
    return save_figure(fig, path, dpi=110)


def plot_transfer(result: dict, path: str | os.PathLike) -> Path:
    """``transfer.png``: one line per gene (the baseline black) through its mean at every size against its
    parameters, log-log, each mean's interval a bar (lines nudged under 1% sideways so none hides another)."""
    sizes = result.get("sizes") or []
    series = [("baseline", True, [s.get("baseline") or {} for s in sizes])]
    for gene in result.get("genes") or []:
        rows = [next((g for g in s.get("genes", []) if g.get("gene") == gene.get("gene")), {}) for s in sizes]
        series.append((_short(str(gene.get("str")), 48), False, rows))
    with _figure(figsize=(8, 5.5), dpi=DPI) as (fig, ax):
        drawn = 0
        for i, (label, is_base, rows) in enumerate(series):
            points = [(r.get("params"), r.get("mean"), r.get("ci_low"), r.get("ci_high")) for r in rows]
            points = [p for p in points if finite_or_none(p[0]) and finite_or_none(p[1]) and p[1] > 0]
            if not points:
                continue
            nudge = 10 ** (0.004 * (i - (len(series) - 1) / 2))  # < 1% sideways: bars never hide each other
            xs, ys = [p[0] * nudge for p in points], [p[1] for p in points]
            err = [[max(0.0, y - (lo if lo is not None else y)) for _, y, lo, _ in points],
                   [max(0.0, (hi if hi is not None else y) - y) for _, y, _, hi in points]]
            ax.errorbar(xs, ys, yerr=err, fmt="o-" if not is_base else "s--", capsize=3, markersize=4,
                        color="black" if is_base else f"C{i % 10}", label=label, linewidth=1.2)
            drawn += 1
        ax.set(xscale="log", yscale="log")
        ax.yaxis.set_major_formatter("{x:g}")
        ax.yaxis.set_minor_formatter("{x:g}")
        ax.tick_params(axis="y", which="minor", labelsize=7)
        for s in sizes:
            if finite_or_none(s.get("params")):
                ax.annotate(str(s.get("size")), (s["params"], 0), xycoords=("data", "axes fraction"),
                            xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7, color="tab:gray")
        label = result.get("metric_label", "perplexity")
        ax.set_xlabel("parameters")
        ax.set_ylabel(f"{'validation' if result.get('eval_split', 'valid') == 'valid' else result.get('eval_split')} "
                      f"{label} (mean, {percent(result.get('confidence', 0.95))} interval)")
        ax.set_title(f"Transfer across scale: {len(result.get('seeds') or [])} seeds per point, "
                     f"{result.get('block', 'gpt2')} block", fontsize=10)
        _grid_and_legend(ax, drawn)
    return save_figure(fig, path)


def plot_lr_grid(panels: Sequence[dict], path: str | os.PathLike, *, ylabel: str, title: str) -> Path:
    """A learning-rate grid: per panel (``{"title", "genes"}``) a line per gene (``{"label", "baseline", "curve":
    [{"lr", "mean"}], "selected", "at_edge"}``; the baseline black, dashed) through its mean at each rate (log x),
    the selected rate ringed, an edge winner said in the legend."""
    n = max(1, len(panels))
    with _figure(1, n, figsize=(6.5 * n, 4.8), dpi=DPI, squeeze=False) as (fig, axes):
        for ax, panel in zip(axes[0], panels):
            drawn = 0
            rates = sorted({p["lr"] for g in panel.get("genes", []) for p in g.get("curve") or []})
            for i, gene in enumerate(panel.get("genes", [])):
                points = [(p["lr"], finite_or_none(p.get("mean"))) for p in gene.get("curve") or []]
                points = [(x, y) for x, y in points if y is not None]
                if not points:
                    continue
                color = "black" if gene.get("baseline") else f"C{i % 10}"
                label = _short(str(gene.get("label", "")), 48) + ("  (best at the grid's edge)" if gene.get("at_edge") else "")
                ax.plot([x for x, _ in points], [y for _, y in points], "s--" if gene.get("baseline") else "o-",
                        color=color, markersize=4, linewidth=1.2, label=label)
                chosen = [(x, y) for x, y in points if x == gene.get("selected")]
                if chosen:
                    ax.plot([chosen[0][0]], [chosen[0][1]], "o", markersize=12, markerfacecolor="none",
                            markeredgecolor=color, markeredgewidth=1.6, zorder=4)
                drawn += 1
            ax.set_xscale("log")
            if rates:
                ax.set_xticks(rates)
                ax.xaxis.set_major_formatter("{x:g}")
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("learning rate")
            ax.set_ylabel(ylabel, fontsize=8)
            if panel.get("title"):
                ax.set_title(str(panel["title"]), fontsize=10)
            _grid_and_legend(ax, drawn, "no finished tuning training")
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


# -- difficulty curves -------------------------------------------------------------------------------
def powers_of_two(values: Sequence) -> bool:
    """Whether every value is a positive integer power of two (the curve's x axis is then log2)."""
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0 for v in values)


def plot_curve(result: dict, path: str | os.PathLike) -> Path:
    """``curve.png``: per gene a line through its mean accuracy at each value of the knob, each interval a band;
    chance dashed, the break threshold dotted; the x axis log2 when every value is a power of two."""
    values = list(result.get("values") or [])
    knob = str(result.get("knob", "knob"))
    with _figure(figsize=(8, 5.2), dpi=DPI) as (fig, ax):
        drawn = 0
        for i, gene in enumerate(result.get("genes") or []):
            rows = [r for r in gene.get("points") or [] if finite_or_none(r.get("mean")) is not None]
            rows.sort(key=lambda r: r["value"])
            if not rows:
                continue
            color = f"C{i % 10}"
            xs = [r["value"] for r in rows]
            ax.plot(xs, [r["mean"] for r in rows], "o-", color=color, markersize=4, linewidth=1.4,
                    label=_short(str(gene.get("name", "")), 48))
            band = [r for r in rows if r.get("ci_low") is not None and r.get("ci_high") is not None]
            if band:
                ax.fill_between([r["value"] for r in band], [max(0.0, r["ci_low"]) for r in band],
                                [min(1.0, r["ci_high"]) for r in band], color=color, alpha=0.18, linewidth=0)
            drawn += 1
        chance = sorted((p["value"], p["chance_accuracy"]) for p in result.get("points") or []
                        if finite_or_none(p.get("chance_accuracy")) is not None)
        if chance:
            ax.plot([x for x, _ in chance], [y for _, y in chance], "--", color="tab:gray", linewidth=1, label="chance")
        if finite_or_none(result.get("break_at")) is not None:
            ax.axhline(result["break_at"], color="black", linestyle=":", linewidth=0.8,
                       label=f"break threshold {result['break_at']:g}")
        if values and powers_of_two(values):
            ax.set_xscale("log", base=2)
        if values:
            ax.set_xticks(sorted(values))
            ax.xaxis.set_major_formatter("{x:g}")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(knob)
        seeds = len(result.get("seeds") or [])
        band = f", {percent(result.get('confidence', 0.95))} interval over {seeds} seeds" if seeds > 1 else ""
        ax.set_ylabel(f"validation accuracy (mean{band})", fontsize=9)
        m = result.get("model") or {}
        ax.set_title(f"{result.get('task')}: accuracy against {knob} ({m.get('d_model')}d x {m.get('n_layers')} layers, "
                     f"{result.get('steps')} steps)", fontsize=10)
        _grid_and_legend(ax, drawn)
    return save_figure(fig, path)


# -- learning curves ---------------------------------------------------------------------------------
CURVES_TOP = 5  # the best genes whose training curves are drawn (the baseline comes on top)


def plot_learning_curves(summary: RunSummary, path: str | os.PathLike, top: int = CURVES_TOP) -> Path:
    """``learning_curves.png``: the training-loss curve (mean over each log interval, a marker at every point) and
    validation-loss points (dashed, same colour) of the best ``top`` genes and the baseline; for a multi-fidelity
    run, a dotted line at every rung where the schedule cut the others short."""
    if summary.suite is not None:  # a gene trains once per point: there is no one curve per gene
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
        ax.text(0.5, 0.5, "A suite run trains each gene once per point: its curves are per point (evaluations.csv "
                "lists every training).", transform=ax.transAxes, ha="center", va="center", wrap=True)
        ax.set(xticks=[], yticks=[])
        return save_figure(fig, path)
    by_id = {r.get("id"): r for r in summary.evaluations}
    lines = []
    if summary.baseline is not None:
        base = next((r for r in summary.evaluations if r.get("role") == "baseline" and r.get("curve")), None)
        if base is not None:
            lines.append((f"baseline {summary.baseline['str']}", base["curve"], "black", ":", base.get("val_curve")))
    colors = plt.get_cmap("tab10").colors
    for i, row in enumerate(summary.top(top)):
        record = by_id.get(row["id"])
        if record is not None and record.get("curve"):
            lines.append((f"#{row['rank']} {row['str']}", record["curve"], colors[i % len(colors)], "-",
                          record.get("val_curve")))
    with _figure(figsize=FIGSIZE, dpi=DPI) as (fig, ax):
        if lines:
            for label, curve, color, style, val_curve in lines:
                steps, losses = zip(*curve)
                ax.plot(steps, losses, style, color=color, linewidth=1.6, marker="o", markersize=3, label=label)
                if val_curve:
                    steps, losses = zip(*val_curve)
                    ax.plot(steps, losses, "--", color=color, linewidth=1.0, marker="s", markersize=4, alpha=0.8)
            if any(line[4] for line in lines):  # one legend entry says what the dashed lines are
                ax.plot([], [], "--", color="tab:gray", marker="s", markersize=4, label="validation loss (dashed)")
            rungs = (summary.fidelity or {}).get("rungs") or []
            for j, steps in enumerate(rungs[:-1]):
                ax.axvline(steps, color="tab:gray", linestyle=":", linewidth=1,
                           label="rung cuts of the schedule" if j == 0 else None)
            values = [loss for line in lines for curve in (line[1], line[4] or []) for _, loss in curve]
            if _wide(values):
                ax.set_yscale("log")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7, frameon=False)  # below: hides no curve
        else:
            ax.text(0.5, 0.5, "No training curve stored yet.", transform=ax.transAxes, ha="center", va="center")
        ax.set(xlabel="Training step", ylabel="Loss (training: mean over each log interval)")
        ax.set_title(f"Learning curves: the best {min(top, len(summary.ranking))} genes and the baseline", fontsize=10)
        ax.grid(True, alpha=0.3)
    return save_figure(fig, path)


# -- long context ------------------------------------------------------------------------------------
def plot_long_context(rows: list[dict], path: str | os.PathLike) -> Path:
    """``long_context.png``: ms per training step and memory against the sequence length, one line per
    family (log-log axes: a slope of 1 is linear growth at a fixed token count per step)."""
    names = list(dict.fromkeys(r["name"] for r in rows))
    cpu = not str(rows[0].get("device", "cpu")).startswith("cuda") if rows else True
    memory_key = "step_memory_mb" if cpu else "peak_memory_mb"
    with _figure(1, 2, figsize=(12, 4.6), dpi=110) as (fig, axes):
        for ax, key, label in ((axes[0], "ms_per_step", "ms per training step"),
                               (axes[1], memory_key, "memory the step adds (MB, resident set)" if cpu
                                else "peak GPU memory allocated (MB)")):
            for name in names:
                points = [(r["seq_len"], r[key]) for r in rows if r["name"] == name and finite_or_none(r[key])]
                if points:
                    ax.plot(*zip(*points), marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set(yscale="log", xlabel="sequence length T (tokens per step fixed)", ylabel=label)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
        if rows:
            r = rows[0]
            fig.suptitle(f"Long context on {r['device']} ({r['precision']}, {r['threads']} threads): "
                         f"{r['batch_size'] * r['seq_len']} tokens per step")
    return save_figure(fig, path, dpi=110)


# -- several runs side by side (report.runs) -------------------------------------------------------
def plot_runs(result: dict, path: str | os.PathLike) -> Path:
    """The anytime curves (best perplexity against trainings spent) and, for multi-objective runs,
    every run's front on the first two objectives."""
    objectives = result.get("objectives")
    panels = 2 if objectives else 1
    with _figure(1, panels, figsize=(6.0 * panels, 4.2), dpi=DPI, squeeze=False) as (fig, axes):
        ax = axes[0][0]
        for i, run in enumerate(result["runs"]):
            ys = run["anytime"]
            xs = [x for x, y in zip(range(1, len(ys) + 1), ys) if y is not None]
            ax.step(xs, [y for y in ys if y is not None], where="post", color=f"C{i}",
                    label=f"{run['name']} ({run['strategy']})")
        bases = {run["baseline_perplexity"] for run in result["runs"] if run["baseline_perplexity"] is not None}
        for base in sorted(bases):
            ax.axhline(base, color="black", linestyle="--", linewidth=1, label="baseline" if base == min(bases) else None)
        ax.set(xlabel="search trainings spent", ylabel="best validation perplexity so far (search seed)")
        ax.set_title("Best found against budget", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        if objectives:
            ax = axes[0][1]
            x, y = objectives[0], objectives[1]
            for i, run in enumerate(result["runs"]):
                members = run.get("front") or []
                ax.step([p[x] for p in members], [p[y] for p in members], where="post", color=f"C{i}", marker="o",
                        markersize=4, label=f"{run['name']} (hv {number(run.get('hypervolume'), '.3f')})")
            ax.set(xlabel=f"{OBJECTIVE_LABELS.get(x, x)} (lower is better)",
                   ylabel=f"{OBJECTIVE_LABELS.get(y, y)} (lower is better)")
            ax.set_title("Pareto fronts", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    return save_figure(fig, path)


# -- the Pareto front of a multi-objective run -----------------------------------------------------
def plot_pareto(summary: RunSummary, path: str | os.PathLike) -> Path:
    """``pareto.png``: every finished search evaluation on the first two objectives (grey), the non-dominated ones
    on those two joined by a step line, the front over all objectives ringed when there are more, the baseline a
    star. With caps, trained genes over a cap are red crosses outside the front, and those refused before
    training are counted in the title. An axis spanning more than ``LOG_RATIO`` is logarithmic."""
    names = summary.objectives[:2]
    points = summary.search_points(names)  # the feasible ones (all in a run without caps)
    over = summary.search_points(names, feasible=False) if summary.constraints else []
    n_failed = len(summary.search_evaluations) - len(points) - len(over)
    never = len(summary.constraints["never_trained"]) if summary.constraints else 0
    with _figure(figsize=FIGSIZE, dpi=DPI) as (fig, ax):
        ax.set_xlabel(f"{OBJECTIVE_LABELS.get(names[0], names[0])} (lower is better)")
        ax.set_ylabel(f"{OBJECTIVE_LABELS.get(names[-1], names[-1])} (lower is better)")
        ax.set_title("Pareto front: " + " vs ".join(names) + f" ({len(points)} "
                     + ("feasible " if summary.constraints else "") + "evaluations"
                     + (f", {len(over)} over a cap" if over else "")
                     + (f", {n_failed} failed, not drawn" if n_failed else "")
                     + (f"; {never} refused before training" if never else "") + ")", fontsize=10)
        ax.grid(True, alpha=0.3)
        if not (points or over) or len(names) < 2:
            ax.text(0.5, 0.5, "No finished evaluation to draw yet.", transform=ax.transAxes, ha="center",
                    va="center")
            return save_figure(fig, path)
        xs, ys = zip(*(points + over))
        if over:
            ax.scatter([p[0] for p in over], [p[1] for p in over], s=26, marker="x", color="tab:red", alpha=0.8,
                       label=f"infeasible: over a cap ({len(over)})", zorder=2)
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=16, color="tab:gray", alpha=0.45,
                       linewidths=0, label="feasible evaluations" if summary.constraints else "evaluations", zorder=2)
            best = sorted({points[i] for i in front(points)})
            ax.step([p[0] for p in best], [p[1] for p in best], where="post", color="tab:blue", linewidth=1.8,
                    zorder=3)
            ax.scatter([p[0] for p in best], [p[1] for p in best], s=30, color="tab:blue", zorder=4,
                       label=f"Pareto front on these two ({len(best)})")
        if summary.pareto and summary.pareto["front"] and len(summary.objectives) > 2:
            ringed = [(m[names[0]], m[names[1]]) for m in summary.pareto["front"]]
            ax.scatter(*zip(*ringed), s=70, facecolors="none", edgecolors="tab:orange", zorder=5,
                       label=f"front over all {len(summary.objectives)} objectives ({len(ringed)})")
        base = (summary.pareto or {}).get("baseline")
        if base is not None:
            ax.scatter([base[names[0]]], [base[names[1]]], marker="*", s=160, color="black", zorder=6,
                       label=f"baseline {summary.baseline['str'] if summary.baseline else ''}".rstrip())
            xs, ys = xs + (base[names[0]],), ys + (base[names[1]],)
        for axis, values in (("x", xs), ("y", ys)):
            if _wide(values):
                (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        ax.legend(loc="best", fontsize=8, framealpha=0.85)
    return save_figure(fig, path)


def plot_program(text: str, path: str | os.PathLike, *, title: str = "") -> Path:
    """A program (its canonical text) as a graph: each distinct node once, inputs at the bottom, the root at the
    top, an arrow from each argument to each op that reads it."""
    from evo_attention.genes import canonical_program

    program = canonical_program(text)
    nodes = program.nodes()  # children before parents
    depth: dict[str, int] = {}
    for node in nodes:
        depth[node.text] = 0 if not node.args else 1 + max(depth[a.text] for a in node.args)
    levels: dict[int, list] = {}
    for node in nodes:
        levels.setdefault(depth[node.text], []).append(node)
    width = max(len(v) for v in levels.values())
    where = {node.text: ((i + 0.5) * width / len(row), level) for level, row in levels.items()
             for i, node in enumerate(row)}
    with _figure(figsize=(max(4.0, 1.4 * width), 0.9 * (len(levels) + 1))) as (fig, ax):
        for node in nodes:
            x, y = where[node.text]
            for arg in node.args:
                ax.annotate("", xy=(x, y - 0.18), xytext=where[arg.text], arrowprops=dict(arrowstyle="->", color="0.5"))
            label = node.op if node.op != "const" else node.text
            ax.text(x, y, label, ha="center", va="center", fontsize=9,
                    bbox=dict(boxstyle="round,pad=0.3", fc="white" if node.args else "0.9", ec="0.3"))
        ax.set_xlim(-0.2, width + 0.2)
        ax.set_ylim(-0.6, len(levels) - 0.4)
        ax.axis("off")
        ax.set_title(title or "\n".join(textwrap.wrap(program.text, 70)), fontsize=8)
        return save_figure(fig, path)

