"""Parameter-matched baselines: the vanilla model's feed-forward width set to a gene's parameter count."""

import json

import pytest

from conftest import STUDY_FLAGS, covering_gene_keys
from evo_attention import AttentionGene, Config
from evo_attention.cli import main
from evo_attention.nn.matching import MATCH_TOLERANCE, matched_baseline, parameter_count
from evo_attention.nn.spec import ModelSpec
from evo_attention.studies.compare import CONFIGS_BY_NAME
from evo_attention.studies.validate import validate_genes
from evo_attention.report.studies.validation import validation_markdown
from evo_attention.util.errors import UserError

PROGRAM = "prog=o(sgate(mix(w.softmax(t.fixed(s.dot(dconv3(q),k))),v)))"
GATED = "dot|softmax|output_gate|fixed|bias|0.10"
TINY = dict(data="recall", vocab_size=16, max_seq_len=16,
            recall={"num_pairs": 2, "num_queries": 2, "train_examples": 128, "eval_examples": 32},
            d_model=16, n_heads=2, n_layers=1, dropout=0.0, batch_size=8, eval_batch_size=32, eval_steps=None,
            learning_rate=3e-3, train_steps=3, log_every=3, seed=7)


def zoo(spec):
    """Every family: each registered component and axis option (conftest's covering genes, programs
    with learned ops among them), the named configurations of compare, and a learned-op program."""
    named = [c.gene(spec.d_model, spec.n_heads, spec.max_seq_len).key for c in CONFIGS_BY_NAME.values()]
    return covering_gene_keys() + named + [PROGRAM]


@pytest.mark.parametrize("block", ["gpt2", "llama"])
def test_matched_baseline_is_within_half_a_percent_for_every_family(block):
    spec = ModelSpec(vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_seq_len=16, dropout=0.0, block=block)
    plain = parameter_count(spec, AttentionGene.vanilla())
    widths = set()
    for key in zoo(spec):
        match = matched_baseline(spec, key)
        counted = parameter_count(spec.replace(d_ff=match["ffn_dim"]), AttentionGene.vanilla())
        assert counted == match["params"]
        assert abs(counted - match["candidate_params"]) <= MATCH_TOLERANCE * match["candidate_params"], key
        assert match["plain_params"] == plain
        widths.add(match["ffn_dim"])
    assert len(widths) > 3  # the families differ in size: the matched widths do too
    # the gated program is larger than vanilla: its baseline is widened
    assert matched_baseline(spec, PROGRAM)["ffn_dim"] > spec.ffn_dim


def test_the_plain_width_is_kept_for_a_gene_of_the_baselines_size():
    spec = ModelSpec(vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_seq_len=16)
    match = matched_baseline(spec, "dot|sparsemax|none|fixed|bias|0.10")
    assert match["d_ff"] is None and match["ffn_dim"] == 128 and match["off"] == 0


def test_a_candidate_beyond_any_width_is_refused():
    spec = ModelSpec(vocab_size=50, d_model=8, n_heads=2, n_layers=1, max_seq_len=16)
    from evo_attention.nn.matching import matched_width

    with pytest.raises(UserError, match="no feed-forward width") as err:
        matched_width(spec, 10**9)
    assert err.value.settings == ("match_params",)


def test_validate_with_matched_baselines(tmp_path):
    from evo_attention.data import data_from_config
    from evo_attention.search.store import RunStore

    config = Config(**TINY)
    data = data_from_config(config)
    with RunStore.create(tmp_path / "store", config=config.to_dict()) as store:
        result = validate_genes([GATED, "dot|sparsemax|none|fixed|bias|0.10"], config, data, n_seeds=2,
                                store=store, match_params=True)
        contexts = {r["context"] for r in store.evaluations() if r["gene"] == AttentionGene.vanilla().key}
    assert len(contexts) == 2  # the plain baseline and the gated gene's wider one: trials of their own
    gated, sparse = result.genes
    assert gated["versus"]["baseline"] == "matched" and gated["versus"]["d_ff"] > config.ffn_dim
    assert abs(gated["versus"]["off"]) <= MATCH_TOLERANCE
    assert sparse["versus"]["d_ff"] == config.ffn_dim  # same size as vanilla: the plain baseline is its match
    assert gated["versus_plain"]["verdict"] is not None
    assert gated["family_size"] == 2
    rows = {b["d_ff"]: b for b in result["matched_baselines"]}
    assert set(rows) == {config.ffn_dim, gated["versus"]["d_ff"]}
    assert rows[gated["versus"]["d_ff"]]["matched_to"] == [GATED]
    text = validation_markdown(result)
    assert "plain: FFN 64" in text and f"FFN {gated['versus']['d_ff']}," in text
    assert f"[vs the matched baseline, FFN {gated['versus']['d_ff']}]" in text
    assert "Versus the plain baseline" in text


def test_match_params_refuses_what_it_cannot_take_yet():
    config = Config(**TINY)
    with pytest.raises(UserError, match="match_params cannot be combined with n_seeds auto"):
        validate_genes([GATED], config, object(), n_seeds="auto", mde=0.01, match_params=True)


