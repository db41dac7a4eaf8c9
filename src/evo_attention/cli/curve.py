"""``evo-attention curve``: accuracy against a knob of a generated task, per gene, with seeds.

    evo-attention curve --genes baseline,linear,"dot|softmax|none|fixed|bias|0.10|win=8" \\
        --data mqar:seq_len=128,vocab=128 --knob pairs=4,8,16,32 --seeds 3 --steps 600 --preset quick

For every value of ``--knob`` the data is ``--data`` with the knob set inline; every gene (compare's
names or gene strings) is trained on it with the seeds ``seed + 1 ... seed + N``. The trainings are
kept in a run store in ``--out``, so a repeat trains nothing and an interrupted curve resumes.
Writes curve.json, curve.md and curve.png into ``--out`` (see ``studies.curves``). With ``--lr-grid``
each gene trains at each point at its own best rate of the grid, chosen by accuracy on the tuning
seeds ``seed + 1001 ...``. On a generated task the named configurations train without attention
dropout; a gene string is used as written. Without ``--vocab-size`` (from a flag, a preset or a
config file) a task's vocabulary is its own default.
"""

from __future__ import annotations

from pathlib import Path

from evo_attention.cli.common import (add_executor_flags, add_training_flags, config_from_args, executor_from_args,
                                      given, out_arg)
from evo_attention.cli.validate import add_grid_flags, add_match_flag, log_selected_rates
from evo_attention.report.attachments import CURVE_RESULTS
from evo_attention.util.errors import UserError
from evo_attention.util.progress import log


