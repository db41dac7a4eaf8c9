"""``evo-attention fitness-check``: can this fitness see the improvements a search should find?

    evo-attention fitness-check --suite recall-cpu --preset quick --seeds 10
    evo-attention fitness-check --preset lm-fitness --data-dir ../shared/data/wikitext-2 --lr 4e-3
    evo-attention fitness-check --data "mqar:seq_len=64,vocab=64,pairs=8" --preset quick \\
        --improvement "shift=dot|softmax|none|fixed|bias|0.00|dconv=2"

Trains the vanilla gene and each known improvement (``--improvement``, repeatable; default by
fitness: the output gate on language, dconv=3 and softmax over linear attention on tasks) on
``--seeds`` seeds at the vanilla gene's rate: ``--lr`` when given, else its best of ``--lr-grid``
on tuning seeds. Prints the vanilla gene per point and one verdict per improvement, and writes
fitness_check.json and fitness_check.md into ``--out`` (``studies.fitness``); a search on the same
fitness prints the verdict of the newest check.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from evo_attention.cli.common import (add_executor_flags, add_training_flags, config_from_args, executor_from_args,
                                      given, out_arg, suite_text)
from evo_attention.cli.validate import add_grid_flags, add_suite_flag
from evo_attention.util.errors import UserError
from evo_attention.util.progress import log


def evaluations_flag(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive integers such as 1,2,3,5")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"{text!r} names a number twice: give each number of evaluations once")
    return values


def register(subparsers) -> None:
    from evo_attention.studies.fitness import DEFAULT_EVALUATIONS, DEFAULT_GRID, DEFAULT_SEEDS

    p = subparsers.add_parser("fitness-check", help="measure whether a fitness can see known improvements",
                              description="Train the vanilla gene and known improvements on one fitness (a task, a "
                                          "suite or a language model) at the vanilla gene's tuned rate, and say how "
                                          "reliably one evaluation ranks each improvement the right way round.")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, metavar="N",
                   help=f"seeds per gene, seed+1 .. seed+N (default {DEFAULT_SEEDS})")
    p.add_argument("--improvement", action="append", metavar="SPEC",
                   help="a known improvement: NAME (a default one), NAME=GENE (better than the vanilla gene) or "
                        "NAME=GENE>GENE; repeatable (default: the output gate on language, dconv=3 and softmax over "
                        "linear on tasks)")
    p.add_argument("--evaluations", type=evaluations_flag, default=DEFAULT_EVALUATIONS, metavar="K,K,...",
                   help="also give the probability for K evaluations averaged (default "
                        f"{','.join(map(str, DEFAULT_EVALUATIONS))})")
    p.add_argument("--out", default="runs/fitness-check", help="output directory; it keeps the trainings in a store "
                   "of its own, so a repeat trains nothing (default runs/fitness-check)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_suite_flag(p, "gene")
    add_grid_flags(p, "vanilla gene")
    add_training_flags(p)
    add_executor_flags(p)
    p.set_defaults(func=cmd_fitness_check)
    p.epilog = f"Without --lr the rate is the vanilla gene's best of --lr-grid (default " \
               f"{','.join(f'{r:g}' for r in DEFAULT_GRID)})."


def cmd_fitness_check(args) -> int:
    from evo_attention.report.studies.fitness import points_table
    from evo_attention.studies.fitness import DEFAULT_GRID, run_fitness_check

    if args.seeds < 2:
        raise UserError(f"--seeds must be at least 2 (a spread needs two), got {args.seeds}")
    config = config_from_args(args)
    on = suite_text(args, config) or f"data {config.data}, {config.train_steps} steps"
    out = out_arg(args, kind="a fitness check", study="fitness-check")
    lr = config.learning_rate if given("--lr") else None
    grid = args.lr_grid or DEFAULT_GRID
    log(f"fitness check: {on}; {args.seeds} seeds at " + (f"lr {lr:g}" if lr is not None else
        f"the vanilla gene's best of {','.join(f'{r:g}' for r in grid)} on {args.tuning_seeds} tuning seeds"),
        args.quiet)
    command = shlex.join(["evo-attention", *sys.argv[1:]]) if sys.argv[1:2] == ["fitness-check"] else None
    with executor_from_args(args, config) as executor:
        result = run_fitness_check(config, seeds=args.seeds, lr=lr, lr_grid=grid, n_tuning_seeds=args.tuning_seeds,
                                   improvements=args.improvement, evaluations=args.evaluations, out_dir=out,
                                   executor=executor, quiet=args.quiet, command=command)
    if not args.quiet:
        print(points_table(result))
    for verdict in result.verdicts:
        print(verdict)
    log(f"results in {out}: fitness_check.json, fitness_check.md", args.quiet)
    return 0
