"""Parameter-matched baselines: the vanilla model widened (or narrowed) in its feed-forward to the
parameter count of a candidate.

A gene with weights of its own (a gate, a learned temperature, a bias table) trains a larger model
than the vanilla baseline at the same ``ModelSpec``; part of its gain may be the size. The matched
baseline is the vanilla gene (or a named ``reference`` genome) at the same spec but for the
feed-forward width ``d_ff`` that brings its parameter count (``TinyTransformer.num_parameters``,
counted on the meta device) nearest to the candidate's, within ``MATCH_TOLERANCE`` (relative).
"""

from __future__ import annotations

from evo_attention.genes import AttentionGene
from evo_attention.nn.spec import ModelSpec
from evo_attention.util.errors import UserError

MATCH_TOLERANCE = 0.005  # the matched baseline's parameters lie within 0.5% of the candidate's
MAX_WIDTH_FACTOR = 64  # the search stops at 64 x d_model: a candidate beyond it is refused


def parameter_count(spec: ModelSpec, genome) -> int:
    """The trainable parameters of ``TinyTransformer(spec, genome)`` (``spec`` with its data's
    vocabulary), counted on the meta device."""
    import torch

    from evo_attention.nn.model import TinyTransformer

    with torch.device("meta"):
        return int(TinyTransformer(spec, genome).num_parameters())


def matched_width(spec: ModelSpec, target: int, *, tolerance: float = MATCH_TOLERANCE, reference=None) -> int:
    """The feed-forward width ``d_ff`` at which the vanilla model (or ``reference``) of ``spec`` has
    the parameter count nearest ``target`` (ties: the narrower width; found by bisection, as the count
    grows with the width); UserError (naming ``match_params``) when it is more than ``tolerance`` off."""
    model = AttentionGene.vanilla() if reference is None else reference

    def count(width: int) -> int:
        return parameter_count(spec.replace(d_ff=width), model)

    low, high = 1, max(2, MAX_WIDTH_FACTOR * spec.d_model)
    if count(high) < target:
        raise UserError(f"no feed-forward width up to {high} gives the baseline the candidate's {target:,} parameters: "
                        "drop match_params for this gene", setting="match_params")
    while high - low > 1:  # invariant: count(low) < target <= count(high), or low = 1 already at or above it
        middle = (low + high) // 2
        if count(middle) < target:
            low = middle
        else:
            high = middle
    width = min((low, high), key=lambda w: (abs(count(w) - target), w))
    off = abs(count(width) - target) / target
    if off > tolerance:
        raise UserError(f"the nearest baseline (feed-forward width {width}, {count(width):,} parameters) is "
                        f"{100 * off:.2f}% from the candidate's {target:,}, beyond the {100 * tolerance:g}% a matched "
                        "baseline must reach: drop match_params for this gene", setting="match_params")
    return width


def matched_baseline(spec: ModelSpec, genome, reference=None) -> dict:
    """The baseline (the vanilla gene, or ``reference``) matched to ``genome`` at ``spec`` (with its
    data's vocabulary): ``{"d_ff", "ffn_dim", "params", "candidate_params", "plain_params", "plain_d_ff",
    "off"}`` (``off``: the relative distance of the two counts). ``d_ff`` is ``spec.d_ff`` itself (None:
    the block's default) when the plain width is already the matched one."""
    model = AttentionGene.vanilla() if reference is None else reference
    target = parameter_count(spec, genome)
    plain = parameter_count(spec, model)
    width = matched_width(spec, target, reference=model)
    params = parameter_count(spec.replace(d_ff=width), model)
    same = width == spec.ffn_dim
    return {"d_ff": spec.d_ff if same else width, "ffn_dim": width, "params": params, "candidate_params": target,
            "plain_params": plain, "plain_d_ff": spec.ffn_dim, "off": (params - target) / target}
