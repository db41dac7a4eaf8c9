"""``evo-attention transfer``: retrain genes and the baseline at a ladder of model sizes.

    evo-attention transfer --from-run runs/quick --top 2 --sizes 64x2,128x4 --steps 400 --seeds 3
    evo-attention transfer --genes "dot|sparsemax|none|fixed" --preset quick --sizes 128x2,256x4 \\
        --tokens-per-param 20 --block llama

The reference is the search size (the run's d_model x layers, or the configured one with
--genes); every other size is compared with it. The seeds are ``seed + 1 ... seed + N`` as for
``validate``, never the search seed. Every flag that sets the model or the training applies at
every size, except the size itself (--sizes), the heads (d_model / 32 unless --heads) and the
steps (--steps or --tokens-per-param). With --lr-grid the grid is tuned at every size: each gene
and the baseline are compared at their own best rate at that size. ``--dry-run`` prints the ladder
and a wall-time estimate from step times measured here, and trains nothing.
"""

from __future__ import annotations

from evo_attention.cli.validate import (add_analysis_flags, add_match_flag, analysis_setup, grid_text, log_outputs,
                                        note_replaced, run_genes, run_study, study_setup)
from evo_attention.util.errors import UserError
from evo_attention.util.format import human_seconds, markdown_table
from evo_attention.util.progress import log


def cmd_transfer(args) -> int:
    from evo_attention.report import load_run
    from evo_attention.studies.transfer import plan, run_transfer, write_transfer

    summary = load_run(args.from_run) if args.from_run else None
    genes = run_genes(args, summary, args.top, verb="transfer")
    budget = dict(sizes=args.sizes, steps=args.size_steps, tokens_per_param=args.tokens_per_param, heads=args.heads)
    if args.dry_run:
        if args.match_params:
            raise UserError("--dry-run does not time the matched baselines of --match-params: drop one of them")
        return dry_run_transfer(args, genes, budget)
    # every bad size, budget or head count is refused before any file is written or data loaded
    config, data, store, out, search_seed = analysis_setup(args, "runs/transfer",
                                                           check=lambda c: plan(c, genes, **budget))
    rungs = plan(config, genes, **budget)
    note_replaced(out, "transfer", study_setup(args, "transfer", config, data, store, None, search_seed), genes,
                  sizes=[r.label for r in rungs], steps=[r.config.train_steps for r in rungs])
    log(f"carrying {len(genes)} gene(s) and the baseline across {len(rungs)} sizes "
        f"({', '.join(r.label for r in rungs)}; reference {rungs[0].label}) on {data.name} in the {config.block} "
        f"block: {args.seeds} seeds each ({config.seed + 1}..{config.seed + args.seeds}){grid_text(args, config.seed)}"
        f"{'; each against a parameter-matched baseline at every size' if args.match_params else ''}",
        args.quiet)
    result = run_study(args, "transfer", config, data, store, search_seed,
                       lambda setup: run_transfer(setup, genes, **budget))
    paths = write_transfer(result, out)
    log(result.headline.replace("**", ""))
    for gene, verdict in result.verdicts.items():
        log(f"  {gene} at {result.largest}: {verdict}")
    log_outputs(result, paths, args.from_run)
    return 0


