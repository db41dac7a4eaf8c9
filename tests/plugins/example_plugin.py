"""A plugin as a user writes one: a new program op and a new generated task, nothing else.

``hgate`` is a learned per-head scalar gate on heads (z * sigmoid(a_h), a_h starting at 0), a
``PerModel`` op so that K models fold into one batch; ``shifted_copy`` asks for the token ``delay``
positions back, scored at every position that has one.
"""

import torch
from torch import nn

from evo_attention import register_op, register_task
from evo_attention.data import IGNORE_INDEX, Task
from evo_attention.data.synthetic import Knob
from evo_attention.nn.program import PerModel

__version__ = "0.1"


class HeadGate(PerModel):
    def __init__(self, n_heads: int):
        super().__init__()
        self.logit = nn.Parameter(torch.zeros(1, 1, n_heads, 1, 1))  # [M, 1, H, 1, 1]

    def forward(self, z):
        gate = torch.sigmoid(self.p("logit")).to(z.dtype)
        return (z.reshape(gate.shape[0], -1, *z.shape[1:]) * gate).reshape(z.shape)


register_op("hgate", "H->H", "learned", apply=lambda call, z: call.module(z),
            build=lambda shapes: HeadGate(shapes.n_heads))


@register_task("shifted_copy")
class ShiftedCopy(Task):
    capability = "copy the token a fixed number of positions back"
    knobs = (Knob("delay", "int", "how many positions back the answer lies"),)
    defaults = {"vocab": 8, "delay": 2}

    def symbols(self, k):
        return ["<pad>"] + [f"s{i}" for i in range(1, k["vocab"])]

    def answers_per_example(self, k):
        return k["seq_len"] - k["delay"]

    def chance(self, k):
        return 1 / (k["vocab"] - 1)

    def generate(self, n, k, generator, seed):
        full = torch.randint(1, k["vocab"], (n, k["seq_len"] + 1), generator=generator)
        x = full[:, :-1].contiguous()
        y = torch.full_like(x, IGNORE_INDEX)
        y[:, k["delay"]:] = x[:, :-k["delay"]]
        return x, y
