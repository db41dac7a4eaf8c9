"""report.html: one self-contained page with every analysis of the run, rendered by a browser."""

import base64
import json
import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from evo_attention import AttentionGene, Config, TinyTransformer
from evo_attention.studies import ablation, maps
from evo_attention.studies import validate as val  # the module
from evo_attention.studies.common import StudySetup
from evo_attention.report import OUTPUTS, load_attachments, write_report
from evo_attention.search.store import RunStore

PNG = b"\x89PNG\r\n\x1a\n"
VANILLA = AttentionGene.vanilla().key
GENE = "dot|sparsemax|output_gate|fixed|bias|0.10"
HOSTILE = '<script>alert("x")</script> & friends'
VOID = {"meta", "link", "img", "br", "hr", "input"}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _record(gene, ppl, seed=7, generation=0):
    return {"gene": gene, "seed": seed, "steps": 50, "data_fingerprint": "fp", "context": "ctx", "status": "ok",
            "val_perplexity": ppl, "val_loss": math.log(ppl), "params": 1000, "device": "cpu", "precision": "fp32"}


def _run(run_dir):
    config = Config(d_model=32, n_heads=2, train_steps=50, population_size=3, n_generations=2, elite_size=1,
                    seed=7).to_dict()
    meta = {"data": {"name": "recall", "fingerprint": "fp"}, "versions": {"torch": "2.13"}, "done": True,
            "planned": 6, "strategy": {"name": "ga", "options": {}}}
    with RunStore.create(run_dir, config=config, meta=meta) as store:
        store.record(_record(VANILLA, 9.0), role="baseline")
        for generation, genes in enumerate([[GENE, "cosine|softmax|none|fixed|bias|0.10"],
                                            ["dot|relu_norm|none|learned|bias|0.10"]]):
            for i, gene in enumerate(genes):
                store.record(_record(gene, 7.0 + generation + i, generation=generation), generation=generation)
            store.record_generation(generation, [(g, 7.0 + generation + i, False) for i, g in enumerate(genes)])
    return run_dir


def _fake(values_by_gene, seeds):
    return {(g, s): {"status": "ok", "val_perplexity": v} for g, vals in values_by_gene.items()
            for s, v in zip(seeds, vals)}


@pytest.fixture
def full_run(tmp_path):
    run_dir = _run(tmp_path / "run")
    seeds = [8, 9, 10]
    noise = [0.0, 0.1, -0.1]
    variants = ablation.ablation_variants(GENE)
    means = {VANILLA: 9.0, GENE: 7.0, "dot|softmax|output_gate|fixed|bias|0.10": 8.8,
             "dot|sparsemax|none|fixed|bias|0.10": 7.1}
    records = _fake({k: [m + n for n in noise] for k, m in means.items()}, seeds)
    setup = StudySetup(config=Config(), data=None, seeds=tuple(seeds), steps=50, role="validate")
    result = val.validation_statistics(setup, records, [GENE], search_values={GENE: 7.0})
    val.write_validation({**result, "steps": 50, "search_seed": 7, "versions": {"scipy": "x"}}, run_dir)
    ablation.write_ablation({**ablation.ablation_statistics(setup, variants, records), "steps": 50}, run_dir)
    compare = {"results": [
        {"name": "vanilla", "gene": VANILLA, "val_loss": 2.2, "val_perplexity": 9.0, "accuracy": 0.3, "time_s": 1.5,
         "peak_memory_mb": 120.0, "params": 1000, "status": "ok"},
        {"name": HOSTILE, "gene": GENE, "val_perplexity": 7.0},  # keys missing: tolerated
    ]}
    (run_dir / "compare_results.json").write_text(json.dumps(compare))
    torch.manual_seed(0)
    model = TinyTransformer(Config(vocab_size=16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8, dropout=0.0),
                            "dot|sparsemax|none|fixed")
    maps.attention_maps(model, [1, 2, 3, 4, 5, 6], run_dir / "maps", source={"gene": GENE, "steps": 5})
    return run_dir


