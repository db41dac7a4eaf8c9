"""``evo-attention export``: a trained model as a standalone attention module or a transformers model.

    evo-attention export --model runs/best/model --out exported/
    evo-attention export --from-run runs/quick --rank 1 --out exported/   # a model the search kept
    evo-attention export --model runs/best/model --format hf --out hf-model/

``--format standalone`` (the default) writes ``attention.py`` (the entry to import),
``evo_attention_export/`` (the library's own modules it runs: torch, and ``entmax`` for the sparse
normalizations), ``attention.safetensors`` (every layer's trained attention weights) and ``README.md``
(how to drop it into a nanoGPT-style block). ``--format hf`` writes a Hugging Face transformers model
directory (``interop/hf.py``: config, modelling code wrapping the library's model, weights, tokenizer)
that ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` loads; see docs/export.md.
"""

from __future__ import annotations

from evo_attention.cli.common import given, load_with_plugins, note, with_given_plugins
from evo_attention.cli.validate import note_unfinished
from evo_attention.util.errors import UserError
from evo_attention.util.files import check_output
from evo_attention.util.progress import log


def cmd_export(args) -> int:
    from evo_attention.interop.export import export_attention, is_attention_export
    from evo_attention.interop.hf import is_hf_export
    from evo_attention.interop.hf_attention import is_hf_attention_export
    from evo_attention.search.models import kept_model, kept_models
    from evo_attention.train.saving import load_model, load_tokenizer, saved_info, saved_plugins

    if bool(args.model) == bool(args.from_run):
        raise UserError("give either --model DIR (a saved model) or --from-run DIR --rank R (a model the search kept "
                        "with --keep-models), one of them")
    if args.model and args.rank is not None:
        raise UserError("--rank picks among a run's kept models: use it with --from-run, not --model")
    if given("--lm-eval-split") and args.format != "hf":
        note(f"--lm-eval-split names the split of an hf export's lm-evaluation-harness task, not of --format "
             f"{args.format}: ignored")
    if args.format == "hf-attention" and args.from_run and not kept_models(args.from_run):
        return _hf_attention_from_run(args)  # an attention function needs the gene, not trained weights
    directory = args.model or kept_model(args.from_run, args.rank if args.rank is not None else 1)
    if args.from_run:
        note_unfinished(args.from_run, "export")
    kind, own = {"hf": ("a transformers export", is_hf_export),
                 "hf-attention": ("a transformers attention export", is_hf_attention_export)}.get(
        args.format, ("an attention export", is_attention_export))
    out = check_output(args.out, kind=kind, own=own,
                       sources={"model directory": directory, "run directory": args.from_run})  # before any loading
    if out.is_dir() and own(out):
        note(f"--out {out} holds {kind} already: this one replaces it")
    # the plugins the model was trained with (its genes may use their ops and components), and --plugin's
    load_with_plugins(saved_plugins(directory), args.plugin)
    model = load_model(directory)
    source = f"{directory}" + (f" (rank {args.rank or 1} of the run in {args.from_run})" if args.from_run else "")
    if args.format == "hf":
        from evo_attention.interop.hf import export_hf

        evaluation = saved_info(directory).get("evaluation")
        result = export_hf(model, load_tokenizer(directory), args.out, source=source,
                           extra={"evaluation": evaluation} if evaluation else None)
        log(f"exported {' / '.join(dict.fromkeys(result['genes']))} ({result['layers']} layer(s)) from {directory} as a "
            "transformers model")
        task = _lm_eval_task(directory, args.out, args.lm_eval_split, args.plugin)
        if task:
            log(f"lm-evaluation-harness task: lm_eval --model hf --model_args pretrained={args.out},"
                f"trust_remote_code=True --tasks {task} --include_path {args.out}")
        log(f"load it with AutoModelForCausalLM.from_pretrained({str(args.out)!r}, trust_remote_code=True)")
        return 0
    if args.format == "hf-attention":
        from evo_attention.interop.hf_attention import ENTRY_FILE, export_hf_attention

        result = export_hf_attention(model, args.out, source=source)
        log(f"exported {' / '.join(dict.fromkeys(result['genes']))} from {directory} as the transformers attention "
            f"function {result['name']!r}")
        log(f"use it: import {ENTRY_FILE[:-3]} (from {args.out}); LlamaConfig(..., attn_implementation="
            f"{ENTRY_FILE[:-3]}.register()); {ENTRY_FILE[:-3]}.install(model)")
        return 0
    result = export_attention(model, args.out, source=source)
    log(f"exported {result['gene']} ({result['layers']} layer(s)) from {directory}")
    log("wrote " + ", ".join(result["files"]))
    return 0


