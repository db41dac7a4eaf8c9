"""Numbers and text for tables: one way to show a value, a markdown cell, a CSV cell."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any, Sequence


def utc_now(timespec: str = "seconds") -> str:
    """Now in UTC as ISO text, as records keep times (``created_at``, ``finished_at``)."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float if it is a finite number, else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def fmt(value: Any, digits: int = 2) -> str:
    """A human-readable number: fixed ``digits`` for floats, thousands separators for ints."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def number(value: Any, spec: str) -> str:
    """``format(value, spec)`` for a finite number, ``-`` otherwise."""
    value = finite_or_none(value)
    return "-" if value is None else format(value, spec)


def csv_cell(value: Any) -> str:
    """A CSV cell: empty for None/NaN/inf, ``true``/``false`` for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return str(value)


def md_cell(value: Any) -> str:
    """Plain text safe in markdown, a table cell included: one line, each character that could start
    markup (emphasis, code, a link or image: a ``]`` before ``(``, ``[`` or ``:``, a cell's end)
    backslash-escaped, so it renders as given."""
    text = str(value).replace("\r", " ").replace("\n", " ").strip()

    def escape(m: re.Match) -> str:  # underscores inside a word (val_loss) never start emphasis: kept
        a, b = m.span()
        keep = m[0][0] == "_" and text[a - 1:a].isalnum() and text[b:b + 1].isalnum()
        return m[0] if keep else "".join("\\" + c for c in m[0])
    return re.sub(r"_+|[\\`*|]|\](?=[(\[:])", escape, text)


def code(text: Any, cell: bool = True) -> str:
    """``text`` as inline code that shows it exactly (a gene key, a path, a command), on one line: fenced
    by one backtick more than its longest run of them, padded with a space where it starts or ends with
    a backtick (CommonMark strips one space from each side). ``cell``: for a table cell, its pipes
    escaped (GFM unescapes them, inside code too); outside a table an escape would show."""
    if text is None:
        return "-"
    text = str(text).replace("\r", " ").replace("\n", " ").strip()
    text = text.replace("|", "\\|") if cell else text
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured markdown table. Cells are used as given (format and escape them with
    ``fmt``/``md_cell``/``code``); ``align`` is one character per column, ``l`` or ``r``."""
    align = align or "l" * len(headers)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def human_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``2.1 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# The one sign convention of every change the outputs show: the gene's value minus the baseline's
# (in the metric's units, or in % of the baseline's), so its sign says which way the metric moved;
# whether that is better is stated once per table or sentence by ``direction``.
def direction(lower_is_better: bool = True) -> str:
    """``lower is better`` or ``higher is better``: said once wherever changes are shown."""
    return "lower is better" if lower_is_better else "higher is better"


def change_header(what: str = "Change vs baseline", lower_is_better: bool = True) -> str:
    """A change column's header with the metric's direction: ``Change vs baseline (lower is better)``."""
    return f"{what} ({direction(lower_is_better)})"


def signed_change(percent: Any, digits: int = 1) -> str:
    """A relative change in %, always signed: ``-3.1%`` (``-`` when missing)."""
    value = finite_or_none(percent)
    return "-" if value is None else f"{value:+.{digits}f}%"