def register(subparsers) -> None:
    p = subparsers.add_parser("curve", help="accuracy against a knob of a generated task (mqar, mad:TASK, a registered one) per gene",
                              description="Train each gene at every value of one knob of a generated task (the "
                                          "data name with the knob set inline), with seeds, and draw its accuracy "
                                          "against the knob: where each mechanism breaks.")
    p.add_argument("--genes", metavar="LIST",
                   help="comma-separated names (as compare --list shows them) and/or gene strings (required unless "
                        "--plan names them)")
    p.add_argument("--knob", metavar="NAME=V1,V2,...",
                   help="the knob to sweep and its values, from easy to hard, e.g. pairs=4,8,16,32 (not also inline "
                        "in --data)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="train each gene at each value with N seeds (seed+1 .. seed+N); intervals need 2 (default 1)")
    p.add_argument("--break-at", type=float, metavar="ACC",
                   help="a gene breaks at the first value where its mean accuracy falls below ACC (default 0.5)")
    p.add_argument("--solve-threshold", type=float, metavar="A",
                   help="a seed solves a point when its accuracy is >= A (above 1/pairs): solve counts with exact "
                        "intervals, Fisher's test against the baseline (or the first gene) with Holm, and where "
                        "each gene's solve rate falls below one half")
    p.add_argument("--solve-test", choices=["fisher", "barnard"], default="fisher",
                   help="with --solve-threshold: the exact test of two solve rates (default fisher)")
    add_match_flag(p, " at every point", "the reference gene (the one named baseline, else the first)")
    add_grid_flags(p, "gene at every point")
    p.add_argument("--plan", metavar="FILE",
                   help="run a registered curve plan (YAML: genes, knob, seeds, solve_threshold, alpha, test; see "
                        "docs/validation.md); its values replace --seeds, --solve-threshold and --solve-test, and a "
                        "family change after results exist in --out is refused unless the plan records it as an "
                        "amendment with its time")
    p.add_argument("--out", default="runs/curve", help="output directory (default runs/curve); it keeps the "
                   "trainings in a store of its own (run.db), so a repeat trains nothing")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_training_flags(p)
    add_executor_flags(p)
    p.set_defaults(func=cmd_curve)


def apply_curve_plan(args):
    """With --plan FILE: the curve plan (``studies.plan``), its family set into the flags it fixes
    (genes, knob, seeds, solve threshold and test); None without one."""
    if not args.plan:
        return None
    from evo_attention.studies.plan import load_plan

    for flag, value in (("--genes", args.genes), ("--knob", args.knob)):
        if value:
            raise UserError(f"--plan names the genes and the knob it sweeps: drop {flag}")
    fixed = [flag for flag in ("--seeds", "--solve-threshold", "--solve-test") if given(flag)]
    if fixed:
        raise UserError(f"--plan fixes {fixed[0]}: drop {fixed[0]}, or amend the plan", setting="plan")
    plan = load_plan(args.plan, study="curve")
    family = plan.family()
    args.genes, args.knob, args.seeds = ",".join(family["genes"]), family["knob"], family["seeds"]
    args.solve_threshold, args.solve_test = family["solve_threshold"], family["test"]
    return plan


def cmd_curve(args) -> int:
    from evo_attention.report.studies.common import partial_note
    from evo_attention.report.studies.curves import solve_break_text
    from evo_attention.studies.curves import (DEFAULT_BREAK_AT, check_break_at, check_solve_threshold, gene_entries,
                                              parse_knob, plan_points, run_curve)

    plan = apply_curve_plan(args)
    if plan is None and given("--solve-test") and args.solve_threshold is None:
        raise UserError("--solve-test compares solve rates, which need --solve-threshold (the accuracy that counts "
                        "as solved, e.g. 0.9)", setting="solve_test")
    if not args.genes or not args.knob:
        raise UserError("curve needs --genes LIST and --knob NAME=V1,V2,... (or --plan FILE naming them)")
    config = config_from_args(args)
    if args.seeds < 1:
        raise UserError(f"--seeds must be a positive integer, got {args.seeds}")
    break_at = check_break_at(DEFAULT_BREAK_AT if args.break_at is None else args.break_at)
    knob, values = parse_knob(args.knob)
    entries = gene_entries(args.genes, config)
    task, points = plan_points(config, knob, values)  # every check before the executor starts
    check_solve_threshold(args.solve_threshold, points, knob)
    out = out_arg(args, kind="a curve", study="curve")
    from evo_attention.studies.plan import check_registration, check_unplanned

    if plan is not None:  # before anything trains: a plan's result is replaced only by its plan, as it allows
        check_registration(plan, out)
    else:
        check_unplanned(Path(out) / CURVE_RESULTS)
    log(f"curve of {len(entries)} gene(s) x {len(points)} values of {knob} x {args.seeds} seed(s) "
        f"({config.seed + 1}..{config.seed + args.seeds}) on {task}, {config.d_model}d x {config.n_layers} layers x "
        f"{config.n_heads} heads, {config.train_steps} steps of batch {config.batch_size}", args.quiet)
    with executor_from_args(args, config) as executor:
        result = run_curve(config, entries, knob, values, seeds=args.seeds, out_dir=out, break_at=break_at,
                           executor=executor, quiet=args.quiet, solve_threshold=args.solve_threshold,
                           solve_test=args.solve_test, match_params=args.match_params,
                           confidence=0.95 if plan is None else 1.0 - plan.family()["alpha"],
                           plan=None if plan is None else plan.record(), lr_grid=args.lr_grid,
                           n_tuning_seeds=args.tuning_seeds)
    for grid in result.grids or []:  # with a learning-rate grid: each gene's selected rate per point
        if grid.get("genes"):
            log_selected_rates(grid["genes"], grid["rates"], f" at {knob}={grid['value']}", args.quiet)
    for gene in result.genes:
        where = (f"breaks at {knob}={gene['breaks_at']}" if gene["breaks_at"] is not None
                 else "holds" if gene["holds"] else "no break among the values with a result")
        means = ", ".join("-" if r["mean"] is None else f"{r['mean']:.3f}" for r in gene["points"])
        log(f"{gene['name']}: {where} (mean accuracy {means})", args.quiet)
        if result.solve is not None:
            counts = ", ".join(f"{r['solve']['solved']}/{r['solve']['n']}" for r in gene["points"])
            log(f"  solved {counts}; solve rate below one half at {solve_break_text(gene, knob)}", args.quiet)
    if partial := partial_note(result):
        log(partial, args.quiet)
    log(f"results in {out}: curve.json, curve.md, curve.png", args.quiet)
    return 0 if any(r["mean"] is not None for g in result.genes for r in g["points"]) else 1
