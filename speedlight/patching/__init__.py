"""Swap speedlight ops into Hugging Face models, and back: speedlight.patch(model),
speedlight.unpatch(model)."""

from speedlight.patching.causal_lm import causal_lm_loss
from speedlight.patching.patcher import PatchReport, PatchWarning, apply_kinds, unpatch

__all__ = ["PatchReport", "PatchWarning", "apply_kinds", "causal_lm_loss", "unpatch"]