def test_validate_cli_match_params(tmp_path, capsys):
    out = tmp_path / "v"
    code = main(["validate", "--genes", GATED, *STUDY_FLAGS, "--seeds", "2", "--match-params", "--out", str(out)])
    assert code == 0
    result = json.loads((out / "validation.json").read_text())
    assert result["genes"][0]["versus"]["baseline"] == "matched"
    # the baseline's own --ffn 32 is the plain width; the gated gene's baseline is wider
    assert result["plain_baseline"]["d_ff"] == 32 and result["genes"][0]["versus"]["d_ff"] > 32
    code = main(["validate", "--genes", GATED, "--data", "recall", "--seeds", "auto", "--mde", "1%",
                 "--match-params", "--out", str(tmp_path / "w"), "--quiet"])
    assert code != 0
    assert "--match-params cannot be combined with --seeds auto" in capsys.readouterr().err


def test_compare_with_matched_baselines(tmp_path):
    from evo_attention.studies.compare import resolve_configs, run_compare

    config = Config(**{**TINY, "d_ff": 32, "train_steps": 2})
    entries = resolve_configs(["baseline", "bias_only", GATED, "dot|sparsemax|none|fixed|bias|0.10"], 16, 2, 16)
    result = run_compare(config, entries, seeds=2, out_dir=tmp_path, quiet=True, match_params=True)
    names = [a["name"] for a in result.aggregates]
    matches = result.settings["match_params"]
    assert set(matches) == {"bias_only", GATED, "dot|sparsemax|none|fixed|bias|0.10"}
    wider = matches[GATED]["ffn_dim"]
    assert wider > 32 and f"baseline (FFN {wider})" in names
    assert matches["dot|sparsemax|none|fixed|bias|0.10"]["ffn_dim"] == 32  # its match is the plain baseline
    assert "baseline (FFN 32)" not in names
    params = {a["name"]: a["params"] for a in result.aggregates}
    assert abs(params[f"baseline (FFN {wider})"] - params[GATED]) <= MATCH_TOLERANCE * params[GATED]
    paired = result.summary["paired"]
    assert paired[GATED]["versus"]["d_ff"] == wider and paired[GATED]["family_size"] == 3
    text = (tmp_path / "compare.md").read_text()
    assert f"[vs the matched baseline, FFN {wider}]" in text and "Parameter-matched baselines" in text


# -- seed blocks: the validations of several units never share a seed --------------------------------
def test_seed_blocks_are_disjoint_and_recorded(tmp_path):
    from evo_attention.studies.common import SEED_BLOCK_BASE, SEED_BLOCK_SIZE, StudySetup

    config = Config(**TINY)
    setups = [StudySetup.resolve(config, None, role="validate", n_seeds=5, seed_block=b, lr_grid="1e-3,2e-3")
              for b in (0, 1, 2)]
    used = [set(s.seeds) | set(s.tuning_seeds) for s in setups]
    assert all(not (a & b) for i, a in enumerate(used) for b in used[i + 1:])
    assert setups[1].seeds[0] == SEED_BLOCK_BASE + SEED_BLOCK_SIZE + 1
    assert setups[1].provenance()["seed_block"]["block"] == 1
    assert "seed_block" not in StudySetup.resolve(config, None, role="validate").provenance()
    # seeds auto: the pilot and every seed the plan may reach stay in the block
    planned = StudySetup.resolve(config, None, role="validate", n_seeds="auto", mde=0.01, seed_block=3)
    assert planned.base_seed == SEED_BLOCK_BASE + 3 * SEED_BLOCK_SIZE
    with pytest.raises(UserError, match="outside seed block 0.s verdict seeds") as err:
        StudySetup.resolve(config, None, role="validate", n_seeds="auto", mde=0.01, max_seeds=1500, seed_block=0)
    assert "seed_block" in err.value.settings
    with pytest.raises(UserError, match="seed_block -1"):
        StudySetup.resolve(config, None, role="validate", seed_block=-1)


def test_validate_cli_seed_block(tmp_path, capsys):
    out = tmp_path / "v"
    loud = [flag for flag in STUDY_FLAGS if flag != "--quiet"]
    assert main(["validate", "--genes", GATED, *loud, "--seeds", "2", "--seed-block", "4", "--lr-grid",
                 "1e-3,2e-3", "--tuning-seeds", "1", "--out", str(out)]) == 0
    result = json.loads((out / "validation.json").read_text())
    assert result["seeds"] == [1_008_001, 1_008_002] and result["seed_block"]["block"] == 4
    # the log line names the tuning seeds the block trains (its base + 1001), not --seed's
    assert "tuned on seed 1009001 " in capsys.readouterr().err
    assert main(["validate", "--genes", GATED, *STUDY_FLAGS, "--seed-block", "run", "--out", str(tmp_path / "w")]) != 0
    assert "--seed-block run takes the block of the --from-run run's search seed" in capsys.readouterr().err


