"""export --format hf: a transformers model directory that runs the library's own model.

The directories are loaded through the Auto classes in a fresh interpreter where evo_attention
cannot be imported (the code must come from the directory), for the gpt2 and llama blocks, a
per-layer genome, and the word, char, byte and BPE tokenizers: the logits equal the library's, greedy
generation (with the library's cache, past the window too, and without a cache) gives the library's
tokens, and the tokenizer gives the library tokenizer's ids. The tests that load need transformers
(and the lm-evaluation-harness one lm_eval); the others run without it.
"""

import ast
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evo_attention import TinyTransformer
from evo_attention.cli import main
from evo_attention.data.tokenizers import encode_prompt, train_tokenizer
from evo_attention.interop.export import module_sources, shipped_modules
from evo_attention.interop.hf import MODEL_ROOTS, export_hf, hf_tokenizer, model_sources
from evo_attention.nn.decoding import generate
from evo_attention.nn.spec import ModelSpec
from evo_attention.train.saving import save_model
from evo_attention.util.errors import UserError

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")

TEXT = "".join(f"the {a} sat on the {b} , and a {b} ran to the {a} .\n"
               for a in ("cat", "dog", "bird", "fox", "owl") for b in ("mat", "log", "tree", "hill")) * 3
SAMPLES = ["the cat sat on the mat .\nthe owl ran\n", "a fox and a zebra\n", "the dog", "x\r\ny\rz\n\n \t ü😀\n"]
WINDOW = 12
TOLERANCE = 1e-5  # float32 logits (scale ~2); measured: 0.0 on an AMD EPYC, up to 1.4e-6 on an Intel Xeon (AVX-512)

# (name, tokenizer, block, genes per layer)
CASES = [
    ("gpt2_word", "word", "gpt2", ["dot|softmax|none|fixed|bias|0.10|pos=learned|lr=0.002"] * 2),  # a recipe part
    ("llama_bpe", "bpe:300", "llama", ["cosine|entmax15|output_gate|adaptive|nobias|0.00|pos=rope|kvh=2"] * 2),
    ("layers_char", "char", "llama", ["dot|softmax|none|fixed|nobias|0.00|pos=rope",
                                      "cosine|linear|highway|adaptive|bias|0.00|pos=rope|kvh=2",
                                      "additive|sigmoid|input_gate|learned|nobias|0.00|pos=alibi|abias=rel|win=3"]),
    ("gpt2_byte_favor", "byte", "gpt2", ["dot|favor|output_gate|fixed|bias|0.00|pos=none"] * 2),
    ("llama_char_program", "char", "llama",  # a program, and the dconv axis: decoded by recomputation
     ["prog=o(sgate(mix(w.softmax(t.learned(s.dot(dconv3(q),k))),v)))|nobias|0.00|pos=rope|kvh=2",
      "dot|softmax|none|fixed|nobias|0.00|pos=rope|dconv=2"]),
]

# Runs in a fresh interpreter with evo_attention blocked: everything comes from the directories.
LOAD = r'''
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "evo_attention":
            raise ImportError("evo_attention must not be needed")
sys.meta_path.insert(0, Block())
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging
logging.set_verbosity_error()
result = {}
for case in json.loads(sys.argv[1]):
    d = case["dir"]
    config = AutoConfig.from_pretrained(d, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(d, trust_remote_code=True)
    # without the flag transformers 5 first asks whether to run the directory's code (for the config,
    # which it reads to find the tokenizer class); declined, it reads the tokenizer alone
    plain_tokenizer = AutoTokenizer.from_pretrained(d)
    io = torch.load(d + "/io.pt")
    with torch.no_grad():
        logits = model(io["ids"]).logits
        labels_loss = float(model(io["ids"], labels=io["ids"]).loss)
    prompt = io["ids"][:1, :4]
    cached = model.generate(prompt, max_new_tokens=case["new"], do_sample=False)[0, 4:]
    plain = model.generate(prompt, max_new_tokens=case["window"] - 4, do_sample=False, use_cache=False)[0, 4:]
    result[case["name"]] = {
        "type": type(model).__name__, "genes": config.genes, "block": config.block, "dtype": str(model.dtype),
        "error": float((logits - io["logits"]).abs().max()), "loss": labels_loss,
        "cached": cached.tolist(), "plain": plain.tolist(),
        "ids": [tokenizer(text).input_ids for text in case["samples"]],
        "plain_ids": [plain_tokenizer(text).input_ids for text in case["samples"]],
        "decoded": [tokenizer.decode(tokenizer(text).input_ids) for text in case["samples"]],
        "eos": tokenizer.eos_token, "max_length": tokenizer.model_max_length,
    }
assert "evo_attention" not in sys.modules
print("RESULT", json.dumps(result))
'''


