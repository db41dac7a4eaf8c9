"""Transfer across scale: the verdict rule, the ladder, and the command end to end."""

import json
import math

import pytest

from evo_attention import AttentionGene, Config, Evolution
from evo_attention.cli import main
from evo_attention.report.studies.transfer import transfer_headline
from evo_attention.search.store import RunStore
from evo_attention.studies import transfer as tr
from evo_attention.util import stats
from evo_attention.util.errors import UserError

PNG = b"\x89PNG\r\n\x1a\n"
VANILLA = AttentionGene.vanilla().key
SPARSE = "dot|sparsemax|none|fixed|bias|0.10"
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 256, "eval_examples": 64},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=64, eval_steps=None,
            learning_rate=3e-3, train_steps=6, log_every=3, population_size=2, n_generations=1, elite_size=1,
            seed=7)


def adv(value, low, high):
    """A relative change with its interval, given as the gain (positive = better) on a lower-is-better
    metric: the verdict's cases read most easily as gains."""
    flip = (lambda x: None if x is None else -x)
    return {"relative_change": flip(value), "relative_change_low": flip(high), "relative_change_high": flip(low)}


# -- the verdict rule -----------------------------------------------------------------------------
@pytest.mark.parametrize("current, expected", [
    (adv(0.10, 0.06, 0.14), stats.HOLDS),  # reaches the reference advantage 0.10
    (adv(0.20, 0.15, 0.25), stats.HOLDS),  # grows
    (adv(0.05, 0.02, 0.08), stats.SHRINKS),  # above 0, wholly below 0.10
    (adv(0.05, 0.02, 0.10), stats.HOLDS),  # the high end touches the reference value: not shown smaller
    (adv(0.01, -0.02, 0.04), stats.VANISHES),  # contains 0
    (adv(0.03, 0.0, 0.06), stats.VANISHES),  # touches 0: not clearly better
    (adv(-0.05, -0.08, -0.02), stats.REVERSES),  # wholly below 0
    (adv(-0.03, -0.06, 0.0), stats.VANISHES),  # touches 0 from below: not clearly worse
    (adv(0.05, None, None), stats.TOO_FEW),
])
def test_transfer_verdict_rule(current, expected):
    assert stats.transfer_verdict(adv(0.10, 0.05, 0.15), current) == expected


def test_transfer_verdict_without_an_advantage_at_the_reference():
    assert stats.transfer_verdict(adv(0.02, -0.01, 0.05), adv(0.3, 0.2, 0.4)) == stats.NO_ADVANTAGE
    assert stats.transfer_verdict(adv(0.02, 0.0, 0.05), adv(0.3, 0.2, 0.4)) == stats.NO_ADVANTAGE
    assert stats.transfer_verdict(adv(None, None, None), adv(0.3, 0.2, 0.4)) == stats.TOO_FEW
    assert [v for v, _ in stats.TRANSFER_RULE] == [stats.TOO_FEW, stats.NO_ADVANTAGE, stats.REVERSES, stats.VANISHES,
                                                   stats.NO_RELATIVE, stats.SHRINKS, stats.HOLDS]


def test_transfer_verdict_of_a_non_finite_change_is_too_few():
    """NaN compares false with everything: read as the change it is not, it 'held'."""
    nan = float("nan")
    assert stats.transfer_verdict(adv(0.10, 0.05, 0.15), adv(nan, nan, nan)) == stats.TOO_FEW
    assert stats.transfer_verdict(adv(nan, nan, nan), adv(0.10, 0.05, 0.15)) == stats.TOO_FEW
    assert stats.transfer_verdict(adv(0.10, 0.05, 0.15), adv(0.10, 0.05, math.inf)) == stats.TOO_FEW


def test_relative_change_is_the_gene_minus_the_baseline_over_the_baseline():
    row = {"difference": -2.0, "diff_ci_low": -3.0, "diff_ci_high": -1.0}
    change = {"relative_change": -0.10, "relative_change_low": -0.15, "relative_change_high": -0.05}
    assert tr.relative_change(row, 20.0) == pytest.approx(change)
    empty = {"relative_change": None, "relative_change_low": None, "relative_change_high": None}
    assert tr.relative_change({"difference": None}, 20.0) == empty
    assert tr.relative_change({"difference": 1.0}, 20.0)["relative_change_low"] is None
    log = {"scale": "log", "relative": 0.04, "relative_ci_low": 0.01, "relative_ci_high": 0.07}
    assert tr.relative_change(log, None) == {"relative_change": 0.04, "relative_change_low": 0.01,
                                             "relative_change_high": 0.07}


