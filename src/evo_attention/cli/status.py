"""``evo-attention status RUN_DIR``: where a run stands, read from its store (also while it runs)."""

from __future__ import annotations


def cmd_status(args) -> int:
    from evo_attention.report.status import format_status, run_status
    from evo_attention.util.jsonio import dumps

    status = run_status(args.run_dir)
    print(dumps(status) if args.json else format_status(status))
    return 0


def register(sub) -> None:
    p = sub.add_parser("status", help="where a run stands (read from its store, also while it runs)")
    p.add_argument("run_dir")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_status)