def _model(genes, block, vocab_size, seed=0) -> TinyTransformer:
    spec = ModelSpec(vocab_size=vocab_size, d_model=32, n_heads=4, n_layers=len(genes), max_seq_len=WINDOW,
                     dropout=0.0, block=block)
    torch.manual_seed(seed)
    model = TinyTransformer(spec, genes).eval()
    with torch.no_grad():  # weights far from their initialisation, so that every piece matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def _env(tmp_path) -> dict:
    # transformers' module cache inside the test's folder; nothing is fetched
    return {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1"}


def _library_ids(tokenizer, text):
    """What the HF tokenizer must give: the library's encode (word level: encode_prompt, which is the
    same for a text ending in a newline)."""
    if tokenizer.kind == "word":
        return encode_prompt(tokenizer, text)[0]
    return tokenizer.encode(text).ids.tolist()


# -- the flat layout of the library's modules --------------------------------------------------
def test_flat_sources_are_the_library_files_with_only_their_imports_changed():
    flat = module_sources(MODEL_ROOTS, flat=True)
    modules = shipped_modules(MODEL_ROOTS)
    assert sorted(flat) == sorted(name.replace(".", "_") + ".py" for name in modules)
    assert "evo_attention_nn_model.py" in flat and "evo_attention_nn_attention.py" in flat
    for name in modules:
        library = Path(importlib.util.find_spec(name).origin).read_text(encoding="utf-8").splitlines()
        shipped = flat[name.replace(".", "_") + ".py"].splitlines()
        assert len(library) == len(shipped), name
        for before, after in zip(library, shipped):
            if before != after:  # an import of the library, now relative to the folder
                assert "from evo_attention" in before and after.lstrip().startswith("from ."), (before, after)
        tree = ast.parse("\n".join(shipped))
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n.module for n in imports if not n.level and n.module.startswith("evo_attention")]
        for node in imports:  # each relative import names a shipped file
            if node.level:
                assert node.level == 1
                targets = [node.module] if node.module else [a.name for a in node.names]
                assert all(f"{t}.py" in flat for t in targets), targets


def test_the_modeling_file_names_every_shipped_module_as_transformers_follows_them():
    # transformers copies the files reached by "from .<module> import" lines (a regex on the text)
    import re

    sources = model_sources()
    reached, todo = set(), ["modeling_evo_attention.py", "configuration_evo_attention.py"]
    while todo:
        name = todo.pop()
        reached.add(name)
        for module in re.findall(r"^\s*from\s+\.(\S+)\s+import", sources[name], flags=re.MULTILINE):
            if f"{module}.py" not in reached:
                todo.append(f"{module}.py")
    assert reached == set(sources)


def test_tokenizers_give_the_library_ids():
    from tokenizers import Tokenizer as FastTokenizer

    for kind in ("word", "char", "byte", "bpe:300"):
        tokenizer = train_tokenizer(kind, TEXT, 40)
        fast = FastTokenizer.from_str(hf_tokenizer(tokenizer)[0])
        for text in SAMPLES + [TEXT]:
            ids = fast.encode(text).ids
            assert ids == _library_ids(tokenizer, text), (kind, text)
            library_ids = tokenizer.encode(text).ids.tolist() if kind != "word" else ids
            assert fast.decode(ids, skip_special_tokens=False) == tokenizer.decode(library_ids), (kind, text)
    # every character Python's str.split() splits words on (the word recipe) is a space here too
    spaces = "".join(chr(c) for c in range(0x3100) if chr(c).isspace())
    word = train_tokenizer("word", TEXT, 40)
    text = f"the{spaces}cat\n"
    assert FastTokenizer.from_str(hf_tokenizer(word)[0]).encode(text).ids == word.encode(text).ids.tolist()


