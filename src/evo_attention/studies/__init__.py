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

from evo_attention.studies.ablation import ablate, ablation_variants, write_ablation
from evo_attention.studies.common import run_seeds, validation_seeds
from evo_attention.studies.compare import resolve_configs, run_compare
from evo_attention.studies.maps import attention_maps, head_metrics
from evo_attention.studies.validate import validate_genes, write_validation

__all__ = ["ablate", "ablation_variants", "attention_maps", "head_metrics", "resolve_configs", "run_compare",
           "run_seeds", "validate_genes", "validation_seeds", "write_ablation", "write_validation"]
