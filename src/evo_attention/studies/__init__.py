"""Studies: experiments that train models through the runner and write their result files, a module
per study (docs/architecture.md names them: validate, ablate, transfer, maps, compare, curves, suite,
lr_grid, fitness, fresh_check, plan, study and study_run with results, evolution).

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
