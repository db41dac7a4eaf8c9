"""``evo-attention report RUN_DIR [RUN_DIR ...] [--out DIR] [--optuna-journal FILE]``: (re)write the report's
outputs of each run from its store; with several runs, also compare them side by side into ``--out``;
with ``--optuna-journal``, also write the run as an Optuna study for optuna-dashboard."""

from __future__ import annotations

from evo_attention.cli.common import load_plugins, load_run_plugins, note, out_arg, with_given_plugins
from evo_attention.util.errors import UserError


def cmd_report(args) -> int:
    import os
    from pathlib import Path

    from evo_attention.report import write_report
    from evo_attention.search.store import RunStore

    if len(args.run_dirs) > 1 and args.out is None:
        raise UserError("several runs are compared into a directory: name it with --out DIR")
    if len(args.run_dirs) == 1 and args.out is not None:
        raise UserError("--out names where several runs are compared: give two or more run directories, or "
                        "drop --out (a run's report goes into its own directory)")
    if args.optuna_journal and len(args.run_dirs) > 1:
        raise UserError("--optuna-journal writes one run as an Optuna study: give one run directory")
    resolved = [Path(run_dir).resolve() for run_dir in args.run_dirs]
    twice = [run_dir for run_dir, path in zip(args.run_dirs, resolved) if resolved.count(path) > 1]
    if twice:
        raise UserError(f"{twice[-1]} names a run given before: give each run once")
    if args.out is not None:
        from evo_attention.report.runs import OUTPUT_KIND, input_runs

        out_arg(args, kind=OUTPUT_KIND, sources=input_runs(args.run_dirs))  # refused before any file is written
    if args.optuna_journal is not None:
        from evo_attention.report.optuna import journal_path

        journal_path(args.optuna_journal)  # refused before any file is written
    for run_dir in args.run_dirs:  # every run opens and is a search before any file is written
        with RunStore.open(run_dir, readonly=True) as store:
            if store.kind() != "search":  # a study's directory: its own command wrote its report there
                raise UserError(f"{run_dir} holds the store of a {store.kind()}, not of a search: report writes a "
                                f"search's report; evo-attention {store.kind()} writes its own (run it again with the "
                                "same flags to rewrite it)")
        _load_plugins(run_dir, args.plugin)
    for run_dir in args.run_dirs:
        if args.optuna_journal is not None and not os.access(run_dir, os.W_OK):
            note(f"{run_dir} is read-only: its report is not rewritten, the journal is written from its store")
            continue
        for path in write_report(run_dir).values():
            print(path)
        _say_what_resume_rebuilds(Path(run_dir))
    if args.out is not None:
        from evo_attention.report.runs import write_comparison

        for path in write_comparison(args.run_dirs, args.out).values():
            print(path)
    if args.optuna_journal is not None:
        from evo_attention.report.optuna import write_optuna_journal

        written = write_optuna_journal(args.run_dirs[0], args.optuna_journal)
        states = ", ".join(f"{n} {state}" for state, n in sorted(written["states"].items()))
        others = "".join(f", {name!r}: {n} trials" for name, n in written["studies"].items() if name != written["study"])
        print(f"{written['path']}  (Optuna study {written['study']!r}: {written['trials']} trials, {states}{others}; "
              f"view with: optuna-dashboard {written['path']})")
    return 0


def _say_what_resume_rebuilds(run_dir) -> None:
    """A note naming the search's own files (its snapshots, its check's) the store holds the results of but
    the directory lacks or cannot read: the search writes them (resume rewrites them; a finished run trains nothing)."""
    import shlex

    from evo_attention.search.store import RunStore
    from evo_attention.report.attachments import FRESH_CHECK_ROLE, load_attachments

    with RunStore.open(run_dir, readonly=True) as store:
        files = [f"checkpoints/generation_{row['generation']:03d}.json" for row in store.generations()]
        files += ["fresh_check.json", "fresh_check.md"] if store.evaluations(FRESH_CHECK_ROLE) else []
    unreadable = {problem.split(": ")[0]
                  for problem in load_attachments(run_dir).problems if "cannot be read" in problem}
    missing = [name + ", which cannot be read" * (name in unreadable) for name in files
               if not (run_dir / name).is_file() or name in unreadable]
    if missing:
        note(f"report does not write {', '.join(missing)} (the search does): `evo-attention search --resume --out "
             f"{shlex.quote(str(run_dir))}` rewrites them from the store (a finished run trains nothing)")


def _load_plugins(run_dir, given) -> None:
    """Import the plugins the run in ``run_dir`` stored (its genes may use their ops: the program figure reads
    them); one that cannot be imported is refused only where a gene of the run does not parse without it."""
    from evo_attention.genes import AttentionGene
    from evo_attention.search.store import RunStore

    try:
        load_run_plugins(run_dir, given)
    except UserError as failed:
        with RunStore.open(run_dir, readonly=True) as store:
            plugins = with_given_plugins(store.config().get("plugins") or [], given)
            genes = {r.gene for r in store.evaluations()}
            genes |= {member["gene"] for generation in store.generations() for member in generation["members"]}
        for name in plugins:  # the others still: a gene may use theirs
            try:
                load_plugins([name])
            except UserError:
                pass
        try:
            for gene in genes:
                AttentionGene.parse(gene)
        except ValueError:
            raise failed from None


def register(sub) -> None:
    p = sub.add_parser("report", help="(re)write a run's results and report from its store; with several runs, "
                                      "also compare them (--out)")
    p.add_argument("run_dirs", nargs="+", metavar="run_dir")
    p.add_argument("--out", help="with several runs: the directory for runs.md, runs.json and runs.png, the runs "
                                 "side by side (anytime curves, fronts in one box, validated winners)")
    p.add_argument("--optuna-journal", metavar="FILE",
                   help="also write the run as an Optuna study into the journal file FILE (an earlier journal there is replaced; any other existing file is refused), "
                        "for optuna-dashboard FILE; needs Optuna")
    p.add_argument("--plugin", action="append", metavar="MODULE",
                   help="import this module or .py file first (repeatable): the plugins a run stored are imported "
                   "anyway; a file stands in for a stored one of its name, or a module named by its stem "
                   "(a.b for b.py), of a run started elsewhere; one that cannot be imported is refused only where "
                   "a gene of the run needs it")
    p.set_defaults(func=cmd_report)
