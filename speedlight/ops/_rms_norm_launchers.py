"""The launchers rms_norm and add_rms_norm register (usable without autograd), made from
the two every RMSNorm implementation provides:

    residual_fwd(x, residual, weight, eps, offset, store_rstd=True) -> (y, h, rstd)
    bwd(dy, x, weight, rstd, offset, dh=None, out=None) -> (dx, dw)

The Triton kernels (ops/rms_norm.py) and the CUDA C++ ones (ops/rms_norm_cuda.py) each
build one RmsNormLaunchers, so the launchers of the two implementations are one code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RmsNormLaunchers:
    residual_fwd: Callable
    bwd: Callable

    def rms_norm_fwd(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                     offset: float) -> tuple[torch.Tensor, torch.Tensor]:
        """y (x's shape and dtype, contiguous) and rstd ([rows] fp32)."""
        y, _, rstd = self.residual_fwd(x, None, weight, eps, offset)
        return y, rstd

    def rms_norm_infer(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                       offset: float) -> torch.Tensor:
        """y alone: the forward when no gradient is wanted (rstd is not written)."""
        return self.residual_fwd(x, None, weight, eps, offset, store_rstd=False)[0]

    def rms_norm_inplace_bwd(self, dy: torch.Tensor, x: torch.Tensor,
                             weight: torch.Tensor | None, rstd: torch.Tensor,
                             offset: float) -> torch.Tensor | None:
        """dw (None without a weight); dx is written over dy (contiguous, x's dtype)."""
        return self.bwd(dy, x, weight, rstd, offset, out=dy)[1]

    def add_rms_norm_fwd(self, x: torch.Tensor, residual: torch.Tensor,
                         weight: torch.Tensor | None, eps: float, offset: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """y and h (x's shape and dtype, contiguous) and rstd ([rows] fp32)."""
        return self.residual_fwd(x, residual, weight, eps, offset)

    def add_rms_norm_infer(self, x: torch.Tensor, residual: torch.Tensor,
                           weight: torch.Tensor | None, eps: float, offset: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """y and h alone: the forward when no gradient is wanted (rstd is not written)."""
        y, h, _ = self.residual_fwd(x, residual, weight, eps, offset, store_rstd=False)
        return y, h

    def add_rms_norm_bwd(self, dy: torch.Tensor | None, dh: torch.Tensor | None,
                         h: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                         offset: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """dh_total (the gradient of x and of residual alike; h's shape and dtype) and dw.

        dy or dh may be None when that output took no gradient.
        """
        if dy is None:  # only h was used: the norm passes nothing back
            dy = torch.zeros_like(h)
        return self.bwd(dy, h, weight, rstd, offset, dh=dh)

    def add_rms_norm_inplace_bwd(self, dy: torch.Tensor, dh: torch.Tensor, h: torch.Tensor,
                                 weight: torch.Tensor | None, rstd: torch.Tensor,
                                 offset: float) -> torch.Tensor | None:
        """dw (None without a weight); dh_total, the gradient of x and residual, is written
        over dy. dh is only read: it is the residual stream's gradient, which the next block
        also handed to its own input."""
        return self.bwd(dy, h, weight, rstd, offset, dh=dh, out=dy)[1]
