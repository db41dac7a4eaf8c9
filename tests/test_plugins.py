"""Plugins reach every worker; their bad input is a one-line error; a run remembers its plugins."""

import json
import sqlite3
import sys
import textwrap

import pytest
import torch

from evo_attention import EvolvedAttention
from evo_attention.cli import main
from evo_attention.nn import components
from evo_attention.util.errors import UserError
from evo_attention.util.plugins import load_plugins, with_given_plugins

FLAGS = ["--preset", "quick", "--steps", "4", "--population", "3", "--generations", "2", "--elite", "1",
         "--d-model", "16", "--heads", "2", "--layers", "1", "--quiet"]
PLUGIN = textwrap.dedent('''
    import torch
    from evo_attention import register_normalization, row_normalize

    __version__ = "0.1"

    @register_normalization("cubed_relu")
    def cubed_relu(scores, mask):
        return row_normalize(torch.relu(scores.float()) ** 3, mask).to(scores.dtype)
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "cubed_plugin.py").write_text(PLUGIN)
    (tmp_path / "space.yaml").write_text("search_space:\n  normalization: [cubed_relu]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    components.unregister("normalization", "cubed_relu")
    sys.modules.pop("cubed_plugin", None)  # the next test imports it afresh and registers again


def _genes(run):
    with sqlite3.connect(run / "run.db") as conn:
        return [(g, s) for g, s in conn.execute("SELECT gene, status FROM evaluations WHERE role = 'search'")]


@pytest.mark.parametrize("executor", [["--workers", "2"], ["--executor", "ray", "--workers", "2"]])
def test_a_plugin_normalization_trains_in_every_worker(plugin, executor):
    if "ray" in executor:
        pytest.importorskip("ray")
    run = plugin / "run"
    assert main(["search", *FLAGS, "--config", "space.yaml", "--plugin", "cubed_plugin", *executor,
                 "--out", str(run)]) == 0
    genes = _genes(run)
    assert genes and all("|cubed_relu|" in g and s == "ok" for g, s in genes)
    with sqlite3.connect(run / "run.db") as conn:
        stored = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'plugins'").fetchone()[0])
    assert stored == [{"module": "cubed_plugin", "version": "0.1"}]


def test_resume_loads_the_run_s_plugins_and_names_a_missing_one(plugin, capsys):
    run = plugin / "run"
    assert main(["search", *FLAGS, "--config", "space.yaml", "--plugin", "cubed_plugin", "--out", str(run)]) == 0
    assert main(["search", "--resume", "--out", str(run), "--quiet"]) == 0  # the stored config names the plugin
    (plugin / "cubed_plugin.py").rename(plugin / "moved.py")
    sys.modules.pop("cubed_plugin", None)
    components.unregister("normalization", "cubed_relu")
    capsys.readouterr()
    assert main(["search", "--resume", "--out", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plugin cubed_plugin could not be imported (ModuleNotFoundError" in err and "\n" not in err


def test_a_resume_through_the_api_without_the_plugin_is_refused(plugin, tmp_path):
    from evo_attention import Config, Evolution

    run = plugin / "api"
    assert main(["search", *FLAGS, "--config", "space.yaml", "--plugin", "cubed_plugin", "--out", str(run)]) == 0
    with sqlite3.connect(run / "run.db") as conn:
        config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
    with pytest.raises(UserError, match="made with plugin cubed_plugin, which is not loaded"):
        Evolution(Config.from_dict({**config, "plugins": []}), out_dir=run, resume=True)


@pytest.mark.parametrize("source, fragment", [
    ("import not_a_module_anywhere\n", "plugin broken_plugin could not be imported (ModuleNotFoundError"),
    ("raise RuntimeError('half done')\n", "plugin broken_plugin could not be imported (RuntimeError: half done)"),
    ("from evo_attention import register_normalization\n@register_normalization('softmax')\ndef f(s, m):\n"
     "    return s\n", "normalization 'softmax' is registered already"),
])
def test_bad_plugins_are_one_line_errors_before_any_training(source, fragment, tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_plugin.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_plugin", raising=False)
    assert main(["search", *FLAGS, "--plugin", "broken_plugin", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err
    assert not (tmp_path / "run" / "run.db").exists()


def test_a_plugin_file_path_and_a_missing_file(tmp_path):
    (tmp_path / "by_path.py").write_text("VALUE = 3\n")
    assert load_plugins([str(tmp_path / "by_path.py")]) == [{"module": str(tmp_path / "by_path.py"), "version": None}]
    with pytest.raises(UserError, match="plugin file .* does not exist"):
        load_plugins([str(tmp_path / "nope.py")])


def test_a_plugin_dataset_and_strategy(tmp_path, monkeypatch):
    (tmp_path / "more_plugin.py").write_text(textwrap.dedent('''
        from evo_attention import register_strategy
        from evo_attention.data import register_dataset, load_data
        from evo_attention.search.random_search import RandomSearch

        @register_dataset("tiny_recall")
        def tiny_recall(settings):
            return load_data("recall", vocab_size=32, seq_len=settings["seq_len"], num_pairs=2)

        @register_strategy("random_again")
        class RandomAgain(RandomSearch):
            pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(["search", "--plugin", "more_plugin", "--data", "tiny_recall", "--strategy", "random_again",
                 "--seq-len", "16", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps", "2",
                 "--population", "2", "--generations", "1", "--elite", "1", "--batch-size", "8",
                 "--eval-batch-size", "64", "--workers", "2", "--quiet", "--out", str(out)]) == 0
    assert len(_genes(out)) == 2


FOLDING_PLUGIN = textwrap.dedent('''
    import torch
    from evo_attention import register_normalization, register_similarity, row_normalize
    from evo_attention.nn.components import Similarity

    @register_normalization("squared_relu")
    def squared_relu(scores, mask):
        return row_normalize(torch.relu(scores.float()) ** 2, mask).to(scores.dtype)

    @register_similarity("key_norm_dot")
    class KeyNormDot(Similarity):
        """q . k minus half the key's squared length (a distance-like score), per head."""

        def forward(self, q, k):
            return q @ k.transpose(-2, -1) - 0.5 * k.square().sum(-1).unsqueeze(-2)
''')
TINY_FLAGS = ["--preset", "quick", "--d-model", "16", "--heads", "2", "--layers", "1", "--precision", "fp32"]


def test_a_plugin_normalization_and_similarity_train_folded(tmp_path, monkeypatch, capsys):
    """Components a user's module registers fold into a batch with no edit outside the module: bench
    times K of them in one trainer, and validate's per-seed values batched equal them trained alone."""
    from evo_attention.search.executors import base
    from evo_attention.train.trainer import SAME_RESULT_RTOL

    batches, run_batched = [], base.run_batched

    def counting(trials, data, **kwargs):  # what each batch the executor planned gave
        results = run_batched(trials, data, **kwargs)
        batches.append([r.record.extra.get("batched") for r in results])
        return results

    monkeypatch.setattr(base, "run_batched", counting)
    (tmp_path / "folding_plugin.py").write_text(FOLDING_PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    gene = "key_norm_dot|squared_relu|none|fixed"
    try:
        assert main(["bench", "--plugin", "folding_plugin", "--gene", gene, "--models", "4", "--steps", "2",
                     "--warmup", "1", "--json", *TINY_FLAGS]) == 0
        assert json.loads(capsys.readouterr().out)["models"] == 4
        values = {}
        for k in ("2", "off"):
            out = tmp_path / f"validate-{k}"
            assert main(["validate", "--plugin", "folding_plugin", "--genes", gene, "--seeds", "2", "--batch-models",
                         k, "--steps", "30", "--out", str(out), "--quiet", *TINY_FLAGS]) == 0
            result = json.loads((out / "validation.json").read_text())
            values[k] = [g["values"] for g in result["genes"]] + [result["baseline"]["values"]]
        assert batches and all(sizes == [2, 2] for sizes in batches)  # folded, never a fallback to alone
        for on, off in zip(values["2"], values["off"]):
            assert on == pytest.approx(off, rel=SAME_RESULT_RTOL["fp32"])
    finally:
        components.unregister("normalization", "squared_relu")
        components.unregister("similarity", "key_norm_dot")
        sys.modules.pop("folding_plugin", None)


def test_timing_k_models_of_a_component_that_cannot_fold_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "weighted_plugin.py").write_text(textwrap.dedent('''
        import torch
        from evo_attention import register_similarity
        from evo_attention.nn.components import Similarity

        @register_similarity("unfolded_scale")
        class UnfoldedScale(Similarity):
            def __init__(self, d_head, n_heads):
                super().__init__(d_head, n_heads)
                self.scale = torch.nn.Parameter(torch.ones(n_heads, 1, 1))

            def forward(self, q, k):
                return self.scale * (q @ k.transpose(-2, -1))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert main(["bench", "--plugin", "weighted_plugin", "--gene", "unfolded_scale|softmax|none|fixed",
                     "--models", "2", "--steps", "1", "--warmup", "1", *TINY_FLAGS]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "similarity 'unfolded_scale' cannot be folded" in err and "--models" in err
    finally:
        components.unregister("similarity", "unfolded_scale")
        sys.modules.pop("weighted_plugin", None)



def test_a_plugin_normalization_that_weighs_or_reads_masked_keys_is_refused():
    def forgets_mask(scores, mask):  # weighs every key, the future ones too
        return torch.softmax(scores, dim=-1)

    def reads_mask(scores, mask):  # zero on masked keys, but its rows are normalized over them
        return components.zero_masked(torch.softmax(scores, dim=-1), mask)

    for fn in (forgets_mask, reads_mask):
        with pytest.raises(UserError, match="normalization 'bad_mask' weighs masked keys or reads their scores"):
            components.register_normalization("bad_mask")(fn)
        assert "bad_mask" not in components.NORMALIZATIONS
    components.register_normalization("good_mask")(lambda scores, mask: components.row_normalize(
        torch.relu(scores), mask))  # the documented way passes
    components.unregister("normalization", "good_mask")


def test_a_name_with_whitespace_and_a_similarity_that_is_no_module_class_are_refused():
    for name in (" sq ", "s q", ""):  # a gene key's names are read back stripped
        with pytest.raises(UserError, match="must be a non-empty string without whitespace"):
            components.register_normalization(name)
    for register in (components.register_similarity, components.register_temperature, components.register_gating):
        with pytest.raises(TypeError, match=r"^register_\w+\('f'\) decorates an nn.Module class that builds"):
            register("f")(lambda *args: args[0])
    assert "f" not in components.SIMILARITIES


def test_a_model_trained_with_a_plugin_file_generates_and_exports_from_any_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "saved_norm.py").write_text(PLUGIN.replace("cubed_relu", "saved_cubed"))
    monkeypatch.chdir(tmp_path / "a")

    def forget():  # a fresh process: neither the component nor the module is known
        components.unregister("normalization", "saved_cubed")
        sys.modules.pop("evo_attention_plugin_saved_norm", None)

    try:
        assert main(["baseline", "--plugin", "saved_norm.py", "--gene", "dot|saved_cubed|none|fixed", "--data",
                     "recall", "--vocab-size", "32", "--d-model", "16", "--heads", "2", "--layers", "1", "--steps",
                     "2", "--batch-size", "4", "--eval-steps", "1", "--save-model", "--out", "run", "--quiet"]) == 0
        forget()  # generate and attention-maps import the model's own plugins (a relative path, here)
        assert main(["generate", "--model", "run/model", "--prompt", "k1 v2", "--max-new-tokens", "2"]) == 0
        forget()
        assert main(["attention-maps", "--model", "run/model", "--length", "4", "--out", "maps", "--quiet"]) == 0
        forget()
        monkeypatch.chdir(tmp_path)  # elsewhere the saved relative path is nothing; --plugin stands in for it
        assert main(["export", "--model", "a/run/model", "--out", "x"]) == 2
        assert "saved_norm.py does not exist" in capsys.readouterr().err
        for command in (["export", "--model", "a/run/model", "--out", "x"],
                        ["generate", "--model", "a/run/model", "--prompt", "k1", "--max-new-tokens", "1"]):
            forget()
            assert main([*command, "--plugin", str(tmp_path / "a" / "saved_norm.py")]) == 0
        forget()
        monkeypatch.setattr("evo_attention.train.spec._TASK_DATA", {})  # the task is built again, as in a new process
        capsys.readouterr()
        assert main(["export", "--model", "a/run/model", "--format", "hf", "--out", "hf", "--plugin",
                     str(tmp_path / "a" / "saved_norm.py")]) == 0  # its harness task too
        assert "lm-evaluation-harness task:" in capsys.readouterr().err
        assert (tmp_path / "hf" / "lm_eval_task.yaml").is_file()
    finally:
        forget()


def test_two_plugin_files_of_one_name_are_refused(tmp_path, capsys):
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same_name.py").write_text("VALUE = 1\n")
    with pytest.raises(UserError, match="plugin files .*one/same_name.py and .*two/same_name.py have the same name"):
        load_plugins([str(tmp_path / "one" / "same_name.py"), str(tmp_path / "two" / "same_name.py")])


def test_one_command_reads_the_entry_points_once(plugin, monkeypatch):
    """A baseline read every installed distribution's entry points four times (main before its parser and again
    before the command, the settings, the config check): once a process now."""
    from importlib import metadata

    from evo_attention.util import plugins

    reads, entry_points = [], metadata.entry_points
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda **kw: reads.append(kw) or entry_points(**kw))
    assert main(["baseline", "--preset", "quick", "--steps", "4", "--d-model", "16", "--heads", "2", "--layers", "1",
                 "--quiet", "--plugin", "cubed_plugin", "--out", "run"]) == 0
    assert reads.count({"group": plugins.ENTRY_POINT_GROUP}) <= 1  # none where an earlier test read them


TASK_PLUGIN = textwrap.dedent('''
    import torch
    from evo_attention import register_task
    from evo_attention.data.synthetic import Task

    @register_task("help_echo")
    class HelpEcho(Task):  # every token is its own answer
        defaults = {"vocab": 8}

        def symbols(self, k):
            return [f"s{i}" for i in range(k["vocab"])]

        def answers_per_example(self, k):
            return k["seq_len"]

        def chance(self, k):
            return 1 / k["vocab"]

        def generate(self, n, k, generator, seed):
            x = torch.randint(k["vocab"], (n, k["seq_len"]), generator=generator)
            return x, x.clone()
''')


@pytest.mark.parametrize("command", ["search", "validate"])
def test_a_plugin_s_task_is_in_the_help_and_a_bad_plugin_stays_one_line(command, tmp_path, capsys):
    from evo_attention.data import unregister_task

    (tmp_path / "help_task.py").write_text(TASK_PLUGIN)
    for plugin in (["--plugin", str(tmp_path / "help_task.py")], [f"--plugin={tmp_path / 'help_task.py'}"]):
        try:
            with pytest.raises(SystemExit) as info:
                main([command, *plugin, "--help"])
            assert info.value.code == 0 and "help_echo)[:knob=value" in " ".join(capsys.readouterr().out.split())
        finally:  # the next one imports it afresh
            unregister_task("help_echo")
            sys.modules.pop("evo_attention_plugin_help_task", None)
    assert main([command, "--plugin", "no_such_plugin_here", "--help"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plugin no_such_plugin_here could not be imported" in err and "\n" not in err


def test_a_run_started_with_a_relative_plugin_file_resumes_from_another_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "resume_norm.py").write_text(PLUGIN.replace("cubed_relu", "resume_cubed"))
    (tmp_path / "a" / "space.yaml").write_text("search_space:\n  normalization: [resume_cubed]\n")
    run = tmp_path / "run"

    def forget():  # a fresh process: neither the component nor the module is known
        components.unregister("normalization", "resume_cubed")
        sys.modules.pop("evo_attention_plugin_resume_norm", None)

    try:
        monkeypatch.chdir(tmp_path / "a")
        assert main(["search", *FLAGS[:2], "--steps", "2", "--population", "2", "--elite", "1", "--generations", "1",
                     *FLAGS[10:], "--no-baseline", "--config", "space.yaml", "--plugin", "resume_norm.py",
                     "--out", str(run)]) == 0
        monkeypatch.chdir(tmp_path / "b")  # the stored path resume_norm.py names nothing here
        for command in (["search", "--resume", "--out", str(run), "--quiet"],
                        ["validate", "--from-run", str(run), "--seeds", "2", "--out", "v", "--quiet"]):
            forget()
            capsys.readouterr()
            assert main(command) == 2
            err = capsys.readouterr().err.strip()
            assert "plugin file resume_norm.py does not exist in" in err and "the directory it started in" in err
            assert "give the file's place with --plugin PATH" in err and "\n" not in err
        forget()  # a file of the same name stands in for the stored one; the run keeps what it stored
        assert main(["search", "--resume", "--out", str(run), "--quiet", "--plugin",
                     str(tmp_path / "a" / "resume_norm.py")]) == 0
        with sqlite3.connect(run / "run.db") as conn:
            config = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])
        assert config["plugins"] == ["resume_norm.py"]
        forget()  # a file that stands in for none is still another run's setting
        (tmp_path / "b" / "other.py").write_text("")
        assert main(["search", "--resume", "--out", str(run), "--quiet", "--plugin", "other.py"]) == 2
        assert "--plugin other.py contradicts the run" in capsys.readouterr().err
    finally:
        forget()


def test_a_config_file_s_plugin_file_is_read_from_the_file_s_folder(tmp_path, monkeypatch):
    from evo_attention.train.presets import merged_settings

    for folder in ("x", "x/sub", "y"):
        (tmp_path / folder).mkdir()
    (tmp_path / "x" / "near_cfg.py").write_text("VALUE = 1\n")
    (tmp_path / "x" / "sub" / "deep_cfg.py").write_text("VALUE = 2\n")
    (tmp_path / "x" / "cfg.yaml").write_text("plugins: [near_cfg.py, sub/deep_cfg.py, json]\n")
    monkeypatch.chdir(tmp_path / "y")  # not where the files are: the config file's folder is
    folder = (tmp_path / "x").resolve()
    plugins = merged_settings(config_file="../x/cfg.yaml")["plugins"]
    assert plugins == [str(folder / "near_cfg.py"), str(folder / "sub" / "deep_cfg.py"), "json"]  # stored so
    try:
        assert [p["module"] for p in load_plugins(plugins)] == plugins
    finally:
        for name in ("near_cfg", "deep_cfg"):
            sys.modules.pop(f"evo_attention_plugin_{name}", None)


def test_a_given_file_stands_in_for_a_stored_file_of_its_name_or_a_module_of_its_stem():
    stored = ["my_lab.attn", "other", "plugins/b.py", "y_plug"]
    assert with_given_plugins(stored, ["/x/attn.py", "c/b.py", "/tmp/y_plug.py"]) == [
        "/x/attn.py", "other", "c/b.py", "/tmp/y_plug.py"]
    assert with_given_plugins(["a.attn", "attn.py"], ["b.attn"]) == ["a.attn", "attn.py", "b.attn"]  # a module: none
