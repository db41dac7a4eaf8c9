"""The study results of a run directory as the report reads them: ``load_attachments`` of the
directory, with every validation read by the current rule (``current_validation``: a result written
by an earlier version is recomputed from its per-seed values, its headline rewritten and marked so).
"""

from __future__ import annotations

from typing import Mapping

from evo_attention.report.attachments import load_attachments
from evo_attention.report.studies.validation import validation_headline
from evo_attention.util import stats


def read_studies(run_dir):
    """The study results in ``run_dir`` (``load_attachments``), each validation read by the current
    rule: one made by an earlier version is recomputed from its per-seed values and marked so."""
    found = load_attachments(run_dir)
    found.validations[:] = [current_validation(v) for v in found.validations]
    return found


def current_validation(result: Mapping) -> dict:
    """``result`` as the current rule reads it (``stats.recompute_validation``), headline included."""
    if result.get("analysis") == stats.ANALYSIS:
        return dict(result)
    upgraded = stats.recompute_validation(result)
    if upgraded.get("recomputed"):
        upgraded["headline"] = validation_headline(upgraded) + " (recomputed from the stored per-seed values)"
    return upgraded
