"""A gated activation with a new nonlinearity: Mish written out, gating the up projection,
both halves taken from one [tokens, 2 x intermediate] tensor:

    speedlight shape examples/shape/mish_glu.py:mish_glu --shapes "x=[4096,28672]:bf16" --train
"""

import torch
import torch.nn.functional as F


def mish_glu(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return gate * torch.tanh(F.softplus(gate)) * up
