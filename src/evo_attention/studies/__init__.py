"""Studies: experiments that train models through the runner and write their result files.

- ``common``: what the seed-based studies share: ``StudySetup`` (settings resolved once, training
  through the runner and the run store, provenance) and ``StudyResult`` (typed, read as its dict)
- ``validate``: re-train genes and the baseline with fresh seeds and compare (``validate_genes``)
- ``ablate``: remove each of a gene's differences from the baseline, and add each one alone
- ``transfer``: retrain genes and the baseline at a ladder of model sizes (``transfer_genes``)
- ``maps``: attention weights per layer and head, drawn, with sparsity, entropy and distance
- ``compare``: named attention variants at one fixed size
- ``curves``: each gene's accuracy against a knob of a generated task (``run_curve``): where it breaks
- ``lr_grid``: each gene at its own best learning rate of a grid (``lr_grid=`` of every study above
  but maps), selected on tuning seeds of their own, measured on the study's seeds
- ``plan``: a registered family (``validate --plan``, ``curve --plan``) and its amendments
- ``study`` and ``study_run``: a registered study as one plan file (questions, stages, seed blocks,
  families, decision words), registered, run stage by stage, amended and reported (docs/studies.md);
  ``results``: what its computed stages compute from result files
- ``evolution``: ``Evolution``, a search that writes its report (the original project's API)

    from evo_attention.studies import validate_genes, write_validation
    result = validate_genes(["dot|sparsemax|output_gate|learned"], config, data, n_seeds=5)
    write_validation(result, "runs/validate")
"""

import importlib

# name -> the module that defines it; imported on first use, so ``import evo_attention`` stays light
_EXPORTS = {"ablate": "ablation", "ablation_variants": "ablation", "run_ablation": "ablation",
            "write_ablation": "ablation", "StudyResult": "common", "StudySetup": "common", "run_seeds": "common",
            "validation_seeds": "common", "resolve_configs": "compare", "run_compare": "compare", "run_curve": "curves",
            "attention_maps": "maps", "head_metrics": "maps", "run_transfer": "transfer",
            "transfer_genes": "transfer", "write_transfer": "transfer", "run_validation": "validate",
            "validate_genes": "validate", "write_validation": "validate"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"evo_attention.studies.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'evo_attention.studies' has no attribute {name!r}")