class _Checker(HTMLParser):
    """Records every src/href and checks that non-void tags are closed in order."""

    def __init__(self):
        super().__init__()
        self.stack, self.links, self.tags, self.errors = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.links += [(tag, name, value) for name, value in attrs if name in ("src", "href")]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)


def test_html_is_one_self_contained_file(full_run):
    paths = write_report(full_run)
    assert paths["report_html"] == full_run / OUTPUTS["report_html"]
    page = paths["report_html"].read_text(encoding="utf-8")
    checker = _Checker()
    checker.feed(page)
    assert checker.errors == [] and checker.stack == []
    assert "script" not in checker.tags and "iframe" not in checker.tags
    assert not re.search(r"https?://", page), "no network resource or link"
    images = [value for tag, name, value in checker.links if name == "src"]
    assert len(images) == 6  # evolution, distribution, learning curves, validation, ablation, one attention layer
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG
    hrefs = [value for tag, name, value in checker.links if name == "href"]
    assert all(h.startswith("#") or h == "data:," for h in hrefs)
    for section in ("Multi-seed validation", "Ablation of Attn(dot|sparsemax|output_gate|fixed)", "Compare",
                    "Attention maps", "Distribution of all evaluations", "Full configuration", "Package versions",
                    "better", "Data fingerprint"):
        assert section in page, section
    assert HOSTILE not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; friends" in page


def test_markdown_report_gains_the_sections(full_run):
    write_report(full_run)
    text = (full_run / "report.md").read_text()
    for expected in ("Validated: Attn(dot|sparsemax|output_gate|fixed)", "## Multi-seed validation (validation split)",
                     "](validation.png)", "## Ablation of", "](ablation.png)", "## Compare", "## Attention maps",
                     "](maps/attention_layer0.png)", "](evaluation_distribution.png)"):
        assert expected in text, expected
    attachments = load_attachments(full_run)
    assert attachments.compare[1]["status"] is None and attachments.problems == []


def test_run_without_analyses_and_with_a_broken_file(tmp_path):
    run_dir = _run(tmp_path / "plain")
    page = write_report(run_dir)["report_html"].read_text()
    assert "Multi-seed validation" not in page and "Unreadable" not in page
    assert page.count("data:image/png;base64,") == 3  # evolution, distribution, learning curves
    (run_dir / "validation.json").write_text("{not json")
    (run_dir / "compare_results.json").write_text(json.dumps({"rows": []}))
    paths = write_report(run_dir)
    page = paths["report_html"].read_text()
    assert "Unreadable analysis files" in page and "validation.json: cannot be read" in page
    assert "compare_results.json: has no 'results' list" in page
    assert "Unreadable analysis files" in paths["report"].read_text()


@pytest.mark.parametrize("text", ['{"kind": "validation", "genes": [{"gene": 5}], "baseline": 3}',
                                  '{"kind": "validation", "genes": "x"}',
                                  '{"kind": "validation", "analysis": "paired-3", '
                                  '"genes": [{"gene": "g", "values": 5}]}',
                                  '{"kind": "validation", "seeds": 3}',
                                  '{"kind": "validation", "genes": [{"gene": "g", "scale": "log", "relative": "x"}]}',
                                  '{"kind": "validation", "genes": [{"gene": "g", "p_holm": "x"}]}'])
def test_a_validation_of_the_wrong_shape_is_named_damaged_and_left_out(tmp_path, text):
    from evo_attention.report.studies import read_studies

    (tmp_path / "validation.json").write_text(text)
    found = read_studies(tmp_path)
    assert found.validations == [] and len(found.problems) == 1
    assert found.problems[0].startswith("validation.json: damaged: a field is not what its command writes (")


