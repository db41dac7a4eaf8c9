"""The evolution figure (``evolution_progress.png``), drawn with matplotlib's Agg backend.

It shows, per generation: every search evaluation as a faint point (the whole distribution),
failed evaluations as red crosses along the top edge, the population's best and mean perplexity,
the best so far, and the baseline as a labelled horizontal line. The y axis is logarithmic when
the perplexities span more than a factor of ``LOG_RATIO``. A run without a finished evaluation
gives a figure that says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display needed, safe in threads and on servers
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter  # noqa: E402

from .summary import RunSummary, failed, perplexity_of  # noqa: E402
from .tables import atomic_target  # noqa: E402

FIGSIZE = (8, 5)
DPI = 120
LOG_RATIO = 10.0
JITTER = 0.3  # total horizontal spread of the points of one generation


def _jitter(i: int, n: int) -> float:
    """A fixed (not random) offset of point ``i`` of ``n``, so the figure is reproducible."""
    return 0.0 if n < 2 else (i / (n - 1) - 0.5) * JITTER


def _title(summary: RunSummary) -> str:
    strategy = (summary.strategy or {}).get("name") if isinstance(summary.strategy, dict) else None
    data = (summary.data or {}).get("name") if isinstance(summary.data, dict) else None
    data = data or summary.config.get("data")
    parts = [p for p in (f"{strategy} search" if strategy else None, data) if p]
    return "Evolution progress" + (f" ({', '.join(parts)})" if parts else "")


def _legend(ax) -> None:
    """The legend below the axes, so that it never hides a point."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8, frameon=False)


def plot_evolution(summary: RunSummary, path: str | os.PathLike) -> Path:
    """Draw the evolution figure of ``summary`` into the PNG ``path``."""
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    try:
        _draw(ax, summary)
    except BaseException:
        plt.close(fig)
        raise
    return save_figure(fig, path)


def save_figure(fig, path: str | os.PathLike, tight: bool = True) -> Path:
    """Write ``fig`` as a PNG atomically (temp file, then rename) and close it."""
    try:
        if tight:
            fig.tight_layout()
        with atomic_target(path) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI)
    finally:
        plt.close(fig)
    return Path(path)


def _draw(ax, summary: RunSummary) -> None:
    ax.set_title(_title(summary))
    ax.set_xlabel("Generation")
    ax.set_ylabel("Validation perplexity (lower is better)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)

    by_generation: dict[int, list] = {}
    for record in summary.evaluations:
        if record.get("role") == "search" and record.get("generation") is not None:
            by_generation.setdefault(int(record["generation"]), []).append(record)
    ok_x, ok_y, fail_x = [], [], []
    for generation, records in sorted(by_generation.items()):
        for i, record in enumerate(records):
            x = generation + _jitter(i, len(records))
            if failed(record):
                fail_x.append(x)
            else:
                ok_x.append(x)
                ok_y.append(perplexity_of(record))

    generations = sorted(set(by_generation) | {h["generation"] for h in summary.history})
    if generations:
        ax.set_xlim(generations[0] - 0.5, generations[-1] + 0.5)
        if generations[-1] - generations[0] <= 20:
            ax.set_xticks(range(generations[0], generations[-1] + 1))
    history = [h for h in summary.history if h["best_perplexity"] is not None]
    baseline = summary.baseline["perplexity"] if summary.baseline else None
    values = ok_y + [h["best_perplexity"] for h in history] + ([baseline] if baseline else [])
    if summary.outcome != "ok":  # say plainly why there is no curve
        ax.text(0.5, 0.5, summary.statement, transform=ax.transAxes, ha="center", va="center",
                fontsize=12, wrap=True)
    if not values:
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
                   label=f"evaluations ({len(ok_x)})", zorder=2)
    if history:
        gens = [h["generation"] for h in history]
        ax.plot(gens, [h["best_perplexity"] for h in history], "o-", color="tab:blue",
                label="best of population", zorder=4)
        means = [(h["generation"], h["mean_perplexity"]) for h in history if h["mean_perplexity"] is not None]
        if means:
            ax.plot(*zip(*means), "s--", color="tab:orange", markersize=4, label="mean of population", zorder=3)
        ax.step(gens, [h["best_so_far"] for h in history], where="post", color="tab:green",
                linewidth=2.5, alpha=0.6, label="best so far", zorder=3)
    if baseline:
        ax.axhline(baseline, color="black", linestyle=":", linewidth=1.5,
                   label=f"baseline {summary.baseline['str']}: {baseline:.2f}", zorder=1)
    if fail_x:
        ax.scatter(fail_x, [0.97] * len(fail_x), transform=ax.get_xaxis_transform(), marker="x",
                   color="tab:red", alpha=0.8, label=f"failed ({len(fail_x)}, drawn at the top)", zorder=5)
    low, high = min(values), max(values)
    if low > 0 and high / low > LOG_RATIO:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    if summary.best is not None:
        ax.annotate(f"best {summary.best['perplexity']:.2f}",
                    (summary.best["generation"] or 0, summary.best["perplexity"]),
                    textcoords="offset points", xytext=(6, -12), fontsize=8, color="tab:blue")
    _legend(ax)
