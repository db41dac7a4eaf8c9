"""docs/extending.md is executed: its plugin file, its config and its commands, as written."""

import re
import shlex
import sys
from pathlib import Path

from evo_attention.cli import main
from evo_attention.nn import components
from evo_attention.search import STRATEGIES
from evo_attention.search.store import RunStore

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """(marker, code) of every fenced block announced by an HTML comment ``<!-- marker -->``."""
    return re.findall(r"<!-- (.+?) -->\n```\w*\n(.*?)```", text, re.S)


def test_the_tutorial_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = []
    for marker, code in blocks(DOC.read_text()):
        kind, _, name = marker.partition(": ")
        if kind in ("plugin", "file"):
            (tmp_path / name).write_text(code)
        elif kind == "command":
            commands += [line for line in code.splitlines() if line.strip()]
    assert (tmp_path / "my_plugin.py").is_file() and commands
    try:
        for line in commands:
            argv = shlex.split(line)
            assert argv[0] == "evo-attention"
            assert main(argv[1:]) == 0, line
        with RunStore.open(tmp_path / "runs" / "plugin", readonly=True) as store:
            genes = [r.gene for r in store.evaluations(role="search")]
            assert store.get_meta("strategy")["name"] == "local"
        assert any("|squared_relu|" in g for g in genes)
        assert "finished" in capsys.readouterr().out
    finally:
        components.unregister("normalization", "squared_relu")
        components.unregister("similarity", "scaled_dot")
        STRATEGIES.pop("local", None)
        sys.modules.pop("evo_attention_plugin_my_plugin", None)