def test_a_suite_validation_of_the_wrong_shape_is_named_damaged_too(tmp_path):
    from evo_attention.report.studies import read_studies

    committed = Path(__file__).parents[1] / "docs/findings4/e1-recall/climb-411/validation_suite.json"
    result = json.loads(committed.read_text())
    assert len(read_studies(committed.parent).suites) == 1  # as committed: readable
    result["genes"][0]["p_holm"] = "x"
    (tmp_path / "validation_suite.json").write_text(json.dumps(result))
    found = read_studies(tmp_path)
    assert found.suites == [] and found.problems[0].startswith("validation_suite.json: damaged: ")


def test_markdown_in_a_compare_entry_links_nothing_and_loads_nothing(tmp_path):
    run_dir = _run(tmp_path / "plain")
    hostile = "[click](https://example.com) <https://example.com> ![x](https://example.com/a.png) ![y](../a.png)"
    (run_dir / "compare_results.json").write_text(json.dumps({"results": [{"name": hostile, "gene": GENE}]}))
    checker = _Checker()
    checker.feed(write_report(run_dir)["report_html"].read_text())
    assert checker.errors == [] and "a" in checker.tags  # the table of contents
    assert all(value.startswith(("#", "data:")) for _, _, value in checker.links), checker.links
    assert sum(value.startswith("data:image/png;base64,") for _, _, value in checker.links) == 3


def test_figures_in_a_directory_whose_name_has_spaces_are_embedded(tmp_path):
    run_dir = _run(tmp_path / "plain")
    model = TinyTransformer(Config(vocab_size=16, d_model=16, n_heads=2, n_layers=1, max_seq_len=8, dropout=0.0),
                            "dot|softmax|none|fixed")
    maps.attention_maps(model, [1, 2, 3, 4], run_dir / "maps" / "two (words)", source={"gene": GENE, "steps": 5})
    paths = write_report(run_dir)
    assert "](maps/two%20%28words%29/attention_layer0.png)" in paths["report"].read_text()
    assert paths["report_html"].read_text().count("data:image/png;base64,") == 4  # the three of the run, the map


def test_a_run_directory_with_backticks_and_markup_shows_its_commands_and_name_exactly(tmp_path):
    """A path goes into a code span fenced longer than its backticks, a name into text with its markup
    escaped: report.html shows the exact commands and the exact name, no emphasis, no broken code."""
    import html as _html
    import shlex

    weird = tmp_path / "we|ird<b>*`x`" / "run"
    name = "<script>alert(1)<\\script>|a*b*`c`_x_ [l](u)"
    for run_dir in (_run(weird), _run(tmp_path / name)):
        with RunStore.open(run_dir) as store:
            store.set_meta("done", False)  # the Continue line too
        page = write_report(run_dir)["report_html"].read_text()
        codes = [_html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", page)]
        quoted = shlex.quote(str(run_dir))
        for command in (f"evo-attention validate --from-run {quoted}", f"evo-attention report {quoted}",
                        f"evo-attention search --out {quoted} --resume"):
            assert command in codes, (command, codes)
        heading = re.search(r"<h1>(.*?)</h1>", page).group(1)
        assert _html.unescape(heading) == f"Evolution report: {run_dir.name}" and "<em>" not in heading


@pytest.mark.parametrize("text", ["`a|b`", "x``y`|z", "plain|pipe"])
def test_code_in_a_table_cell_and_in_text_shows_the_text_exactly(tmp_path, text):
    import html as _html

    from evo_attention.report.html import render_html
    from evo_attention.util.format import code, markdown_table

    page = render_html(markdown_table(["key", "n"], [[code(text), "1"]]) + "\nrun " + code(text, False), tmp_path)
    assert [_html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", page)][-2:] == [text, text]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_html_renders_in_headless_chromium_without_console_errors(full_run, tmp_path):
    page = write_report(full_run)["report_html"]
    profile = tmp_path / "chromium-profile"
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    problems = [line for line in done.stderr.splitlines()
                if "CONSOLE" in line or "Uncaught" in line or "Failed to load resource" in line]
    assert problems == []
    assert "Multi-seed validation" in done.stdout and "data:image/png;base64," in done.stdout