def test_transfer_verdict_reads_the_metrics_direction():
    # accuracy: a positive change is better, so the same numbers as gains hold
    up = {"relative_change": 0.10, "relative_change_low": 0.05, "relative_change_high": 0.15}
    assert stats.transfer_verdict(up, up, lower_is_better=False) == stats.HOLDS
    assert stats.transfer_verdict(up, up, lower_is_better=True) == stats.NO_ADVANTAGE


def test_transfer_verdict_where_the_baseline_mean_is_0_reads_the_difference():
    """No relative change (accuracy 0 for the baseline): the difference's sign decides, never "not enough seeds"."""
    def diff(value, low, high):
        return {"difference": value, "diff_ci_low": low, "diff_ci_high": high, **tr.relative_change({}, 0.0)}
    up = {"relative_change": 0.10, "relative_change_low": 0.05, "relative_change_high": 0.15}
    zero = diff(0.0, 0.0, 0.0)
    assert stats.transfer_verdict(zero, zero, lower_is_better=False) == stats.NO_ADVANTAGE
    assert stats.transfer_verdict(up, diff(-0.2, -0.3, -0.1), lower_is_better=False) == stats.REVERSES
    assert stats.transfer_verdict(diff(0.2, 0.1, 0.3), up, lower_is_better=False) == stats.NO_RELATIVE
    result = {"metric": "accuracy", "largest": "32x1", "sizes": [
        {"size": "16x1", "genes": [{"gene": SPARSE, "str": "s", **zero}]},
        {"size": "32x1", "genes": [{"gene": SPARSE, "str": "s", **zero, "transfer": stats.NO_ADVANTAGE}]}]}
    headline = transfer_headline(result)
    assert "**no advantage at the reference size**" in headline and "the baseline's mean is 0" in headline


def test_kendall_tau_of_two_rankings():
    ref = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    assert tr.kendall(ref, {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0})["kendall_tau"] == pytest.approx(1.0)
    assert tr.kendall(ref, {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0})["kendall_tau"] == pytest.approx(-1.0)
    swapped = tr.kendall(ref, {"a": 2.0, "b": 1.0, "c": 3.0, "d": 4.0})
    assert swapped["kendall_tau"] == pytest.approx(4 / 6) and swapped["kendall_n"] == 4  # 5 concordant, 1 discordant
    missing = tr.kendall(ref, {"a": 1.0, "b": None})
    assert missing == {"kendall_tau": None, "kendall_p": None, "kendall_n": 1}


# -- the ladder -----------------------------------------------------------------------------------
def test_ladder_puts_the_search_size_first_with_its_own_shape():
    config = Config(d_model=64, n_heads=4, n_layers=2, d_ff=200, train_steps=50)
    rungs = tr.plan(config, [SPARSE], sizes="128x2,256x4")
    assert [r.label for r in rungs] == ["64x2", "128x2", "256x4"] and rungs[0].search_size
    assert [r.config.n_heads for r in rungs] == [4, 4, 8]  # the search's heads, then d/32
    assert [r.config.ffn_dim for r in rungs] == [200, 512, 1024]  # the search's width, then 4 d
    assert [r.config.train_steps for r in rungs] == [50, 50, 50]
    rungs = tr.plan(config, [SPARSE], sizes="128x2,256x4", steps="100,200")  # one per given size
    assert [r.config.train_steps for r in rungs] == [50, 100, 200]  # the added search size keeps its budget
    rungs = tr.plan(config, [SPARSE], sizes="128x2,64x2", steps="100,30")  # steps follow the given order
    assert [(r.label, r.config.train_steps) for r in rungs] == [("64x2", 30), ("128x2", 100)]
    rungs = tr.plan(config, [SPARSE], sizes="128x2", steps=70, heads=2)
    assert [(r.config.n_heads, r.config.train_steps) for r in rungs] == [(2, 70), (2, 70)]
    llama = tr.plan(config.replace(block="llama", d_ff=None), [SPARSE], sizes="96x3")
    assert llama[1].config.block == "llama" and llama[1].config.ffn_dim == 256


def test_tokens_per_param_sets_the_steps_from_the_baseline_size():
    from types import SimpleNamespace

    config = Config(vocab_size=100, d_model=32, n_heads=1, n_layers=1, batch_size=4, max_seq_len=16)
    rungs = tr.plan(config, [SPARSE], sizes="64x2", tokens_per_param=2.0)
    data = SimpleNamespace(seq_len=16, vocab_size=100)
    sized = tr.with_budgets(rungs, data, 2.0)
    for rung in sized:
        params = tr.baseline_parameters(rung.config, 100)
        assert rung.config.train_steps == round(2.0 * params / (4 * 16))
    assert tr.baseline_parameters(config, 100) == 100 * 32 + 16 * 32 + (2 * 64 + 32 * 96 + 96 + 32 * 32 + 32
                                                                          + 32 * 128 + 128 + 128 * 32 + 32) + 64