def test_export_refuses_a_model_without_its_tokenizer_or_with_another(tmp_path):
    model = _model(["dot|softmax|none|fixed"] * 2, "gpt2", 256)
    with pytest.raises(UserError, match="tokenizer"):
        export_hf(model, None, tmp_path / "a")
    with pytest.raises(UserError, match="40 tokens but the model 256"):
        export_hf(model, train_tokenizer("word", TEXT, 40), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- loading through the Auto classes ---------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    cases, models = [], {}
    for name, kind, block, genes in CASES:
        tokenizer = train_tokenizer(kind, TEXT, 40)
        model = _model(genes, block, tokenizer.vocab_size, seed=len(cases))
        out = root / name
        export_hf(model, tokenizer, out)
        ids = tokenizer.encode(TEXT).ids[:2 * WINDOW].view(2, WINDOW)
        with torch.no_grad():
            logits = model(ids)
        torch.save({"ids": ids, "logits": logits}, out / "io.pt")
        new = WINDOW + 6  # past the window: the caches are refilled from its last WINDOW tokens
        expected = {"cached": generate(model, ids[0, :4].tolist(), new, temperature=0),
                    "plain": generate(model, ids[0, :4].tolist(), WINDOW - 4, temperature=0, use_cache=False),
                    "ids": [_library_ids(tokenizer, t) for t in SAMPLES],
                    "decoded": [tokenizer.decode(tokenizer.encode(t).ids) for t in SAMPLES if t.endswith("\n")],
                    "loss": float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                                     ids[:, 1:].flatten())),
                    "genes": [g.key for g in model.genes], "block": block}
        cases.append({"name": name, "dir": str(out), "new": new, "window": WINDOW, "samples": SAMPLES,
                      "expected": expected, "kind": kind})
        models[name] = model, tokenizer
    return root, cases, models


TIE = 1e-4  # two logits this close are a tie that float reassociation may break either way


def _same_greedy(model, prompt, got, expected, name):
    """Two greedy continuations agree token for token, up to a step whose two choices the library
    model scores within ``TIE`` of each other (an untrained model's near-tie: another process's
    reduction order may break it the other way, and from there the continuations part)."""
    for i, (a, b) in enumerate(zip(got, expected)):
        if a == b:
            continue
        context = (prompt + expected[:i])[-WINDOW:]
        with torch.no_grad():
            logits = model(torch.tensor([context]))[0, -1]
        gap = float((logits[a] - logits[b]).abs())
        assert gap <= TIE, f"{name}: greedy step {i} chose {a} instead of {b} with logits {gap:.2e} apart"
        return
    assert len(got) == len(expected), name


