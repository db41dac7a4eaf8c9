"""Studies: experiments that train models through the runner and write their result files.

- ``validate``: re-train genes and the baseline with fresh seeds and compare (``validate_genes``)
- ``ablate``: remove each of a gene's differences from the baseline, and add each one alone
- ``maps``: attention weights per layer and head, drawn, with sparsity, entropy and distance
- ``compare``: named attention variants at one fixed size
- ``evolution``: ``Evolution``, a search that writes its report (the original project's API)

    from evo_attention.studies import validate_genes, write_validation
    result = validate_genes(["dot|sparsemax|output_gate|learned"], config, data, n_seeds=5)
    write_validation(result, "runs/validate")
"""

import importlib

# name -> the module that defines it; imported on first use, so ``import evo_attention`` stays light
_EXPORTS = {"ablate": "ablation", "ablation_variants": "ablation", "write_ablation": "ablation",
            "run_seeds": "common", "validation_seeds": "common", "resolve_configs": "compare",
            "run_compare": "compare", "attention_maps": "maps", "head_metrics": "maps",
            "validate_genes": "validate", "write_validation": "validate"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"evo_attention.studies.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'evo_attention.studies' has no attribute {name!r}")
