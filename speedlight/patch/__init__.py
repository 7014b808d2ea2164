"""Swap speedlight ops into Hugging Face models, and back."""

from speedlight.patch.patcher import PatchReport, PatchWarning, causal_lm_loss, patch, unpatch

__all__ = ["PatchReport", "PatchWarning", "causal_lm_loss", "patch", "unpatch"]