def dry_run_transfer(args, genes, budget) -> int:
    """``--dry-run``: the ladder, its budgets and trainings, and the wall time estimated from step
    times measured here; nothing is trained or written."""
    from evo_attention.report.studies.common import schedule_text
    from evo_attention.studies.transfer import dry_run, plan

    config, data, _, _, _ = analysis_setup(args, "runs/transfer", check=lambda c: plan(c, genes, **budget), write=False)
    grid = tuple(args.lr_grid or ())
    if not args.quiet:
        print(f"timing {len(genes) + 1} genome(s) at each size on this machine (a few training steps each)...",
              flush=True)
    p = dry_run(config, data, genes, **budget, n_seeds=args.seeds, lr_grid=grid, n_tuning_seeds=args.tuning_seeds)
    headers = ["Size", "Heads", "FFN", "Params (baseline)", "Steps", "Tokens / training", "Trainings",
               "s / step (measured)", "Estimated time"]
    rows = []
    for r in p["sizes"]:
        per_step = sorted(r["seconds_per_step"].values())
        span = f"{per_step[0]:.3g}" if per_step[0] == per_step[-1] else f"{per_step[0]:.3g}-{per_step[-1]:.3g}"
        rows.append([r["size"] + (" (reference)" if r["reference"] else ""), str(r["n_heads"]), str(r["d_ff"]),
                     f"{r['params']:,}", f"{r['steps']:,}", f"{r['tokens']:,}", str(r["trainings"]), span,
                     _duration(r["estimated_s"])])
    budget_rule = (f"{args.tokens_per_param:g} tokens per baseline parameter" if args.tokens_per_param is not None
                   else "--steps per size" if args.size_steps else f"the configured {config.train_steps} steps")
    per_gene = f"{args.seeds} seeds" + (f" + {len(grid)} rates x {args.tuning_seeds} tuning seeds" if grid else "")
    print(f"transfer dry run (nothing trained or written): {len(genes)} gene(s) and the baseline on {data.name}, "
          f"{config.block} block, {per_gene} per genome and size; steps from {budget_rule}")
    print(markdown_table(headers, rows, "lrrrrrrrr").rstrip())
    reference = next(r for r in p["sizes"] if r["reference"])
    print(f"learning-rate schedule at the reference size: "
          f"{schedule_text(config.to_dict(), reference['steps'], genes=genes, grid=grid)}")
    print(f"total: {p['trainings']} trainings, estimated {_duration(p['estimated_s'])} one at a time on "
          f"{p.get('device')} ({p.get('precision')}, {p.get('threads')} threads)")
    print(f"estimate: {p['timing']}; evaluation, data loading and model building are not included, and trainings "
          "a run store holds already are not subtracted; parallel workers (--workers) divide it at best")
    return 0


def _duration(seconds) -> str:
    return "-" if seconds is None else human_seconds(seconds)


def register(subparsers) -> None:
    from evo_attention.studies.transfer import DEFAULT_SIZES, DEFAULT_TRANSFER_SEEDS, HEAD_DIM

    # "resolve": this command's --steps (a list) and --seeds (another default) replace the shared ones
    p = subparsers.add_parser("transfer", conflict_handler="resolve",
                              help="retrain genes and the baseline at larger model sizes: does the advantage hold, "
                                   "shrink, vanish or reverse with scale?")
    p.add_argument("--genes", help="comma-separated gene keys, e.g. 'dot|sparsemax|output_gate|learned'")
    p.add_argument("--top", type=int, default=3, help="with --from-run and no --genes: the best K genes (default 3)")
    add_analysis_flags(p, "runs/transfer")
    add_match_flag(p, " at every size")
    s = p.add_argument_group("sizes and budgets")
    s.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"the ladder, D_MODELxLAYERS comma-separated (default {DEFAULT_SIZES}); the search size is "
                        f"added first when missing. Heads: d_model/{HEAD_DIM} (the search's own at the search size) "
                        "unless --heads")
    s.add_argument("--steps", dest="size_steps", metavar="N[,N...]",
                   help="training steps: one number for every size, or one per size of --sizes (an added search "
                        "size keeps the search's steps); default the configured steps")
    s.add_argument("--tokens-per-param", type=float, metavar="R",
                   help="instead of --steps: train R tokens per parameter of the baseline at each size")
    s.add_argument("--dry-run", action="store_true",
                   help="print the ladder (parameters, steps, tokens and trainings per size) and the wall time "
                        "estimated from a few training steps of each gene timed here, then exit: nothing is trained "
                        "or written")
    s.add_argument("--seeds", type=int, default=DEFAULT_TRANSFER_SEEDS,
                   help=f"trainings per gene and size, with seeds seed+1 .. seed+N (default {DEFAULT_TRANSFER_SEEDS}; "
                        "never the search seed)")
    p.set_defaults(func=cmd_transfer)
