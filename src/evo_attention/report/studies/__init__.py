"""How a study's result reads: one module per study (``validation`` with ``read_studies``, ``ablation``,
``compare``, ``curves``, ``suite``, ``transfer``, ``lr_grid``, ``maps``, ``fresh_check``, ``fitness``), each
rendering the tables and markdown of the results that study writes, and ``common``, what they share.

The studies (``evo_attention.studies``) write their ``*.md`` files with these functions and the run report
renders the same tables from the ``*.json`` files they left, so the two always agree. Every module reads plain
result mappings (as written to JSON); none imports a study.
"""

from evo_attention.report.studies.validation import current_validation, read_studies

__all__ = ["current_validation", "read_studies"]