@pytest.mark.parametrize("kwargs, words", [
    (dict(sizes="128"), "'128' is not a size"),
    (dict(sizes="128x0"), "is not a size"),
    (dict(sizes="128x2,128x2"), "names 128x2 twice"),
    (dict(sizes="64x2"), "names only the search size 64x2"),
    (dict(sizes="100x2"), "size 100x2 does not divide into heads: d_model 100 is not a multiple of 32"),
    (dict(sizes="48x2"), "d_model 48 is not a multiple of 32"),
    (dict(sizes="128x2", heads=3), "d_model 64 is not divisible by the 3 heads given"),
    (dict(sizes="128x2,256x4", steps="1,2,3"), "steps gives 3 values for 2 sizes"),
    (dict(sizes="128x2", steps="ten"), "must be a positive number of training steps"),
    (dict(sizes="128x2", steps=10, tokens_per_param=20), "not both"),
    (dict(sizes="128x2", tokens_per_param=0), "must be a positive number"),
])
def test_bad_ladders_are_user_errors(kwargs, words):
    with pytest.raises(UserError, match=words):
        tr.plan(Config(d_model=64, n_heads=4, n_layers=2), [SPARSE], **kwargs)


def test_genes_must_fit_every_size():
    with pytest.raises(UserError, match="kv_heads 2 does not divide the 1 heads of size 32x2"):
        tr.plan(Config(d_model=64, n_heads=4, n_layers=2), [SPARSE + "|kvh=2"], sizes="32x2")
    with pytest.raises(UserError, match="no gene to transfer other than the baseline"):
        tr.plan(Config(), [VANILLA], sizes="256x2")


# -- the command end to end -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("transfer") / "run"
    with Evolution(Config(**TINY), out_dir=run_dir) as evolution:
        evolution.run()
    return run_dir


def test_transfer_from_run_end_to_end_and_cached(tiny_run, capsys):
    with RunStore.open(tiny_run, readonly=True) as store:
        before = len(store.evaluations())
    args = ["transfer", "--from-run", str(tiny_run), "--genes", SPARSE, "--sizes", "32x1", "--seeds", "2",
            "--steps", "6", "--quiet"]
    assert main(args) == 0
    result = json.loads((tiny_run / "transfer.json").read_text())
    assert result["kind"] == "transfer" and result["reference"] == "16x1" and result["largest"] == "32x1"
    assert result["seeds"] == [8, 9] and result["search_seed"] == 7 and result["block"] == "gpt2"
    ref, big = result["sizes"]
    assert (ref["size"], ref["n_heads"], ref["reference"]) == ("16x1", 2, True)
    assert (big["size"], big["n_heads"], big["steps"], big["reference"]) == ("32x1", 1, 6, False)
    assert big["params"] > ref["params"] and big["tokens"] == 6 * 8 * 16
    assert [g["gene"] for g in big["genes"]] == [SPARSE] and big["baseline"]["gene"] == VANILLA
    row = big["genes"][0]
    assert ref["genes"][0]["transfer"] == "reference"
    assert row["transfer"] == stats.transfer_verdict(ref["genes"][0], row) == result["verdicts"][SPARSE]
    for key in ("mean", "ci_low", "ci_high", "difference", "diff_ci_low", "diff_ci_high", "relative_change",
                "relative_change_low", "relative_change_high", "params"):
        assert row[key] is not None, key
    assert big["kendall_n"] == 2 and big["kendall_tau"] is None  # two ranked genes say nothing
    inter = row["interaction"]
    assert inter["test"] == "paired" and inter["n_a"] == 2 and inter["p_holm"] is not None
    # the change of the paired change: the difference of the two sizes' per-seed log differences
    assert inter["change"] == pytest.approx(row["difference"] - ref["genes"][0]["difference"])
    assert result["headline"] in (tiny_run / "transfer.md").read_text()
    assert (tiny_run / "transfer.png").read_bytes()[:8] == PNG
    with RunStore.open(tiny_run, readonly=True) as store:
        rows = store.evaluations(role="transfer")
        assert len(store.evaluations()) == before + 8
    assert sorted({(r["gene"], r["seed"], r["settings"]["d_model"]) for r in rows}) == sorted(
        (g, s, d) for g in (VANILLA, SPARSE) for s in (8, 9) for d in (16, 32))

    # a repeat is served from the run store: nothing is trained, the numbers are the same
    first = result
    assert main(args) == 0
    with RunStore.open(tiny_run, readonly=True) as store:
        assert len(store.evaluations()) == before + 8
    again = json.loads((tiny_run / "transfer.json").read_text())
    assert again["sizes"] == first["sizes"] and again["headline"] == first["headline"]

    # the llama block: new trainings, never mixed with the gpt2 ones
    out = tiny_run / "llama"
    assert main(args + ["--block", "llama", "--out", str(out)]) == 0
    llama = json.loads((out / "transfer.json").read_text())
    assert llama["block"] == "llama" and llama["config"]["block"] == "llama"
    assert llama["sizes"][1]["baseline"]["values"] != first["sizes"][1]["baseline"]["values"]
    with RunStore.open(tiny_run, readonly=True) as store:
        rows = store.evaluations(role="transfer")
    assert len(rows) == 16 and sum(r["settings"].get("block") == "llama" for r in rows) == 8

    # the report shows it
    assert main(["report", str(tiny_run)]) == 0
    text = (tiny_run / "report.md").read_text()
    for expected in ("## Transfer across scale", "](transfer.png)", "Kendall's tau vs 16x1",
                     "Repeat the transfer study", "--sizes 16x1,32x1 --steps 6,6 --seeds 2"):
        assert expected in text, expected
    page = (tiny_run / "report.html").read_text()
    assert 'id="transfer-across-scale"' in page and "Transfer across scale" in page
    capsys.readouterr()


