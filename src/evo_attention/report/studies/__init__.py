"""How a study's result reads: one module per study, each rendering the tables and markdown of the
results that study writes.

* ``common``: metric labels, the schedule in words, the cells of a paired comparison (shared);
* ``validation`` (with what each gene costs, and ``read_studies``: the study results of a run
  directory, validations read by the current rule), ``ablation`` (with the recipe-or-mechanism
  2x2), ``compare``, ``curves`` (difficulty curves), ``suite`` (genes on a suite of tasks),
  ``transfer`` (across scale), ``lr_grid`` (a study's learning-rate grid, for any of them), ``maps``
  (attention maps), ``fresh_check`` (a search's fresh-seed check).

The studies (``evo_attention.studies``) write their ``*.md`` files with these functions, and the
run report renders the same tables from the ``*.json`` files they left, so the two always agree.
Every module reads plain result mappings (as written to JSON); none imports a study.
"""

from evo_attention.report.studies.validation import current_validation, read_studies

__all__ = ["current_validation", "read_studies"]