def _hf_attention_from_run(args) -> int:
    """``--format hf-attention`` of the ``--rank``-th gene of a run that kept no model: the run's
    ranking names the gene, its config the model's settings (no weights are needed)."""
    from pathlib import Path

    from evo_attention.genes import AttentionGene, layers_of
    from evo_attention.interop.hf_attention import ENTRY_FILE, export_hf_attention, is_hf_attention_export
    from evo_attention.report import load_run
    from evo_attention.train.config import Config

    if not Path(args.from_run).is_dir():
        raise UserError(f"no run directory {args.from_run}: give the --out directory of a search")
    run = load_run(args.from_run)
    rank = 1 if args.rank is None else args.rank
    ranked = [row["gene"] for row in (run.suite["genes"] if run.suite is not None else run.ranking) if row.get("rank")]
    if isinstance(rank, bool) or rank < 1 or rank > len(ranked):
        raise UserError(f"--rank {rank} is beyond the {len(ranked)} ranked gene(s) of the run in {args.from_run}")
    note_unfinished(args.from_run, "export")
    config = Config.from_dict({k: v for k, v in run.config.items() if k in Config.field_names()})
    check_output(args.out, kind="a transformers attention export", own=is_hf_attention_export,
                 sources={"run directory": args.from_run})
    load_with_plugins(config.plugins, args.plugin)
    genes = layers_of(AttentionGene.parse(ranked[rank - 1]))
    result = export_hf_attention(None, args.out, genes=genes, spec=config.model,
                                 source=f"rank {rank} of the run in {args.from_run} (its gene; no weights needed)")
    log(f"exported {' / '.join(dict.fromkeys(result['genes']))} (rank {rank} of the run in {args.from_run}) as the "
        f"transformers attention function {result['name']!r}")
    log(f"use it: import {ENTRY_FILE[:-3]} (from {args.out}); LlamaConfig(..., attn_implementation="
        f"{ENTRY_FILE[:-3]}.register()); {ENTRY_FILE[:-3]}.install(model)")
    return 0


def _lm_eval_task(directory, out, split: str, plugins) -> str | None:
    """Write the harness task for ``split`` of the data the saved model was trained on (its saved
    settings build the data again, a --plugin file in ``plugins`` standing in for a saved one);
    returns the task's name, or None (said in one line) when the saved settings name no data, the
    data cannot be built here, or their tokenizer is not the model's."""
    import os
    from unittest.mock import patch

    from evo_attention.data.tokenizers import as_tokenizer
    from evo_attention.interop.hf import write_lm_eval_task
    from evo_attention.train.config import Config
    from evo_attention.train.saving import load_tokenizer, saved_info, saved_plugins
    from evo_attention.train.spec import load_task

    saved = saved_info(directory).get("config") or {}
    if "data" not in saved:  # Config.from_dict would fill in the default data, which the model may never have seen
        log(f"no lm-evaluation-harness task: {directory}/config.json records no data settings (save_pretrained "
            "without settings naming the data): for a task, save the model with them, as baseline --save-model and "
            "search --keep-models do")
        return None
    settings = {**saved, "plugins": with_given_plugins(saved_plugins(directory), plugins)}
    # the task is an extra of the export: it is built from data already here, never downloaded (offline,
    # a download attempt would wait about 20 s for the network before failing)
    try:
        with patch.dict(os.environ, {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}):
            config = Config.from_dict({k: v for k, v in settings.items() if k in Config.field_names()})
            data = load_task(config.task)
    except UserError as exc:
        log(f"no lm-evaluation-harness task: the training data cannot be built here ({exc})")
        return None
    tokenizer = load_tokenizer(directory)
    rebuilt = as_tokenizer(getattr(data, "tokenizer", None) or getattr(data, "vocab", None))
    if rebuilt is None or rebuilt.to_json() != as_tokenizer(tokenizer).to_json():
        log(f"no lm-evaluation-harness task: the {data.name} data that the saved settings build here have another "
            "tokenizer than the model's tokenizer.json, so they are not the data it was trained on: for a task, "
            "give the directory of those data (data_dir, or EVO_ATTENTION_DATA_DIR for wikitext2)")
        return None
    return write_lm_eval_task(data, tokenizer, split, out)[0]


def register(sub) -> None:
    p = sub.add_parser("export", help="write a trained gene's attention as a standalone PyTorch module "
                       "(attention.py + the library's modules it runs + safetensors weights + README), or the "
                       "whole model as a Hugging Face transformers model directory (--format hf)")
    p.add_argument("--model", metavar="DIR", help="a saved model directory (baseline --save-model, search --keep-models)")
    p.add_argument("--from-run", metavar="DIR", help="a search run that kept its models (search --keep-models K)")
    p.add_argument("--rank", type=int, help="with --from-run: which kept model, 1 = the best (default 1)")
    p.add_argument("--format", choices=("standalone", "hf", "hf-attention"), default="standalone",
                   help="standalone (default): the attention module with the library's modules it runs; hf: the "
                   "whole model and its tokenizer as a transformers model directory (trust_remote_code); "
                   "hf-attention: the gene as a transformers attention function (AttentionInterface) for "
                   "Llama-family and GPT-2 models (attn_implementation=...)")
    p.add_argument("--plugin", action="append", metavar="MODULE",
                   help="import this module or .py file first (repeatable): the plugins a saved model's config "
                   "names are imported anyway; an export ships the module of each plugin whose ops or components "
                   "the genes use")
    p.add_argument("--lm-eval-split", choices=("valid", "test"), default="valid",
                   help="with --format hf: the split of the training data that the lm-evaluation-harness task "
                   "it writes (lm_eval_task.yaml) scores (default valid)")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="directory for the export (standalone: attention.py, evo_attention_export/, "
                   "attention.safetensors, README.md; hf: config.json, the model code, model.safetensors, "
                   "tokenizer.json, ...)")
    p.set_defaults(func=cmd_export)