@needs_transformers
def test_auto_classes_load_the_export_in_a_fresh_interpreter(exported, tmp_path):
    root, cases, models = exported
    done = subprocess.run([sys.executable, "-c", LOAD, json.dumps(cases)], capture_output=True, text=True,
                          env=_env(tmp_path), stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULT ")[-1])
    for case in cases:
        got, expected = results[case["name"]], case["expected"]
        assert got["type"] == "EvoAttentionForCausalLM" and got["dtype"] == "torch.float32"
        assert got["genes"] == expected["genes"] and got["block"] == expected["block"]
        assert got["error"] <= TOLERANCE, (case["name"], got["error"])
        assert math.isclose(got["loss"], expected["loss"], rel_tol=1e-5)
        model = models[case["name"]][0]
        prompt = torch.load(case["dir"] + "/io.pt")["ids"][0, :4].tolist()
        _same_greedy(model, prompt, got["cached"], expected["cached"], case["name"])  # past the window too
        _same_greedy(model, prompt, got["plain"], expected["plain"], case["name"])
        assert got["ids"] == expected["ids"] == got["plain_ids"], case["name"]
        assert [d for d, t in zip(got["decoded"], SAMPLES) if t.endswith("\n")] == expected["decoded"]
        assert got["max_length"] == WINDOW
        assert got["eos"] == ("<eos>" if case["kind"] == "word" else None)


@needs_transformers
def test_the_wrapper_in_process_batches_pads_and_saves_again(exported, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    root, cases, models = exported
    model = AutoModelForCausalLM.from_pretrained(cases[1]["dir"], trust_remote_code=True)
    io = torch.load(Path(cases[1]["dir"]) / "io.pt")
    ids = io["ids"]
    import logging as std_logging

    said = []
    handler = std_logging.Handler(std_logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logging.set_verbosity_warning()
    std_logging.Logger.warning_once.cache_clear()  # a warning said earlier in this process is said again
    logging.get_logger().addHandler(handler)
    try:
        with torch.no_grad():
            model.generate(ids[:1, :5], max_new_tokens=3, do_sample=False)
    finally:
        logging.get_logger().removeHandler(handler)
        logging.set_verbosity_error()
    assert not [line for line in said if "deprecat" in line], said  # the export speaks transformers' current API
    with torch.no_grad():  # a batch of two prompts, greedy, with the cache: each row as alone
        both = model.generate(ids[:, :5], max_new_tokens=3, do_sample=False)
        for row in range(2):
            assert torch.equal(both[row], model.generate(ids[row:row + 1, :5], max_new_tokens=3, do_sample=False)[0])
        mask = torch.ones_like(ids)
        mask[1, 8:] = 0  # right padding leaves the real positions as they are
        assert torch.allclose(model(ids, attention_mask=mask).logits, io["logits"], atol=TOLERANCE, rtol=0)
        # left padding: each row gives the numbers it gives alone on its real tokens
        left = torch.ones_like(ids)
        left[1, :3] = 0
        padded = model(ids, attention_mask=left).logits
        assert torch.allclose(padded[0], io["logits"][0], atol=TOLERANCE, rtol=0)
        assert torch.allclose(padded[1, 3:], model(ids[1:, 3:]).logits[0], atol=TOLERANCE, rtol=0)
        left[0, 5] = 0  # a hole inside a sequence
        with pytest.raises(ValueError, match="inside a sequence"):
            model(ids, attention_mask=left)
    model.save_pretrained(tmp_path / "again")  # transformers' own save copies the code and the weights
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again", trust_remote_code=True)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    assert again.model.head.weight is again.model.tok_emb.weight  # still tied


@needs_transformers
def test_every_export_pads_with_a_token_of_its_own_and_batches_as_the_docs_say(exported, tmp_path, monkeypatch):
    """The padding token is id vocab_size, which no text gives (not even its own name): a leading newline
    is never read as padding when transformers infers a mask from input_ids != pad_token_id, and the
    batch recipe of docs/export.md (left padding, padding=True) generates each row as alone, a row that
    ends early (eos) followed by padding, for the word, BPE, char and byte tokenizers."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    root, cases, models = exported
    prompts = ["the cat sat", "\nthe <pad>"]  # within the window of the char and byte models
    for case in cases[:4]:
        model = AutoModelForCausalLM.from_pretrained(case["dir"], trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(case["dir"], trust_remote_code=True)
        library_tokenizer = models[case["name"]][1]
        assert tokenizer.pad_token_id == library_tokenizer.vocab_size == model.config.vocab_size, case["name"]
        ids = tokenizer(prompts[1], return_tensors="pt").input_ids
        assert ids[0].tolist() == _library_ids(library_tokenizer, prompts[1]), case["name"]
        with torch.no_grad():
            out = model.generate(ids, pad_token_id=tokenizer.pad_token_id, max_new_tokens=1, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True)
            assert torch.allclose(out.scores[0][0], model(ids).logits[0, -1], atol=TOLERANCE, rtol=0), case["name"]
            tokenizer.padding_side = "left"
            batch = tokenizer(prompts, return_tensors="pt", padding=True)
            both = model.generate(**batch, max_new_tokens=3, do_sample=False)
            alone = [model.generate(**tokenizer([p], return_tensors="pt"), max_new_tokens=3, do_sample=False)[0, -3:]
                     for p in prompts]
            assert [row[-3:].tolist() for row in both] == [a.tolist() for a in alone], case["name"]
            real = batch.attention_mask.bool()  # without the mask, the padding is read from the padding token
            assert torch.equal(model(batch.input_ids).logits[real], model(**batch).logits[real]), case["name"]
            ended = model.generate(**batch, max_new_tokens=3, do_sample=False, eos_token_id=int(alone[0][0]),
                                   pad_token_id=tokenizer.pad_token_id)
            assert ended[0, -2:].tolist() == [tokenizer.pad_token_id] * 2, case["name"]
            by_hand = batch.input_ids.masked_fill(~real, -100)  # labels = input_ids: the padding is not scored
            loss = model(**batch, labels=batch.input_ids).loss
            assert torch.equal(loss, model(**batch, labels=by_hand).loss), case["name"]


def test_export_never_replaces_files_it_did_not_write(tmp_path, capsys, monkeypatch):
    tokenizer = train_tokenizer("char", TEXT, None)
    save_model(_model(["dot|softmax|none|fixed"], "gpt2", tokenizer.vocab_size), tmp_path / "model", tokenizer=tokenizer)
    mine = tmp_path / "mine"
    mine.mkdir()
    for fmt, theirs in (("hf", "config.json"), ("standalone", "attention.py"), ("hf-attention", "hf_attention.py")):
        (mine / "README.md").write_text("notes")
        (mine / theirs).write_text('{"lr": 3}')
        assert main(["export", "--model", str(tmp_path / "model"), "--format", fmt, "--out", str(mine)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"--out {mine} holds" in err and theirs in err, err
        assert (mine / theirs).read_text() == '{"lr": 3}' and (mine / "README.md").read_text() == "notes"
        assert sorted(p.name for p in mine.iterdir()) == sorted(["README.md", theirs])  # nothing written
        (mine / theirs).unlink()
        (mine / "README.md").unlink()
    monkeypatch.chdir(mine)  # --out .: the current directory, with the user's README.md
    (mine / "README.md").write_text("notes")
    assert main(["export", "--model", str(tmp_path / "model"), "--out", "."]) == 2
    assert "README.md" in capsys.readouterr().err and (mine / "README.md").read_text() == "notes"
    (mine / "README.md").unlink()
    for fmt in ("hf", "standalone"):  # an empty directory, then an earlier export of the format, are written
        for _ in range(2):
            assert main(["export", "--model", str(tmp_path / "model"), "--format", fmt, "--out", fmt]) == 0


def test_an_export_over_an_earlier_one_leaves_none_of_its_files_behind(tmp_path, capsys, monkeypatch):
    """... and says that it replaces it (it did so without a word)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text(TEXT)
    assert main(["baseline", "--data", "text", "--data-dir", str(corpus), "--tokenizer", "char", "--seq-len", "8",
                 "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--steps", "2", "--batch-size",
                 "4", "--eval-steps", "2", "--save-model", "--out", str(tmp_path / "b"), "--quiet"]) == 0
    out = tmp_path / "hf"
    assert main(["export", "--model", str(tmp_path / "b" / "model"), "--format", "hf", "--out", str(out)]) == 0
    assert (out / "lm_eval_task.yaml").is_file() and (out / "lm_eval_valid.jsonl").is_file()
    config = json.loads((out / "config.json").read_text())
    config["evo_attention"]["files"]["evo_attention_gone.py"] = "0" * 64  # a module an older export shipped
    config["evo_attention"]["files"].update({"mine": "0" * 64, "..": "0" * 64})  # never a folder: an edited config
    (out / "config.json").write_text(json.dumps(config))
    (out / "evo_attention_gone.py").write_text("")
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    shutil.rmtree(corpus)  # the training data is gone: no harness task this time
    monkeypatch.setattr("evo_attention.train.spec._TASK_DATA", {})  # nor the process's copy of it
    capsys.readouterr()
    with pytest.warns(UserWarning, match="holds a transformers export already: this one replaces it"):
        assert main(["export", "--model", str(tmp_path / "b" / "model"), "--format", "hf", "--out", str(out)]) == 0
    assert "no lm-evaluation-harness task" in capsys.readouterr().err
    left = {p.name for p in out.iterdir()}
    assert not left & {"lm_eval_task.yaml", "lm_eval_valid.jsonl", "evo_attention_gone.py"} and "notes.txt" in left
    listed = json.loads((out / "config.json").read_text())["evo_attention"]["files"]
    assert left == {*listed, "config.json", "notes.txt", "mine"}


@needs_transformers
def test_the_harness_task_is_written_only_for_the_data_the_saved_model_was_trained_on(tmp_path, capsys,
                                                                                     monkeypatch):
    """A model saved without data settings (save_pretrained's default) gets no task, even where the
    default data (WikiText-2) can be built; nor does one whose settings build data of another tokenizer."""
    from evo_attention.interop.pretrained import save_pretrained

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text(TEXT)
    monkeypatch.setenv("EVO_ATTENTION_DATA_DIR", str(corpus))  # the default data can be built here
    genes = ["dot|softmax|none|fixed|nobias|0.00"]
    settings = {"data": "text", "data_dir": str(corpus), "tokenizer": "char"}
    for name, extra, tokenizer, task in [("bare", None, "char", False), ("other", settings, "char:Q", False),
                                         ("same", settings, "char", True)]:
        char = train_tokenizer("char", TEXT + tokenizer[5:])
        model = _model(genes, "gpt2", char.vocab_size)
        save_pretrained(model, tmp_path / name, tokenizer=char,
                        settings={**model.spec.to_dict(), **extra} if extra else None)
        capsys.readouterr()
        out = tmp_path / f"hf-{name}"
        assert main(["export", "--model", str(tmp_path / name), "--format", "hf", "--out", str(out)]) == 0
        said = [line for line in capsys.readouterr().err.splitlines() if "lm-evaluation-harness task" in line]
        assert (out / "lm_eval_task.yaml").is_file() == task, (name, said)
        assert len(said) == 1 and ("no " in said[0]) != task, (name, said)
        if name == "bare":
            assert "records no data settings" in said[0] and "WikiText" not in said[0]
        if name == "other":
            assert "another tokenizer" in said[0]


def test_a_prompt_longer_than_the_window_generates_as_the_library_does(exported, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    from transformers import AutoModelForCausalLM

    root, cases, models = exported
    library = models[cases[2]["name"]][0]
    model = AutoModelForCausalLM.from_pretrained(cases[2]["dir"], trust_remote_code=True)
    prompt = torch.load(Path(cases[2]["dir"]) / "io.pt")["ids"].flatten()[:2 * WINDOW + 3].tolist()
    with torch.no_grad():
        got = model.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False)[0, len(prompt):].tolist()
        with pytest.raises(ValueError, match="generate with use_cache=True"):
            model.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False, use_cache=False)
    _same_greedy(library, prompt, got, generate(library, prompt, 3, temperature=0), cases[2]["name"])
    # every position of a cached forward past the window reads exactly its last WINDOW ids
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), use_cache=True).logits[0]
        sliding = torch.stack([library(torch.tensor([prompt[max(0, p - WINDOW + 1):p + 1]]))[0, -1]
                               for p in range(len(prompt))])
    assert torch.allclose(logits, sliding, atol=1e-5), (logits - sliding).abs().max()


