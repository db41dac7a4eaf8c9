"""``evo-attention report RUN_DIR``: (re)write every output of a run from its store."""

from __future__ import annotations


def cmd_report(args) -> int:
    from evo_attention.report import write_report

    for path in write_report(args.run_dir).values():
        print(path)
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="(re)write a run's results and report from its store")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)
