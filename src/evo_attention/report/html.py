"""``report.html``: ``report.md`` as one self-contained page.

The page is ``report.md`` rendered by markdown-it-py (CommonMark with tables), so the two reports cannot
disagree. Raw HTML in the text (a gene name, a compare entry) is escaped, never passed through, and a link stays
text. Every figure the markdown names is embedded as a base64 ``data:`` URI (a note stands in for a missing one)
and the style sheet is inline, so the file opens in any browser straight from the disk, with no server, network
or JavaScript. Each ``##`` section gets an anchor and a table-of-contents entry; a table cell that opens with a
verdict ("better", "worse") is coloured.
"""

from __future__ import annotations

import base64
import html
import re
from contextlib import suppress
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

STYLE = """
:root { color-scheme: light; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1d2329; background: #f6f7f9; margin: 0; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 28px 60px; background: #fff; }
h1 { font-size: 1.7em; margin: 0.2em 0 0.4em; }
h2 { font-size: 1.3em; margin-top: 2em; padding-bottom: 0.2em; border-bottom: 1px solid #dde1e6; }
nav.toc { font-size: 0.9em; margin: 0.6em 0 1.2em; display: flex; flex-wrap: wrap; gap: 0.2em 1em; }
nav.toc a { color: #2458a6; text-decoration: none; white-space: nowrap; }
nav.toc + p { background: #eef4fb; border-left: 4px solid #2458a6; padding: 10px 16px; }
table { display: block; overflow-x: auto; border-collapse: collapse; font-size: 0.82em; margin: 0.8em 0; }
th, td { border: 1px solid #dde1e6; padding: 3px 7px; vertical-align: top; }
th { background: #f0f2f5; text-align: left; }
td[style*="right"] { white-space: nowrap; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafbfc; }
code { font: 0.9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f0f2f5;
       padding: 0 3px; border-radius: 3px; }
td code { white-space: nowrap; }
pre { font: 0.85em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f6f8fa;
      padding: 10px; overflow-x: auto; }
pre code { background: none; padding: 0; }
img { max-width: 100%; height: auto; border: 1px solid #eceff3; }
.caption { display: block; font-size: 0.85em; color: #5a6470; }
.good { color: #1f7a3a; font-weight: 600; }
.bad { color: #b3261e; font-weight: 600; }
.muted { color: #5a6470; }
"""

_VERDICT = re.compile(r"<td([^>]*)>(better|worse)")


def render_html(markdown_text: str, run_dir: str | Path) -> str:
    """The text of ``report.html`` for ``report.md``'s text; its figures are read from ``run_dir``."""
    from markdown_it import MarkdownIt  # imported when a report is written, like matplotlib

    md = MarkdownIt("commonmark", {"html": False}).enable("table").disable(["link", "autolink"])  # the report has none
    md.add_render_rule("image", _image)
    env = {"run_dir": Path(run_dir)}
    tokens = md.parse(markdown_text, env)
    toc, used = [], set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag == "h2":
            title = md.renderer.renderInline(tokens[i + 1].children or [], md.options, env)
            base = re.sub(r"[^a-z0-9]+", "-", tokens[i + 1].content.lower()).strip("-") or "section"
            anchor, n = base, 1
            while anchor in used:  # two validations, two curves: the second is "<title>-2"
                n += 1
                anchor = f"{base}-{n}"
            used.add(anchor)
            token.attrSet("id", anchor)
            toc.append(f'<a href="#{anchor}">{title}</a>')
    start = 3 if tokens and tokens[0].tag == "h1" else 0  # the title, then the table of contents
    head = md.renderer.render(tokens[:start], md.options, env)
    body = _VERDICT.sub(lambda m: f'<td{m.group(1)} class="{"good" if m.group(2) == "better" else "bad"}">'
                                  f"{m.group(2)}", md.renderer.render(tokens[start:], md.options, env))
    name = html.escape(Path(str(run_dir)).name or str(run_dir))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<title>Evolution report: {name}</title><style>{STYLE}</style></head>"
            f"<body><main>{head}<nav class=\"toc\">{''.join(toc)}</nav>{body}</main></body></html>\n")


def _image(renderer, tokens, idx, options, env) -> str:
    """A PNG the markdown names, relative to the run directory, as a data URI captioned by its alt text; anything
    else (a missing file, a path leaving the run directory) as a note."""
    token = tokens[idx]
    alt = html.escape(renderer.renderInlineAsText(token.children or [], options, env))
    name = PurePosixPath(unquote(token.attrGet("src") or ""))
    data = None
    if not name.is_absolute() and ".." not in name.parts and name.suffix == ".png":
        with suppress(OSError):
            data = base64.b64encode((env["run_dir"] / name).read_bytes()).decode("ascii")
    if data is None:
        return f'<span class="muted">Figure {html.escape(name.name)} is missing.</span>'
    return f'<img alt="{alt}" src="data:image/png;base64,{data}"><span class="caption">{alt}</span>'
