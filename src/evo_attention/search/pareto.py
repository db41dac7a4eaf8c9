"""Pareto dominance, non-dominated sorting (Deb et al. 2002), crowding distance and hypervolume: the
one home of the multi-objective arithmetic (the strategies' ranking, ``nsga2``, the report, ``status``).

Every objective is minimised. A *point* is a sequence of floats; a point with a non-finite value
(a failed training, or a cost the record lacks) takes part in no front: ``pareto_order`` puts such
points after every finite one, and ``front`` and ``hypervolume`` ignore them. ``hypervolume_share``
reads the same whatever the units (perplexity, parameters, milliseconds).
"""

from __future__ import annotations

import math
from typing import Sequence

Point = Sequence[float]
REFERENCE_MARGIN = 0.1


def finite(point: Point) -> bool:
    return all(math.isfinite(v) for v in point)


def dominates(a: Point, b: Point) -> bool:
    """True when ``a`` is no worse than ``b`` in every objective and better in one."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def fronts(points: Sequence[Point]) -> list[list[int]]:
    """Indices of the finite ``points`` by front (front 0: the non-dominated; front 1: those dominated
    only by front 0; ...), each front in index order; equal points share a front."""
    idx = [i for i, p in enumerate(points) if finite(p)]
    dominated_by: dict[int, list[int]] = {i: [] for i in idx}  # i -> the points i dominates
    count = {i: 0 for i in idx}  # how many points dominate i
    for n, i in enumerate(idx):
        for j in idx[n + 1:]:
            if dominates(points[i], points[j]):
                dominated_by[i].append(j)
                count[j] += 1
            elif dominates(points[j], points[i]):
                dominated_by[j].append(i)
                count[i] += 1
    out = []
    current = [i for i in idx if count[i] == 0]
    while current:
        out.append(sorted(current))
        following = []
        for i in current:
            for j in dominated_by[i]:
                count[j] -= 1
                if count[j] == 0:
                    following.append(j)
        current = following
    return out


def front(points: Sequence[Point]) -> list[int]:
    """Indices of the non-dominated finite points (in index order)."""
    found = fronts(points)
    return found[0] if found else []


def crowding(points: Sequence[Point], members: Sequence[int]) -> dict[int, float]:
    """Crowding distance of each index in ``members`` (one front): the sum over objectives of the gap
    between its two neighbours over the front's range; each objective's extremes get ``inf``; 0 for
    every point with one objective."""
    distance = {i: 0.0 for i in members}
    dims = len(points[members[0]]) if members else 0
    for d in range(dims if dims >= 2 else 0):
        ordered = sorted(members, key=lambda i: (points[i][d], i))
        low, high = points[ordered[0]][d], points[ordered[-1]][d]
        distance[ordered[0]] = distance[ordered[-1]] = math.inf
        if high <= low:
            continue
        for before, i, after in zip(ordered, ordered[1:], ordered[2:]):
            distance[i] += (points[after][d] - points[before][d]) / (high - low)
    return distance


def pareto_order(points: Sequence[Point], ties: Sequence | None = None) -> list[int]:
    """Indices of ``points`` best first: by front, then by crowding distance (larger first), then by
    ``ties`` (e.g. (first objective, gene key); default: the index); points that are not finite last,
    in ``ties`` order."""
    ties = list(range(len(points))) if ties is None else list(ties)
    rank: dict[int, tuple] = {}
    for level, members in enumerate(fronts(points)):
        distance = crowding(points, members)
        for i in members:
            rank[i] = (0, level, -distance[i])
    last = (1, 0, 0.0)
    return sorted(range(len(points)), key=lambda i: (rank.get(i, last), ties[i]))


def hypervolume(points: Sequence[Point], reference: Point) -> float:
    """The volume dominated by the finite ``points`` inside the box bounded by ``reference`` (exact,
    by slicing along the last objective: fine for a search's few dozen points)."""
    inside = [tuple(float(v) for v in p) for p in points if finite(p) and all(x < r for x, r in zip(p, reference))]
    return _volume(inside, tuple(float(r) for r in reference))


def _volume(points: list[tuple], reference: tuple) -> float:
    if not points:
        return 0.0
    if len(reference) == 1:
        return reference[0] - min(p[0] for p in points)
    points = [points[i] for i in front(points)]
    points.sort(key=lambda p: p[-1])
    volume = 0.0
    for n, p in enumerate(points):
        upper = points[n + 1][-1] if n + 1 < len(points) else reference[-1]
        if upper > p[-1]:  # the slab between this point's and the next point's last objective
            volume += (upper - p[-1]) * _volume([q[:-1] for q in points[: n + 1]], reference[:-1])
    return volume


def hypervolume_share(points: Sequence[Point], ideal: Point, reference: Point) -> float:
    """``hypervolume`` over the volume of the box from ``ideal`` to ``reference`` (in [0, 1] when
    ``ideal`` is no worse than any point)."""
    box = math.prod(float(r) - float(i) for i, r in zip(ideal, reference))
    return hypervolume(points, reference) / box if box > 0 else 0.0


def bounds(points: Sequence[Point], margin: float = REFERENCE_MARGIN) -> tuple[tuple, tuple] | None:
    """``(ideal, reference)`` of the finite ``points`` (None without one): the best value of each
    objective, and the worst plus ``margin`` of its range (of its value, without a range), so the
    extreme members of a front still add volume."""
    usable = [p for p in points if finite(p)]
    if not usable:
        return None
    ideal, reference = [], []
    for d in range(len(usable[0])):
        low, high = min(p[d] for p in usable), max(p[d] for p in usable)
        span = high - low if high > low else (abs(high) or 1.0)
        ideal.append(float(low))
        reference.append(float(high + margin * span))
    return tuple(ideal), tuple(reference)
