"""Learning-rate schedules: one table, ``SCHEDULES``; a schedule is one entry (``register_schedule``).

The choices and help of ``lr_schedule``, the checks of a warm-up, the decay fraction's place in a
key and a record, and the words of ``train.config.describe_schedule`` all read the table.
``scheduled_rate`` gives a schedule that takes a warm-up ``lr * (step + 1) / W`` for
``step < W = warmup_steps``, then the schedule's ``rate`` (``T``: the steps the schedule spans, a
partial training's budget):

- ``constant``: ``lr`` at every step (no warm-up);
- ``cosine``: ``lr * 0.5 * (1 + cos(pi * min(1, (step - W) / max(1, T - W))))``: 0 at ``T``;
- ``wsd`` (warm-up, stable, decay), with ``D = steps_of(lr_decay_fraction, T)`` decay steps: ``lr``
  while ``step < T - D``, then ``lr * max(0, T - step) / D``: ``lr / D`` at the last step, 0 at ``T``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


def steps_of(fraction: float, steps: int) -> int:
    """``fraction`` of ``steps`` as whole steps, rounded to the nearest (halves up): the warm-up of a
    ``warmup`` fraction and the decay of wsd's ``lr_decay_fraction``."""
    return int(math.floor(fraction * steps + 0.5))


@dataclass(frozen=True)
class Schedule:
    """``rate(recipe, step, total_steps)``: the rate after the warm-up (``recipe``: a ``TrainSpec``);
    ``help``: its words in the ``--lr-schedule`` help; ``warmup``: whether the warm-up comes first;
    ``decay``: whether it reads ``lr_decay_fraction`` (only then does the fraction join a key or a
    record); ``words(steps or None, decay_fraction)``: what ``describe_schedule`` says after the warm-up."""

    rate: Callable[..., float]
    help: str
    warmup: bool = True
    decay: bool = False
    words: Callable[[int | None, float], str] = lambda steps, decay_fraction: ""


def _cosine(recipe, step: int, total_steps: int) -> float:
    progress = (step - recipe.warmup_steps) / max(1, total_steps - recipe.warmup_steps)
    return recipe.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _wsd(recipe, step: int, total_steps: int) -> float:
    decay = steps_of(recipe.lr_decay_fraction, total_steps)
    if decay == 0 or step < total_steps - decay:
        return recipe.learning_rate
    return recipe.learning_rate * max(0, total_steps - step) / decay


def _wsd_words(steps: int | None, fraction: float) -> str:
    if steps is None:
        return f"stable, linear decay to 0 over the last {fraction:g} of the steps"
    decay = steps_of(fraction, steps)
    return f"stable to step {steps - decay}, linear decay to 0 over the last {decay} steps (decay fraction " \
           f"{fraction:g})"


SCHEDULES: dict[str, Schedule] = {
    "constant": Schedule(lambda recipe, step, total_steps: recipe.learning_rate, "the original's; no warm-up",
                         warmup=False),
    "cosine": Schedule(_cosine, "linear warm-up, then a cosine decay to 0", words=lambda steps, _:
                       f"cosine decay to 0 at step {steps if steps is not None else 'the last'}"),
    "wsd": Schedule(_wsd, "linear warm-up, stable, then a linear decay to 0 over the last --decay-fraction of the "
                    "steps", decay=True, words=_wsd_words),
}


def register_schedule(name: str, schedule: Schedule) -> Schedule:
    """Make ``schedule`` the one named ``name`` (``lr_schedule: name``)."""
    SCHEDULES[name] = schedule
    return schedule


def scheduled_rate(recipe, step: int, total_steps: int) -> float:
    """The learning rate of step ``step`` (0-based) of a training whose schedule spans ``total_steps``."""
    schedule = SCHEDULES[recipe.lr_schedule]
    if schedule.warmup and step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    return schedule.rate(recipe, step, total_steps)


def warmup_schedules() -> tuple:
    return tuple(name for name, s in SCHEDULES.items() if s.warmup)


def takes_warmup(name: str) -> bool:
    return name in SCHEDULES and SCHEDULES[name].warmup


def uses_decay(name: str) -> bool:
    return name in SCHEDULES and SCHEDULES[name].decay


def alternatives(words) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    words = list(words)
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else "".join(words)


def schedules_help() -> str:
    return alternatives(f"{name} ({s.help})" for name, s in SCHEDULES.items())