@pytest.mark.parametrize("flags, words", [
    (["--sizes", "32y1"], "--sizes '32y1': '32y1' is not a size"),
    (["--sizes", "48x1"], "size 48x1 does not divide into heads: d_model 48 is not a multiple of 32"),
    (["--sizes", "33x1", "--heads", "2"], "d_model 33 is not divisible by the 2 heads given"),
    (["--sizes", "32x1,64x1", "--steps", "5,6,7"], "--steps gives 3 values for 2 sizes"),
    (["--sizes", "32x1", "--steps", "5", "--tokens-per-param", "2"], "give --steps or --tokens-per-param, not both"),
    (["--sizes", "32x1", "--seeds", "1"], "at least 2 seeds"),
])
def test_transfer_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, flags, words):
    out = tmp_path / "out"
    code = main(["transfer", "--preset", "quick", "--d-model", "16", "--layers", "1",
                 "--genes", SPARSE, "--out", str(out), "--quiet"] + flags)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not out.exists()


def test_transfer_needs_genes(capsys):
    assert main(["transfer", "--quiet"]) == 2
    assert "nothing to transfer: give --genes" in capsys.readouterr().err


def test_transfer_trains_the_baseline_it_reports(tmp_path, capsys):
    """The configured baseline (``Config.resolved_baseline``) is the one trained and the one reported."""
    nobias = "dot|softmax|none|fixed|nobias|0.00"
    (tmp_path / "c.yaml").write_text(f'baseline_gene: "{nobias}"\n')
    out = tmp_path / "out"
    assert main(["transfer", "--config", str(tmp_path / "c.yaml"), "--data", "mqar:seq_len=32", "--d-model", "16",
                 "--heads", "2", "--layers", "1", "--ffn", "32", "--batch-size", "4", "--eval-steps", "1",
                 "--genes", SPARSE, "--sizes", "32x1", "--seeds", "2", "--steps", "2", "--out", str(out),
                 "--quiet"]) == 0
    result = json.loads((out / "transfer.json").read_text())
    assert [s["baseline"]["gene"] for s in result["sizes"]] == [nobias, nobias]
    with RunStore.open(out, readonly=True) as store:
        assert {r["gene"] for r in store.evaluations()} == {nobias, SPARSE}
    capsys.readouterr()


def test_a_transfer_of_other_sizes_says_which_file_it_replaces(tmp_path):
    """transfer.json of another ladder in the same --out is replaced with one note before anything trains."""
    out = tmp_path / "out"
    flags = ["transfer", "--data", "mqar:seq_len=32", "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32",
             "--batch-size", "4", "--eval-steps", "1", "--genes", SPARSE, "--seeds", "2", "--steps", "2",
             "--out", str(out), "--quiet"]
    assert main(flags + ["--sizes", "32x1"]) == 0
    with pytest.warns(UserWarning) as told:
        assert main(flags + ["--sizes", "24x1"]) == 0
    assert [str(w.message) for w in told if "this replaces" in str(w.message)] == [
        f"this replaces {out / 'transfer.json'} and its .md and .png ({SPARSE} at 2 seeds, sizes 16x1, 32x1); its "
        f"trainings stay in {out / 'run.db'}, so the command that wrote it rebuilds it"]
