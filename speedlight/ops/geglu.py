"""GeGLU: gelu(gate) * up, the activation of Gemma's MLPs (gelu with the tanh approximation,
Hugging Face's gelu_pytorch_tanh) and of exact-gelu gated MLPs.

The kernels and host code are the gated-unit family's (ops/glu.py); this module is the
public function and its OpSpec.
"""

from __future__ import annotations

import torch

from speedlight import reference
from speedlight.ops._checks import check_choice
from speedlight.ops.glu import gated_chains, glu, glu_spec

APPROXIMATIONS = {"tanh": "gelu_tanh", "none": "gelu"}  # torch's `approximate` -> kernel's


def geglu(gate: torch.Tensor, up: torch.Tensor | None = None,
          approximate: str = "tanh", *, gate_multiplier: float = 1.0,
          down_multiplier: float = 1.0) -> torch.Tensor:
    """gelu(gate) * up, in fp32 and rounded once; approximate="tanh" (Gemma's
    gelu_pytorch_tanh) or "none" (the exact erf form), as torch.nn.functional.gelu.

    gate, up: [..., I] of one dtype (float32/float16/bfloat16), any strides; or up=None and
    gate [..., 2 * I] holding gate then up on its last dim, read in place. Returns [..., I]
    in gate's dtype. Differentiable in gate and up; works under torch.compile(fullgraph=True).
    gate_multiplier, down_multiplier: gelu(gate_multiplier * gate) * up * down_multiplier,
    as swiglu's.
    """
    check_choice("approximate", approximate, APPROXIMATIONS)
    return glu(gate, up, APPROXIMATIONS[approximate], gate_multiplier, down_multiplier)


SPEC = glu_spec(
    "geglu", geglu, reference.geglu,
    activation_of=lambda case: APPROXIMATIONS[case.flag("approximate", "tanh")],
    extra_kwargs=lambda case: {"approximate": case.flag("approximate", "tanh")},
    flag_sets=[{"approximate": "none"}, {"approximate": "none", "concat": True},
               {"approximate": "none", "nonfinite": True}],
    notes="gelu(gate) * up (tanh or exact) on split or concatenated [.., 2I] inputs, "
          "followed by strides; act recomputed in the backward.",
    # the gated models in shapes.py use the tanh approximation (gelu_pytorch_tanh)
    model_flags=lambda cfg: {} if cfg.mlp == "geglu" else None,
    flags_of=lambda activation: {"gelu_tanh": {}, "gelu": {"approximate": "none"}}.get(activation),
    fuses="gelu(gate) * up",
    recognise=gated_chains("gelu"),
    peers={"liger": "liger_geglu"},
)
