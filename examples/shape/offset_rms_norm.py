"""A norm variant: RMSNorm with a (1 + w) weight computed in fp32 and cast back
(Gemma-style), to shape before writing its kernel:

    speedlight shape examples/shape/offset_rms_norm.py:offset_rms_norm \\
        --shapes "x=[8,4096,4096]:bf16,w=[4096]:bf16"
"""

import torch


def offset_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (xf * rstd * (1.0 + w.float())).to(x.dtype)
