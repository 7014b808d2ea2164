"""Flash attention in Triton: forward (with a split key range for decode), its combine,
and the backward (delta, dk/dv per key block, dq per query block). Masked by selection
(common.py): nothing the mask hides reaches an output or a gradient; the fault kernels
redo, exactly, the few programs whose boundary blocks met a NaN or inf."""

from speedlight.kernels.attention.bwd import (_attention_bwd_delta_kernel,
                                              _attention_bwd_dkdv_kernel,
                                              _attention_bwd_dq_kernel,
                                              _attention_bwd_faults_kernel)
from speedlight.kernels.attention.fwd import (_attention_combine_kernel,
                                              _attention_fwd_faults_kernel, _attention_fwd_kernel)

__all__ = ["_attention_fwd_kernel", "_attention_combine_kernel", "_attention_fwd_faults_kernel",
           "_attention_bwd_delta_kernel", "_attention_bwd_dkdv_kernel", "_attention_bwd_dq_kernel",
           "_attention_bwd_faults_kernel"]
