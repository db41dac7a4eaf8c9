"""The figures of the analyses, drawn with matplotlib's Agg backend (no display needed).

- ``plot_samples``: per-seed values of each gene as a box with every point on it, the baseline
  first and its mean as a dotted line (``validation.png``).
- ``plot_contributions``: horizontal bars with confidence-interval error bars (``ablation.png``).
- ``plot_distribution``: the histogram of every finished search evaluation, with the baseline and
  the best value marked (``evaluation_distribution.png`` of the report).
- ``plot_head_grid``: one layer's attention weights, a heatmap per head (``attention_layerN.png``).

Every function writes the PNG atomically and closes its figure. Jitter is deterministic, so the
same input draws the same figure.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..report.plots import save_figure as _save  # noqa: E402

DPI = 120
TOKEN_LABELS_MAX = 40  # tokens are written on the heatmap axes up to this length
# boxplot's ``vert`` became ``orientation`` in matplotlib 3.10
_HORIZONTAL = ({"orientation": "horizontal"} if tuple(int(p) for p in matplotlib.__version__.split(".")[:2]) >= (3, 10)
               else {"vert": False})


def _offsets(n: int, spread: float = 0.25) -> np.ndarray:
    return np.zeros(n) if n < 2 else (np.arange(n) / (n - 1) - 0.5) * spread


def plot_samples(groups: Sequence[dict], path: str | os.PathLike, *, xlabel: str, title: str,
                 ci_label: str = "confidence interval of the mean") -> Path:
    """``groups``: ``{"label", "values", "baseline": bool, "failed": int, "ci": (low, high)}`` each,
    drawn top to bottom in the given order: a box, every value as a point, the mean as a diamond and
    its interval as a bar under the box. None values are skipped (their count shows as failed)."""
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
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(0.4, n + 0.6)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.plot([], [], "D", color="tab:orange", label="mean")
    ax.plot([], [], "-", color="tab:orange", linewidth=2.5, label=ci_label)
    ax.plot([], [], ":", color="black", label="baseline mean")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.3 / n), ncol=3, fontsize=7, frameon=False)
    return _save(fig, path)


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
    ax.set_yticks(ys)
    ax.set_yticklabels([item["label"] for item in items], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    for kind, text in (("remove", "removed from the gene"), ("add", "added to the baseline"),
                       ("total", "whole gene vs baseline")):
        if any(item.get("kind") == kind for item in items):
            ax.barh([np.nan], [np.nan], color=colors[kind], label=text)
    ax.legend(loc="best", fontsize=7)
    return _save(fig, path)


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
    else:
        ax.text(0.5, 0.5, "No finished evaluation.", transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks([])
    if values:
        ax.set_ylabel("Evaluations")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.set_yticks([])
    ax.set_xlabel(xlabel)
    ax.set_title(title + (f" ({failed} failed, not shown)" if failed else ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def plot_head_grid(weights: np.ndarray, path: str | os.PathLike, *, title: str,
                   tokens: Sequence[str] | None = None, head_titles: Sequence[str] | None = None) -> Path:
    """One layer's weights ``[H, T, T]`` (query rows, key columns) as a grid of heatmaps.

    Exact zeros are drawn white, every positive weight on a colour scale from light to dark, so
    a sparse pattern is visible as such; the causally masked future is grey. Tokens label the
    axes when there are at most ``TOKEN_LABELS_MAX`` of them.
    """
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
            ax.set_xticks(range(t))
            ax.set_yticks(range(t))
            ax.set_xticklabels(tokens, rotation=90, fontsize=font)
            ax.set_yticklabels(tokens, fontsize=font)
        else:
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel("query position", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.7, label="weight (white: exactly 0; grey: future)")
    return _save(fig, path, tight=False)
