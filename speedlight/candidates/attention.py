"""Attention's candidates beyond speedlight's, the eager reference and torch.compile of it.

  sdpa-math       torch.nn.functional.scaled_dot_product_attention, math backend forced
                  (timed by bench only when named: it makes the [seq_q, seq_k] scores)
  sdpa-flash      the same, FlashAttention-2 backend
  sdpa-efficient  the same, memory-efficient backend
  sdpa-cudnn      the same, cuDNN backend
  flex-attention  torch's FlexAttention (compiled), the mask as a block mask, the softcap
                  as a score modifier
  flash-attn      flash_attn_interface (FlashAttention-3) or flash_attn (FlashAttention-2),
                  whichever is installed

Each adapter takes the attention OpSpec's inputs and returns a function of the same keyword
arguments returning the output in q's shape, or raises Unsupported with the reason: bench
runs every one on CUDA GPUs only, and SDPA has no window, softcap, variable length or
end-aligned causal mask for seq_q != seq_k. bench checks each forward against the reference
before timing it, so a mapping that computes something else is reported, not timed.

In a model (speedlight.patch, a plan's choice) the same candidates are Hugging Face's own
attention functions of those libraries, with their mask handling: SDPA's under
`forced_sdpa(name)` (the one place a name becomes a forced backend, for bench and patch
alike), flex_attention, flash_attention_2/3.
"""

from __future__ import annotations

from typing import Callable

import torch

from speedlight.candidates.names import Unsupported
from speedlight.spec import Case

SDPA_BACKENDS = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION"}
NAMES = (*SDPA_BACKENDS, "flex-attention", "flash-attn")


def _plain(inputs: dict, what: str) -> None:
    """Unsupported unless the case is dense attention SDPA-like APIs can express."""
    if inputs.get("return_lse"):
        raise Unsupported(f"{what} returns no log-sum-exp to compare")
    if inputs.get("cu_seqlens_q") is not None:
        raise Unsupported(f"{what} has no variable-length (cu_seqlens) input")


def forced_sdpa(name: str):
    """A context in which SDPA runs candidate `name`'s backend alone (sdpa-flash: the
    FlashAttention-2 backend); SDPA raises where that backend cannot run a call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name]))


def _sdpa(name: str, inputs: dict) -> Callable:
    what = f"SDPA's {name.split('-')[1]} backend"
    _plain(inputs, what)
    if inputs.get("window") is not None or inputs.get("softcap") is not None:
        raise Unsupported(f"{what} has no sliding window or softcap")
    q, k = inputs["q"], inputs["k"]
    if inputs.get("causal") and q.shape[2] != k.shape[2]:
        raise Unsupported(f"{what}'s causal mask is aligned at the top-left, speedlight's at the "
                          "end, when seq_q != seq_k")
    def run(q, k, v, causal=False, scale=None, **_):
        with forced_sdpa(name):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return run


def _flex(inputs: dict) -> Callable:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    _plain(inputs, "FlexAttention")
    q, k = inputs["q"], inputs["k"]
    sq, sk = q.shape[2], k.shape[2]
    shift = sk - sq
    left, right = inputs.get("window") or (-1, -1)
    if inputs.get("causal"):
        right = 0 if right < 0 else min(right, 0)

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + shift
        keep = kv_idx >= 0
        if left >= 0:
            keep = keep & (kv_idx >= pos - left)
        if right >= 0:
            keep = keep & (kv_idx <= pos + right)
        return keep

    block_mask = create_block_mask(mask_mod, None, None, sq, sk, device=q.device)
    cap = inputs.get("softcap")
    score_mod = None if cap is None else (lambda s, b, h, qi, ki: cap * torch.tanh(s / cap))
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v, scale=None, **_):
        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                        enable_gqa=k.shape[1] != q.shape[1])
    return run


def _flash_attn(inputs: dict) -> Callable:
    try:
        import flash_attn_interface as fa  # FlashAttention-3 (Hopper)
        version = 3
    except ImportError:
        try:
            import flash_attn as fa
            version = 2
        except ImportError:
            raise Unsupported("flash-attn is not installed (pip install flash-attn)") from None
    if inputs.get("return_lse"):
        raise Unsupported("the flash-attn mapping returns no log-sum-exp to compare")
    if inputs["q"].dtype == torch.float32:
        raise Unsupported("flash-attn computes fp16 and bf16 only")
    left, right = inputs.get("window") or (-1, -1)
    extra = {} if inputs.get("softcap") is None else {"softcap": inputs["softcap"]}

    def unwrap(out):  # FlashAttention-3 returns (out, lse) in some versions
        return out[0] if isinstance(out, tuple) else out

    if inputs.get("cu_seqlens_q") is not None:
        def run_varlen(q, k, v, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q=None, max_seqlen_k=None, **_):
            return unwrap(fa.flash_attn_varlen_func(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                softmax_scale=scale, causal=causal, window_size=(left, right), **extra))
        return run_varlen

    def run(q, k, v, causal=False, scale=None, **_):
        o = unwrap(fa.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                      softmax_scale=scale, causal=causal,
                                      window_size=(left, right), **extra))
        return o.transpose(1, 2)
    del version
    return run


def adapt(name: str, inputs: dict, case: Case, device: torch.device) -> Callable:
    """The baseline `name` for one attention case, or Unsupported with the reason."""
    if device.type != "cuda":
        raise Unsupported(f"{name} runs on CUDA GPUs; it is not run on the CPU interpreter")
    if name in SDPA_BACKENDS:
        return _sdpa(name, inputs)
    if name == "flex-attention":
        return _flex(inputs)
    if name == "flash-attn":
        return _flash_attn(inputs)
    raise ValueError(f"unknown attention baseline {name!r}")
