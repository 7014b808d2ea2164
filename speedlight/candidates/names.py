"""The candidates' names, one spelling each (a bench row's implementation, a plan's
choice), and the exception a candidate raises for a case it cannot compute."""

from __future__ import annotations

SPEEDLIGHT = "speedlight"
MODEL = "model"
EAGER = "torch-eager"
COMPILE = "torch-compile"
LIGER = "liger"
TORCH_FUSED = "torch-fused"
GROUPED_MM = "torch-grouped-mm"
SDPA = ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
FLEX = "flex-attention"
FLASH_ATTN = "flash-attn"


class Unsupported(Exception):
    """A candidate has no way to compute this case; the message says why."""
