"""``evo-attention study ACTION PLAN``: a registered study, one plan file (``studies.study``; docs/studies.md).

``register`` records the plan before any result (beside it: ``PLAN.registration.json``); ``run``
runs every stage that is not done, in order, each in its own folder, resuming after a kill;
``amend`` records a change of the plan, refused once the results it would change exist; ``report``
writes the tables and the answers from the result files alone; ``check`` exits 1 where a document's
generated table of the plan's files differs from what its file gives.
"""

from __future__ import annotations

import sys

from evo_attention.util.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser("study", help="a registered study: one plan file, run stage by stage and reported",
                              description="A study as one plan file (YAML: questions, stages, seed blocks, families, "
                                          "decision words; docs/studies.md): register it before any result, run it "
                                          "(resumable), amend it, report it from its result files.")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    r = sub.add_parser("register", help="record the plan's hash, the tool's version and the commit, before any result")
    r.add_argument("plan")
    r.add_argument("--allow-dirty", action="store_true", help="register a plan with uncommitted changes")
    r.add_argument("--after-results", metavar="REASON",
                   help="register a plan written after some of its results exist (the report says so, and why)")
    r = sub.add_parser("run", help="run every stage that is not done, in order (resumes after a kill)")
    r.add_argument("plan")
    r.add_argument("--stage", action="append", metavar="S", help="run only this stage (repeatable); its inputs must "
                                                                 "be done")
    r.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting of the plan for this run (settings: where the data lies, workers, ...)")
    r.add_argument("--quiet", action="store_true", help="no progress output of the study (its commands keep theirs)")
    r = sub.add_parser("status", help="the registration and each stage's state")
    r.add_argument("plan")
    r = sub.add_parser("amend", help="record a change of the plan with its time (refused after the results it changes)")
    r.add_argument("plan")
    r.add_argument("--note", required=True, help="what changed and why")
    r = sub.add_parser("report", help="the tables and the answers, from the result files alone, as markdown")
    r.add_argument("plan")
    r.add_argument("--out", metavar="FILE", help="where to write it (default: the plan's report:, else "
                                                 "RESULTS/report.md)")
    r = sub.add_parser("check", help="exit 1 where a document's generated table of the plan's files differs from them")
    r.add_argument("plan")
    r.add_argument("doc")
    p.set_defaults(func=cmd_study)


def _settings(items) -> dict:
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UserError(f"--set {item!r}: give NAME=VALUE")
        out[name] = value
    return out


def _check_commands(plan) -> list[tuple[str, list[str]]]:
    """Every command of the plan parses as this version's command line reads it (a misspelt command
    or flag is refused when the plan is registered or run, not when its stage comes); returns them
    (``studies.study.command_lines``)."""
    import contextlib
    import io

    from evo_attention.cli import build_parser
    from evo_attention.studies.study import command_lines

    parsers, lines = {}, command_lines(plan)  # one parser per command: a plan runs the same few many times
    for stage, argv in lines:
        command = argv[0] if argv else None
        if command not in parsers:
            parsers[command] = build_parser(only=command)
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                parsers[command].parse_args(argv)
        except SystemExit:
            why = (said.getvalue().strip().splitlines() or ["it cannot be parsed"])[-1].split("error: ", 1)[-1]
            raise UserError(f"stage {stage}: `evo-attention {' '.join(argv[:2])} ...`: {why}") from None
    return lines


def cmd_study(args) -> int:
    from evo_attention.studies import study as st, study_run as sr
    from evo_attention.util.progress import log

    plan = st.load_study(args.plan, settings=_settings(getattr(args, "set", None)))
    if args.action in ("register", "run"):
        lines = _check_commands(plan)
    if args.action == "register":
        record = st.register(plan, allow_dirty=args.allow_dirty, after_results=args.after_results)
        print(f"registered {args.plan} at commit {record['commit'] or '(none)'}: {st.registration_path(plan)}")
    elif args.action == "run":
        from evo_attention.cli import main

        unknown = [n for n in _settings(args.set) if n not in (plan.raw.get("settings") or {})]
        if unknown:
            names = ", ".join(plan.raw.get("settings") or {}) or "none"
            raise UserError(f"--set {unknown[0]}: not a setting of the plan (its settings: {names})")
        def command(argv) -> int:  # the exit status of a stage's command, also where argparse exits
            try:
                return main(argv)
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else 2

        # a plugin registers for the whole process: where a stage names one, each stage runs in a process of
        # its own, so that no stage sees another's ops and components (its result would depend on the order)
        alone = any(a == "--plugin" or a.startswith("--plugin=") for _, argv in lines for a in argv)
        ran = sr.run_study(plan, None if alone else command, stages=args.stage, log=lambda line: log(line, args.quiet))
        log(f"study {plan.name}: {'ran ' + ', '.join(ran) if ran else 'every stage is done'}", args.quiet)
    elif args.action == "status":
        print("\n".join(sr.status(plan)))
    elif args.action == "amend":
        record = st.amend(plan, args.note)
        print(f"amendment {len(record['amendments'])} recorded: {', '.join(record['amendments'][-1]['changed'])}")
    elif args.action == "report":
        from pathlib import Path

        from evo_attention.util.files import output_dir, write_text

        out = Path(args.out) if args.out else plan.root / (plan.raw.get("report")
                                                           or f"{plan.raw['results']}/report.md")
        if out.is_dir():
            raise UserError(f"--out {out} is a folder: give the file the report goes to, e.g. {out / 'report.md'}")
        output_dir(out.parent, "--out's folder")
        write_text(out, sr.report(plan))
        print(f"wrote {out}")
    else:
        differ = sr.check_document(plan, args.doc)
        for line in differ:
            print(line, file=sys.stderr)
        if differ:
            return 1
        print(f"{args.doc}: every table of {args.plan}'s files equals what its file gives")
        pending = sr.unwritten_tables(plan)
        if pending:
            print(f"{len(pending)} of the plan's tables have no file yet (their stages have not run): "
                  + ", ".join(f"{f} ({t})" for f, t in pending))
    return 0