# -- transfer and curve ------------------------------------------------------------------------------
def test_transfer_with_matched_baselines_at_every_size(tmp_path, capsys):
    out = tmp_path / "t"
    flags = [f for f in STUDY_FLAGS if f != "--quiet"]
    code = main(["transfer", "--genes", f"{GATED},dot|sparsemax|none|fixed|bias|0.10", *flags, "--sizes", "32x1",
                 "--seeds", "2", "--match-params", "--out", str(out), "--quiet"])
    assert code == 0
    result = json.loads((out / "transfer.json").read_text())
    assert result["match_params"] is True
    for size in result["sizes"]:
        gated = next(g for g in size["genes"] if g["gene"] == GATED)
        rows = {b["d_ff"]: b for b in size["matched_baselines"]}
        wide = rows[gated["versus"]["d_ff"]]
        assert gated["versus"]["baseline"] == "matched" and wide["matched_to"] == [GATED]
        assert wide["d_ff"] > size["d_ff"]  # wider than the plain baseline of this size
        assert abs(wide["params"] - gated["params"]) <= MATCH_TOLERANCE * gated["params"]
        assert gated["versus_plain"]["verdict"] is not None
        assert gated["family_size"] == 4  # two genes at two sizes, against their matched baselines
    # the matched widths follow each size (16x1 at FFN 32 and 32x1 at the block's default)
    widths = [next(g for g in s["genes"] if g["gene"] == GATED)["versus"]["d_ff"] for s in result["sizes"]]
    assert widths[0] != widths[1]
    text = (out / "transfer.md").read_text()
    assert "[vs the matched baseline, FFN" in text and "Versus the plain baseline" in text
    assert "matched baseline of" in text and "Parameter-matched baselines" in text
    capsys.readouterr()
    assert main(["transfer", "--genes", GATED, *STUDY_FLAGS, "--sizes", "32x1", "--match-params", "--lr-grid",
                 "1e-3,2e-3", "--out", str(tmp_path / "u")]) != 0
    assert "--match-params cannot be combined with --lr-grid" in capsys.readouterr().err
    assert main(["transfer", "--genes", GATED, *STUDY_FLAGS, "--sizes", "32x1", "--match-params", "--dry-run"]) != 0
    assert "--dry-run does not time the matched baselines of --match-params" in capsys.readouterr().err


def test_curve_matches_its_reference_gene_to_each_other_gene_at_every_point(tmp_path):
    from evo_attention.report.studies.curves import curve_markdown

    out = tmp_path / "c"
    flags = ["--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size", "4",
             "--eval-batch-size", "16", "--quiet"]
    sparse = "dot|sparsemax|none|fixed|bias|0.10"
    code = main(["curve", "--genes", f"{GATED},baseline,{sparse}", "--data",
                 "mqar:seq_len=16,vocab=16,train_examples=64,eval_examples=16", "--knob", "pairs=2,4", "--seeds", "2",
                 "--solve-threshold", "0.9", "--match-params", *flags, "--out", str(out)])
    assert code == 0
    result = json.loads((out / "curve.json").read_text())
    rows = {g["name"]: g for g in result["genes"]}
    matched = [g for g in result["genes"] if g.get("matched_to")]
    assert [g["matched_to"] for g in matched] == [[GATED]]  # sparsemax has the baseline's size: no row of its own
    wide = matched[0]
    # the reference as the curve trains it: on a generated task the named baseline has no attention dropout
    assert wide["gene"] == rows["baseline"]["gene"] == AttentionGene.vanilla().replace(attention_dropout=0.0).key
    assert all(w > 32 for w in wide["ffn"])
    assert wide["name"] == f"baseline (FFN {wide['ffn'][0]})"
    for params, gated in zip(wide["params"], wide["candidate_params"][GATED]):
        assert gated > parameter_count(ModelSpec(vocab_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                                 max_seq_len=16), AttentionGene.vanilla())
        assert abs(params - gated) <= MATCH_TOLERANCE * gated
    assert all(p["n_ok"] == 2 for p in wide["points"])
    # the verdicts: the gated gene against its matched baseline, sparsemax against the plain one
    assert rows[GATED]["points"][0]["solve_versus"]["versus"] == wide["name"]
    assert rows[sparse]["points"][0]["solve_versus"]["versus"] == "baseline"
    assert rows[GATED]["points"][0]["solve_versus_plain"]["versus"] == "baseline"
    assert result["solve"]["family_size"] == 4 and result["solve"]["matched"] is True
    assert "Parameter-matched" in curve_markdown(result) and wide["name"] in curve_markdown(result)


def test_the_validation_headline_reads_the_first_matched_baseline_of_the_best_gene():
    from evo_attention.report.studies.validation import validation_headline
    result = {"genes": [{"gene": "g", "mean": 1.0}], "baseline": {"mean": 2.0}, "seeds": [1, 2],
              "matched_baselines": [{"matched_to": ["g"], "d_ff": 9}, {"matched_to": ["g"], "d_ff": 7},
                                    {"matched_to": None}]}  # entries after the first match are never read
    assert "the matched baseline (FFN 9)" in validation_headline(result)
