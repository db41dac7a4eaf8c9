"""Scientific validation of search results: is a discovered mechanism really better, why, and
what does it do?

- ``stats``: means with t intervals, Welch's test and interval, Holm's correction, Cohen's d, verdicts
- ``validate``: re-train genes and the baseline with fresh seeds (never the search seed) and compare
- ``ablation``: remove each of a gene's differences from the baseline, and add each one alone
- ``maps``: attention weights per layer and head, drawn, with sparsity, entropy and distance
- ``figures``: the matplotlib figures of the above

    from evo_attention.analysis import validate_genes, write_validation
    result = validate_genes(["dot|sparsemax|output_gate|learned"], config, data, n_seeds=5)
    write_validation(result, "runs/validate")
"""

from .ablation import ablate, ablation_variants, write_ablation
from .maps import attention_maps, head_metrics
from .stats import cohens_d, compare, describe, holm, verdict, welch
from .validate import run_seeds, validate_genes, validation_seeds, write_validation

__all__ = ["ablate", "ablation_variants", "attention_maps", "cohens_d", "compare", "describe", "head_metrics",
           "holm", "run_seeds", "validate_genes", "validation_seeds", "verdict", "welch", "write_ablation",
           "write_validation"]
