"""``evo-attention ablate``: what each of a gene's differences from the baseline contributes.

    evo-attention ablate --from-run runs/quick --seeds 5        # the run's best gene
    evo-attention ablate --gene "dot|sparsemax|output_gate|learned" --preset quick
    evo-attention ablate --gene "dot|sparsemax|output_gate|learned" --preset quick --lr-grid 5e-4,1e-3,2e-3,4e-3

With ``--lr-grid`` every variant (the baseline included) is trained at its own best rate of the grid.
"""

from __future__ import annotations

from evo_attention.util.errors import UserError
from evo_attention.util.progress import log
from evo_attention.cli.common import load_run_plugins
from evo_attention.cli.validate import (add_analysis_flags, add_baseline_flag, analysis_setup, grid_text, log_outputs,
                                        note_replaced, note_unfinished, run_study, study_setup)


def cmd_ablate(args) -> int:
    from evo_attention.report.studies.ablation import contribution_lines
    from evo_attention.studies.ablation import ablation_variants, run_ablation, write_ablation
    from evo_attention.genes import AttentionGene
    from evo_attention.report import load_run

    if args.gene is not None:
        gene = AttentionGene.parse(args.gene)
    elif args.from_run:
        summary = load_run(args.from_run)
        if summary.best_gene is None:
            raise UserError(f"the run in {args.from_run} has no finished search evaluation: let it run, or give --gene")
        load_run_plugins(args.from_run, args.plugin)  # the best gene may use their ops
        gene = AttentionGene.parse(summary.best_gene)
        note_unfinished(args.from_run, "ablate")
    else:
        raise UserError("nothing to ablate: give --gene KEY or --from-run DIR (its best gene)")
    variants = []  # against the config's baseline; fails fast (nothing written) on the baseline gene itself
    config, data, store, out, search_seed = analysis_setup(
        args, "runs/ablate", check=lambda c: variants.extend(ablation_variants(gene, c.resolved_baseline())))
    note_replaced(out, "ablation", study_setup(args, "ablation", config, data, store, None, search_seed), [gene.key])
    distinct = len({v.gene.key for v in variants})
    log(f"ablating {gene} on {data.name}: {len(variants)} variants "
        f"({distinct} distinct genes) x {args.seeds} seeds ({config.seed + 1}..{config.seed + args.seeds}), "
        f"{config.train_steps} steps{grid_text(args, config.seed)}", args.quiet)
    result = run_study(args, "ablation", config, data, store, search_seed, lambda setup: run_ablation(setup, gene))
    paths = write_ablation(result, out)
    for line in contribution_lines(result):
        log(line)
    log_outputs(result, paths, args.from_run)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("ablate", help="swap each of a gene's differences from the baseline back (and add each "
                              "alone to the baseline) over several seeds: what each component contributes")
    p.add_argument("--gene", help="the gene to ablate (default with --from-run: the run's best gene)")
    add_analysis_flags(p, "runs/ablate")
    add_baseline_flag(p)
    p.set_defaults(func=cmd_ablate)
