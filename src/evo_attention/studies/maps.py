"""Attention maps: what a trained model's heads attend to, drawn and measured.

``model.attention_maps(ids)`` gives per layer the ``[B, H, T, T]`` weights (eval mode; None for a layer
whose program forms none: it has no figure and no ``heads``). For one sequence this module measures per
head, over the causally allowed entries (key j <= query i):

- ``sparsity``: the fraction of those entries that are exactly 0 (sparsemax and entmax15 put exact
  zeros outside their support; softmax none);
- ``entropy``: the mean over query rows of ``-sum_j w_ij log w_ij`` in nats (0 log 0 = 0), beside
  ``uniform_entropy``, its upper bound, the same mean for uniform weights (``log(i + 1)``);
- ``mean_distance``: the mean over query rows of the expected ``|i - j|`` under the weights;
- ``row_sum_max_error``: ``max_i |sum_j w_ij - 1|`` (rows of relu_norm may sum to 0).

``attention_maps(model, ids, out_dir, tokenizer=...)`` writes one figure per layer
(``attention_layerN.png``, a grid of heads) and ``attention_maps.json``. Text and labels go through the
model's own tokenizer (a bare ``Vocab`` stands for its word tokenizer): ``encode_text`` reads a text as
``data.tokenizers.encode_prompt`` does, and each axis label is the token's own text; without a
tokenizer, labels are the token ids.
"""

from __future__ import annotations

import os
from itertools import islice
from typing import Mapping, Sequence

import torch

from evo_attention.data.tokenizers import as_tokenizer, encode_prompt
from evo_attention.report.attachments import MAPS_FILE
from evo_attention.util.errors import UserError
from evo_attention.util.files import output_dir
from evo_attention.util.jsonio import to_jsonable, write_json


def head_metrics(weights: torch.Tensor) -> list[dict]:
    """Per-head metrics of one sequence's weights ``[H, T, T]`` (see the module docstring)."""
    if weights.dim() != 3 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"expected weights [H, T, T], got {tuple(weights.shape)}")
    w = weights.detach().double().cpu()
    t = w.shape[-1]
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    i = torch.arange(t, dtype=torch.float64)
    distance = (i[:, None] - i[None, :]).abs()
    uniform = float(torch.log(i + 1).mean())
    out = []
    for h in range(w.shape[0]):
        wh = w[h]
        zeros = int(((wh == 0) & allowed).sum())
        plogp = torch.where(wh > 0, wh * torch.log(wh.clamp_min(1e-300)), torch.zeros_like(wh))
        out.append({
            "head": h,
            "sparsity": zeros / int(allowed.sum()),
            "entropy": float((-plogp.sum(-1)).mean()),
            "uniform_entropy": uniform,
            "mean_distance": float((wh * distance).sum(-1).mean()),
            "row_sum_max_error": float((wh.sum(-1) - 1.0).abs().max()),
            "future_weight": float(wh[~allowed].abs().sum()),  # 0 for every causal gene
        })
    return out


def encode_text(text: str, tokenizer, max_len: int) -> list[int]:
    """Token ids of ``text`` with the model's tokenizer (a ``Tokenizer`` or a ``Vocab``): unknown
    words or characters become ``<unk>``; at most ``max_len`` tokens (the model's context)."""
    tokenizer = as_tokenizer(tokenizer)
    if tokenizer is None:
        raise UserError("this model was saved without a tokenizer, so text cannot be tokenized: "
                        "leave out text to use a validation sample", setting="text")
    if not text:  # only spaces are tokens but at word level, where encode_prompt refuses them
        raise UserError("text is empty: give some text, e.g. \"the cat sat on the mat\"", setting="text")
    ids, _ = encode_prompt(tokenizer, text, setting="text")
    if len(ids) > max_len:
        raise UserError(f"text has {len(ids)} tokens, more than the model's context of {max_len}: shorten it",
                        setting="text")
    return ids


def validation_sample(data, length: int, index: int = 0) -> list[int]:
    """The first ``length`` input tokens of validation example ``index``."""
    if length < 2:
        raise UserError(f"length {length} is too short: give at least 2 tokens", setting="length")
    try:
        n = data.num_eval_items("valid")
    except NotImplementedError:  # a LoaderData: no count without iterating
        n = None
    if index < 0 or (n is not None and index >= n):
        raise UserError(f"sample {index} is out of range: the validation split has {n} examples", setting="sample")
    x = next(islice(data.eval_batches("valid", 1), index, None), (None, None))[0]  # the index-th batch of one
    if x is None:
        raise UserError(f"sample {index} is out of range for the validation split", setting="sample")
    return x[0, :length].tolist()


def compute_maps(model, ids: Sequence[int]) -> list[torch.Tensor]:
    """Per layer the ``[H, T, T]`` weights of ``ids`` (fp32, on the CPU), or None (no weights)."""
    device = next(model.parameters()).device
    x = torch.tensor([list(ids)], dtype=torch.long, device=device)
    return [None if m is None else m[0].float().cpu() for m in model.attention_maps(x)]


def attention_maps(model, ids: Sequence[int], out_dir: str | os.PathLike, *, tokenizer=None,
                   source: Mapping | None = None, text_source: str = "") -> dict:
    """Write the per-layer figures and ``attention_maps.json`` into ``out_dir``; returns the JSON.
    ``tokenizer`` (the model's ``Tokenizer`` or ``Vocab``, or None) names the tokens."""
    from evo_attention.report.figures import plot_head_grid

    out = output_dir(out_dir)
    tokenizer = as_tokenizer(tokenizer)  # each axis label: the token's own text, else its id
    tokens = [str(i) for i in ids] if tokenizer is None else tokenizer.token_texts(ids)
    maps = compute_maps(model, ids)
    layers = []
    for layer, (weights, gene) in enumerate(zip(maps, model.genes)):
        figure, metrics, mean = None, [], None
        if weights is not None:
            metrics = head_metrics(weights)
            figure = f"attention_layer{layer}.png"
            titles = [f"head {m['head']}: {100 * m['sparsity']:.0f}% zeros, H {m['entropy']:.2f}, "
                      f"dist {m['mean_distance']:.1f}" for m in metrics]
            plot_head_grid(weights.numpy(), out / figure, tokens=tokens, head_titles=titles,
                           title=f"Layer {layer}: {gene} ({len(tokens)} tokens; rows: queries, columns: keys)")
            mean = {k: sum(m[k] for m in metrics) / len(metrics) for k in ("sparsity", "entropy", "mean_distance")}
        layers.append({"layer": layer, "gene": gene.key, "str": str(gene), "figure": figure, "heads": metrics,
                       "mean": mean})
    result = to_jsonable({
        "kind": "attention_maps", "source": dict(source or {}), "text_source": text_source,
        "tokens": tokens, "token_ids": list(ids), "genes": [g.key for g in model.genes], "layers": layers,
    })
    write_json(out / MAPS_FILE, result)
    return result
