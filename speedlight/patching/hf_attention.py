"""speedlight.attention as a Hugging Face attention implementation.

transformers 5.x picks each attention layer's function from `ALL_ATTENTION_FUNCTIONS` by
`config._attn_implementation`, and the mask builder from `ALL_MASK_ATTENTION_FUNCTIONS`
by the same name. speedlight registers both under "speedlight": the mask builder is the
one FlashAttention uses (a 2-D padding mask, or None when nothing is padded), so a
[seq, seq] mask is never built; the attention function
- runs causal (or bidirectional, by the layer's is_causal) attention with the layer's
  scaling, its sliding window (keys q - window < k <= q, as Hugging Face's sliding mask)
  and its softcap, GQA as it comes;
- unpads a 2-D padding mask into packed variable-length sequences (and pads the output
  back with zeros), and runs sequences packed in one row by `position_ids` (positions
  restarting at 0) as variable length;
- hands any other mask (a 4-D one a caller built) to the family's eager attention,
  recording the reason in the patch report;
- refuses dropout > 0 in training, naming the config field.
"""

from __future__ import annotations

import torch

NAME = "speedlight"
REPORT_ATTR = "_speedlight_attention_report"


def register() -> None:
    """Register "speedlight" with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def _has_values(t: torch.Tensor) -> bool:
    """False for a fake or meta tensor (profile's projection): nothing to read."""
    from torch._subclasses.fake_tensor import is_fake
    return not is_fake(t) and t.device.type != "meta"


def _packed_lengths(position_ids: torch.Tensor | None, batch: int, seq: int) -> torch.Tensor | None:
    """Sequence lengths of one row packed with several sequences (positions restart at 0),
    or None when position_ids describe ordinary rows (or have no values to read: one
    sequence per row, as the projection assumes)."""
    if (position_ids is None or batch != 1 or position_ids.shape[-1] != seq or seq < 2
            or not _has_values(position_ids)):
        return None
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(position_ids):  # a projected step (fake tensors): values unknown, plain rows
        return None
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).flatten()
    if len(starts) < 2 or int(starts[0]) != 0:
        return None
    ends = torch.cat([starts[1:], starts.new_tensor([seq])])
    return ends - starts


def _fallback(module, reason: str, *args, **kwargs):
    """The family's eager attention, with the reason recorded once in the patch report."""
    report = getattr(module, REPORT_ATTR, None)
    if report is not None and (f"attention {type(module).__name__}", reason) not in report.not_patched:
        report.not_patched.append((f"attention {type(module).__name__}", reason))
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, *args, **kwargs)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, position_ids: torch.Tensor | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query [batch, heads, seq_q, dim], key/value [batch, kv_heads, seq_k, dim] (as the
    layer hands them) -> ([batch, seq_q, heads, dim], None)."""
    from speedlight.ops.attention import attention

    if dropout and dropout > 0:
        raise ValueError(f"speedlight attention has no dropout: config.attention_dropout is "
                         f"{dropout} in training; set it to 0.0 or call speedlight.unpatch")
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    window = (sliding_window - 1, -1) if sliding_window else None
    options = dict(causal=causal, scale=scaling, window=window, softcap=softcap)
    b, hq, sq, d = query.shape
    sk = key.shape[2]
    if attention_mask is not None and attention_mask.dim() != 2:
        return _fallback(module, f"a {attention_mask.dim()}-D attention mask (only a 2-D "
                                 "padding mask is unpadded to variable length)",
                         query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         sliding_window=sliding_window, softcap=softcap, is_causal=is_causal,
                         position_ids=position_ids, **kwargs)
    if attention_mask is not None and not _has_values(attention_mask):
        attention_mask = None  # fake tensors (projection): costed as unpadded rows
    if attention_mask is not None:
        keep_k = attention_mask[:, -sk:].bool()
        keep_q = keep_k[:, -sq:]
        q_tokens = query.transpose(1, 2)[keep_q]  # [total_q, heads, dim]
        k_tokens = key.transpose(1, 2)[keep_k]
        v_tokens = value.transpose(1, 2)[keep_k]
        len_q, len_k = keep_q.sum(1), keep_k.sum(1)
        o = attention(q_tokens, k_tokens, v_tokens, cu_seqlens_q=_cu_seqlens(len_q),
                      cu_seqlens_k=_cu_seqlens(len_k), max_seqlen_q=int(len_q.max()),
                      max_seqlen_k=int(len_k.max()), **options)
        out = query.new_zeros(b, sq, hq, d)
        out[keep_q] = o
        return out, None
    lengths = _packed_lengths(position_ids, b, sq) if sq == sk else None
    if lengths is not None:
        cu = _cu_seqlens(lengths)
        longest = int(lengths.max())
        o = attention(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                      cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                      max_seqlen_k=longest, **options)
        return o.unsqueeze(0), None
    return attention(query, key, value, **options).transpose(1, 2), None
