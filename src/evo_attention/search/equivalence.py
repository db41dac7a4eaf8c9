"""Functional-equivalence caching: programs that compute the same function train once.

Two programs can differ in text and compute the same function (``mul(v,2)`` and ``add(v,v)``, or
a reordering that canonical form does not catch). As in AutoML-Zero, a program's *fingerprint* is
its output on a fixed probe: one attention layer (d_model 16, 2 heads, 8 positions, float64) with
weights drawn from a generator seeded by each op's own text (so a shared subexpression gets the
same weights in both programs), on a fixed input, rounded to ``DIGITS`` significant digits and
hashed. A trial whose genome has programs has a *functional key*: its trial key with each program
replaced by its fingerprint. The runner answers a trial from a stored record with the same
functional key (the record is copied under the trial's own key and says ``equivalent_to``), and
counts those answers.

The probe is longer than the program's reach into the past (``reach``: the positions its chains of
shifts and convolutions look back, each of the probe's first 8 positions kept beyond it), so no
program fingerprints as the zero function by shifting its input out of the probe. Rounding makes the
fingerprint blind to float noise; two different functions that agree on the probe to ``DIGITS``
digits would be merged (none is known; a test compares every merged pair of small programs). The
probe runs in evaluation mode (no dropout), so attention dropout, a gene field outside the program,
stays in the key.
"""

from __future__ import annotations

import functools
import hashlib
import zlib

import torch

from evo_attention.genes import AttentionGene, LayerGenes, canonical_program, layers_of
from evo_attention.nn.attention import EvolvedAttention
from evo_attention.programs import OPS

DIGITS = 6
PROBE = dict(d_model=16, n_heads=2, length=8, batch=2)


@functools.lru_cache(maxsize=4096)
def fingerprint(program: str) -> str:
    """The fingerprint of a program (its text): 16 hex digits."""
    parsed = canonical_program(program)
    y = probe_output(parsed.text, PROBE["length"] + reach(parsed.root))
    text = " ".join(f"{v:.{DIGITS}g}" for v in y.flatten().tolist())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def probe_output(program: str, length: int) -> torch.Tensor:
    """The program's output [batch, length, d_model] in the probe layer (float64, eval mode), its
    weights drawn by what they belong to, on a fixed input of ``length`` positions."""
    d, heads, b = PROBE["d_model"], PROBE["n_heads"], PROBE["batch"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        attn = EvolvedAttention(d, heads, AttentionGene(program=program, attention_dropout=0.0),
                                max_seq_len=length).double().eval()
        x = torch.randn(b, length, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        with torch.no_grad():
            for name, p in attn.named_parameters():
                p.copy_(torch.randn(p.shape, generator=_generator(attn, name), dtype=torch.float64) * 0.5
                        + (1.0 if name.endswith("weight") and p.dim() == 1 else 0.0))
            return attn(x)


# how far back one application of an op along time shifts what a position sees (its own position:
# 0); ops that read every earlier position (cumsum, decay, mixing) keep the nearest ones in reach
SHIFTS = {"shift": 1, "dconv2": 1, "dconv3": 2, "dconv4": 3}
READS_ALL = ("cumsum", "cummean", "decay", "sdecay")
UNKNOWN_SHIFT = 8  # an op along time a plugin registered: assumed to look this far back


def reach(root) -> int:
    """The most positions a program's chains of shifts and convolutions look back."""
    memo: dict = {}
    for node in root.walk():  # children before parents
        below = max((memo[a.text] for a in node.args), default=0)
        kind = OPS[node.op].kind if node.op in OPS else None
        step = SHIFTS.get(node.op, UNKNOWN_SHIFT if kind == "time" and node.op not in READS_ALL else 0)
        memo[node.text] = below + step
    return memo[root.text]


def _generator(attn: EvolvedAttention, name: str) -> torch.Generator:
    """A generator for parameter ``name``, seeded by what it belongs to: a program op's text (the
    same subexpression gets the same weights in any program), or its own name for the projections."""
    owner = name
    if name.startswith("program.ops."):
        index = int(name.split(".")[2][1:])
        owner = attn.program.nodes[index].text + name.split(".", 3)[3]
    return torch.Generator().manual_seed(zlib.crc32(owner.encode()))


def functional_genome(genome: "AttentionGene | LayerGenes | str") -> str | None:
    """The genome's key with each program replaced by ``fp:<fingerprint>``; None without a program."""
    genome = AttentionGene.parse(genome)
    layers = layers_of(genome)
    if all(g.program is None for g in layers):
        return None
    return " / ".join(gene.key if gene.program is None
                      else gene.key.replace(f"prog={gene.program}", f"prog=fp:{fingerprint(gene.program)}")
                      for gene in layers)


def functional_key(gene: str, seed: int, steps: int, data: str, context: str) -> tuple | None:
    """The functional key of a trial key's parts; None when its genome has no program."""
    genome = functional_genome(gene)
    return None if genome is None else (genome, int(seed), int(steps), str(data), str(context))
