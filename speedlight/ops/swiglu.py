"""SwiGLU: silu(gate) * up, the activation of Llama, Mistral, Qwen and Phi-3 MLPs.

The kernels and host code are the gated-unit family's (ops/glu.py); this module is the
public function and its OpSpec.
"""

from __future__ import annotations

import torch

from speedlight import reference
from speedlight.ops.glu import gated_chains, glu, glu_spec


def swiglu(gate: torch.Tensor, up: torch.Tensor | None = None, *,
           gate_multiplier: float = 1.0, down_multiplier: float = 1.0) -> torch.Tensor:
    """silu(gate) * up, in fp32 and rounded once.

    gate, up: [..., I] of one dtype (float32/float16/bfloat16), any strides; or up=None and
    gate [..., 2 * I] holding gate then up on its last dim (a fused gate_up projection, as
    `gate, up = gate_up.chunk(2, -1)`), read in place. Returns [..., I] in gate's dtype.
    Differentiable in gate and up; works under torch.compile(fullgraph=True).

    gate_multiplier, down_multiplier: Falcon-H1's mlp_multipliers, folded in:
    silu(gate_multiplier * gate) * up * down_multiplier. down_multiplier scales what the
    down projection reads, which equals scaling its output when it has no bias.
    """
    return glu(gate, up, "silu", gate_multiplier, down_multiplier)


SPEC = glu_spec(
    "swiglu", swiglu, reference.swiglu,
    activation_of=lambda case: "silu",
    extra_kwargs=lambda case: {},
    flag_sets=[],
    notes="silu(gate) * up on split or concatenated [.., 2I] inputs, followed by strides; "
          "act recomputed in the backward.",
    model_flags=lambda cfg: {} if cfg.mlp == "swiglu" else None,
    flags_of=lambda activation: {} if activation == "silu" else None,
    fuses="silu(gate) * up",
    recognise=gated_chains("silu"),
    peers={"liger": "liger_swiglu"},
)
