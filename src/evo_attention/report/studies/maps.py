"""Attention maps (``studies.maps`` computes them): the report's section of one ``attention_maps.json``,
read from the result's dict alone."""

from __future__ import annotations

from typing import Mapping
from urllib.parse import quote  # a directory the user named may hold a space: the image stays an image

from evo_attention.report.studies.common import table_markdown
from evo_attention.util.format import finite_or_none, fmt, md_cell


def maps_table(result: Mapping) -> str:
    headers = ["Layer", "Gene", "Head", "Sparsity (exact zeros)", "Entropy (nats)", "Uniform entropy", "Mean distance"]
    rows = [[fmt(layer.get("layer")), layer.get("gene"), fmt(m.get("head")),
             f"{100 * m['sparsity']:.1f}%" if finite_or_none(m.get("sparsity")) is not None else "-",
             fmt(finite_or_none(m.get("entropy")), 3), fmt(finite_or_none(m.get("uniform_entropy")), 3),
             fmt(finite_or_none(m.get("mean_distance")), 2)]
            for layer in result.get("layers", []) for m in layer.get("heads", [])]
    rows += [[fmt(layer.get("layer")), layer.get("gene"), "-", "no weights (a program that forms none)", "-", "-", "-"]
             for layer in result.get("layers", []) if not layer.get("heads")]
    return table_markdown(headers, rows, "rlrrrrr", code_column=1)


def maps_caption(result: Mapping) -> str:
    source = result.get("source") or {}
    if source.get("model"):
        origin = f"the saved model in {source['model']}"
    else:
        origin = (f"{source.get('gene')} trained for {source.get('steps')} steps (seed {source.get('seed')}, "
                  f"{source.get('data')})")
        if finite_or_none(source.get("val_perplexity")) is not None:
            origin += f", validation perplexity {source['val_perplexity']:.3f}"
    return (f"Attention of {origin} over {result.get('text_source') or 'a sequence'} "
            f"({len(result.get('tokens') or [])} tokens). White cells are exact zeros.")


def maps_section(result: Mapping) -> list[str]:
    """The report's lines of the maps ``result`` (with ``"_dir"``: where its figures lie)."""
    prefix = "" if result["_dir"] == "." else result["_dir"].rstrip("/") + "/"
    figures = [f"![Attention maps of layer {layer.get('layer')}]({quote(prefix + str(layer.get('figure')))})"
               for layer in result.get("layers", []) if layer.get("figure")]
    return (["## Attention maps" + (f" ({result['_dir']})" if result["_dir"] not in (".", "maps") else ""), "",
             md_cell(maps_caption(result)), "", maps_table(result), ""] + figures)