def test_cli_export_format_hf_from_a_saved_model(tmp_path, capsys):
    tokenizer = train_tokenizer("word", TEXT, 40)
    model = _model(["dot|softmax|none|fixed|nobias|0.00|pos=rope"] * 2, "llama", tokenizer.vocab_size)
    save_model(model, tmp_path / "model", tokenizer=tokenizer)
    assert main(["export", "--model", str(tmp_path / "model"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "configuration_evo_attention.py", "modeling_evo_attention.py", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json", "README.md", "evo_attention_nn_model.py"} <= files
    assert not any(p.is_dir() for p in (tmp_path / "hf").iterdir())  # flat: transformers copies no folders
    card = (tmp_path / "hf" / "README.md").read_text()  # the card says what the code does: left padding generates
    assert "padded on the left" in card and "Padding on the right only" not in card
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "evo_attention" and config["block"] == "llama" and config["n_layers"] == 2
    assert config["genes"] == [g.key for g in model.genes]
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_evo_attention.EvoAttentionForCausalLM"
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "hf" / "model.safetensors")
    state = model.state_dict()
    assert set(weights) == {f"model.{k}" for k in state if k != "head.weight"}
    assert all(torch.equal(weights[f"model.{k}"], v) for k, v in state.items() if k != "head.weight")
    assert "AutoModelForCausalLM" in capsys.readouterr().err
    # the default format is still the standalone attention module
    assert main(["export", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "standalone")]) == 0
    assert (tmp_path / "standalone" / "attention.py").is_file()
    # a model saved without its tokenizer: one line, nothing written
    save_model(model, tmp_path / "bare")
    capsys.readouterr()
    assert main(["export", "--model", str(tmp_path / "bare"), "--format", "hf", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tokenizer.json" in err and not (tmp_path / "x").exists()


# -- lm-evaluation-harness ----------------------------------------------------------------------
TASK = """task: {name}
dataset_path: text
dataset_kwargs:
  data_files:
    test: {data}
  sample_by: line
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""

HARNESS = r'''
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
results = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": sys.argv[1], "trust_remote_code": True},
                                  tasks=["evo_words"], task_manager=TaskManager(include_path=sys.argv[2]),
                                  batch_size=2, device="cpu")
print("RESULT", json.dumps(results["results"]["evo_words"]))
'''


@pytest.mark.skipif(not HAS_TRANSFORMERS or importlib.util.find_spec("lm_eval") is None,
                    reason="lm-evaluation-harness (lm_eval) is not installed")
def test_lm_evaluation_harness_scores_the_export_as_the_library_does(exported, tmp_path):
    root, cases, models = exported
    case = cases[0]  # word level: <eos> is the harness's prefix token (the line before ended)
    lines = ["the cat sat on the mat .", "a dog ran to the hill , and the owl sat .", "the fox"]
    (tmp_path / "words.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "evo_words.yaml").write_text(TASK.format(name="evo_words", data=tmp_path / "words.txt"))
    done = subprocess.run([sys.executable, "-c", HARNESS, case["dir"], str(tmp_path / "tasks")], capture_output=True,
                          text=True, env={**_env(tmp_path), "HF_DATASETS_OFFLINE": "1",
                                          "HF_DATASETS_CACHE": str(tmp_path / "datasets")},
                          stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    scores = json.loads(done.stdout.split("RESULT ")[-1])
    # the same number from the library: each line (shorter than the window) after <eos>, every token scored
    model, tokenizer = models[case["name"]]
    eos = tokenizer.vocab.eos_id
    total = 0.0
    for line in lines:
        ids = encode_prompt(tokenizer, line)[0]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([[eos] + ids[:-1]])).double(), dim=-1)[0]
        total += float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum())
    words = sum(len(line.split()) for line in lines)
    assert math.isclose(scores["word_perplexity,none"], math.exp(-total / words), rel_tol=1e-5)
    nbytes = sum(len(line.encode()) for line in lines)
    assert math.isclose(scores["bits_per_byte,none"], -total / nbytes / math.log(2), rel_tol=1e-5)


# -- every dataset the tool trains on -----------------------------------------------------------
@pytest.mark.parametrize("data,options", [
    ("recall", {"num_pairs": 2, "train_examples": 8, "eval_examples": 4}),
    ("mqar", {"pairs": 2, "train_examples": 8, "eval_examples": 4}),
    ("mad:selective_copy", {"copy": 4, "train_examples": 8, "eval_examples": 4}),
    ("mad:compression", {"train_examples": 8, "eval_examples": 4}),
])
def test_generated_tasks_export_a_tokenizer_and_an_lm_eval_task(tmp_path, data, options):
    """A generated task's symbols (no <eos>) give a word-level tokenizer whose ids are the data's,
    its filler (id 0) the bos token, a token of its own the padding token, and the harness task scores
    every scored target."""
    from tokenizers import Tokenizer

    from evo_attention import Config
    from evo_attention.interop.hf import write_lm_eval_task
    from evo_attention.train.spec import load_task

    config = Config(data=data, vocab_size=16, max_seq_len=16, recall=options)
    task = load_task(config.task)
    text, special = hf_tokenizer(task.vocab)
    fast = Tokenizer.from_str(text)
    x, y = task.data["valid"]
    words = " ".join(task.vocab.decode(x[0].tolist()))
    pad = special.pop("pad_token")  # "<pad>", or "<<pad>>" where the task names its filler <pad>
    assert fast.encode(words).ids == x[0].tolist() and special == {"bos_token": task.vocab.itos[0],
                                                                   "split_special_tokens": True}
    assert pad not in task.vocab.stoi and fast.token_to_id(pad) == len(task.vocab)
    name, paths = write_lm_eval_task(task, task.vocab, "valid", tmp_path)
    docs = [json.loads(line) for line in Path(paths[0]).read_text().splitlines()]
    assert len(docs) == int((y != -100).sum()) and name.endswith("_valid")
    first = (y[0] != -100).nonzero()[0, 0]
    assert fast.encode(docs[0]["context"]).ids == x[0, :first + 1].tolist()
    assert fast.encode(docs[0]["target"]).ids == [int(y[0, first])]
    assert "output_type: loglikelihood" in Path(paths[1]).read_text()


@needs_transformers
def test_a_quick_preset_run_exports_loads_and_generates(tmp_path, monkeypatch):
    """The default preset (the recall task, whose vocabulary has no <eos>) exports with --format hf;
    the directory loads with AutoModelForCausalLM and generates a left-padded batch as each prompt
    alone, refuses a right-padded one in one sentence, and stops at the window without a cache."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
                 "--elite", "1", "--keep-models", "1", "--out", str(run), "--quiet"]) == 0
    assert main(["export", "--from-run", str(run), "--format", "hf", "--out", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert tokenizer.pad_token == "<pad>" and (out / "lm_eval_task.yaml").is_file()
    prompts = ["k1 v3 k2 v5 k1", "k0 v2 k3 v4 k5 v6 k0"]
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        both = model.generate(**batch, max_new_tokens=4, do_sample=False)
        for row, prompt in enumerate(prompts):
            alone = model.generate(**tokenizer([prompt], return_tensors="pt"), max_new_tokens=4, do_sample=False)
            assert both[row, -4:].tolist() == alone[0, -4:].tolist()
        tokenizer.padding_side = "right"
        with pytest.raises(ValueError, match="padded on the right.*padding_side = 'left'"):
            model.generate(**tokenizer(prompts, return_tensors="pt", padding=True), max_new_tokens=2)
        window = model.config.max_seq_len
        plain = model.generate(**tokenizer(prompts[:1], return_tensors="pt"), max_new_tokens=2 * window,
                               do_sample=False, use_cache=False)
        assert plain.shape[1] == window  # stopped at the window, no error
        cached = model.generate(**tokenizer(prompts[:1], return_tensors="pt"), max_new_tokens=2 * window,
                                do_sample=False)
        assert cached.shape[1] == len(prompts[0].split()) + 2 * window  # the cache slides the window
    assert "the" not in tokenizer.decode(plain[0])  # the task's symbols, decoded as words


HARNESS_TASK = r'''
import json, sys
import yaml
import lm_eval
from lm_eval.tasks import TaskManager
name = yaml.safe_load(open(sys.argv[1] + "/lm_eval_task.yaml"))["task"]
results = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": sys.argv[1], "trust_remote_code": True},
                                  tasks=[name], task_manager=TaskManager(include_path=sys.argv[1]),
                                  batch_size=4, device="cpu", limit=8)
print("RESULT", json.dumps(results["results"][name]))
'''


@pytest.mark.skipif(not HAS_TRANSFORMERS or importlib.util.find_spec("lm_eval") is None,
                    reason="lm-evaluation-harness (lm_eval) is not installed")
def test_lm_evaluation_harness_runs_the_task_the_export_writes(tmp_path):
    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["search", "--preset", "quick", "--steps", "2", "--population", "2", "--generations", "1",
                 "--elite", "1", "--keep-models", "1", "--out", str(run), "--quiet"]) == 0
    assert main(["export", "--from-run", str(run), "--format", "hf", "--out", str(out)]) == 0
    done = subprocess.run([sys.executable, "-c", HARNESS_TASK, str(out)], capture_output=True, text=True,
                          env={**_env(tmp_path), "HF_DATASETS_OFFLINE": "1",
                               "HF_DATASETS_CACHE": str(tmp_path / "datasets")},
                          stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    scores = json.loads(done.stdout.split("RESULT ")[-1])
    assert 0.0 <= scores["acc,none"] <= 1.0 and scores["perplexity,none"] > 1.0
