"""speedlight.attention as a Hugging Face attention implementation.

transformers 5.x picks each attention layer's function from `ALL_ATTENTION_FUNCTIONS` by
`config._attn_implementation`, and the mask builder from `ALL_MASK_ATTENTION_FUNCTIONS`
by the same name. speedlight registers both under "speedlight": the mask builder hands
the 2-D padding mask on as it is (sliced to the keys, never a [seq, seq] mask, and never
read on the host); the attention function
- runs causal (or bidirectional, by the layer's is_causal) attention with the layer's
  scaling, its sliding window (keys q - window < k <= q, as Hugging Face's sliding mask)
  and its softcap, GQA as it comes;
- runs a 2-D padding mask as variable length over the rows as they are (no token is
  selected, so no shape depends on the mask's values): each row's padding before and after
  its tokens become sequences of their own (cu_seqlens of fixed size 3 * batch + 1,
  computed on the device), whose outputs are zeroed;
- runs sequences packed in one row as variable length: from the cu_seq_lens_q/k and
  max_length_q/k a collator passes (TRL's padding_free, DataCollatorWithFlattening's
  return_flash_attn_kwargs), or from `position_ids` restarting at 0 (which are read on the
  host, once per forward, outside torch.compile; inside it, every position is taken as a
  possible sequence start);
- hands any other mask (a 4-D one a caller built) to the family's eager attention,
  recording the reason in the patch report;
- refuses dropout > 0 in training, naming the config field.
Nothing here reads a tensor's values on the host on those paths (but position_ids packing
outside torch.compile), so a training step can be captured whole by torch.compile and CUDA
graphs: the variable-length calls pass check_seqlens=False (the cu_seqlens are built here,
or a collator's, and the kernels stay within the packed rows whatever their values).
"""

from __future__ import annotations

import torch

from speedlight.ops.attention import attention

NAME = "speedlight"
REPORT_ATTR = "_speedlight_attention_report"


def register_attention() -> None:
    """Register "speedlight" with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, padding_mask)


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                 kv_offset: int = 0, mask_function=None, attention_mask=None, **kwargs):
    """The mask builder: the 2-D padding mask sliced to the last kv_length keys (as
    FlashAttention's builder does), or None; unlike that builder it does not test whether
    anything is padded (a host read), so an all-ones mask is passed on as it is."""
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]
    return attention_mask


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def _has_values(t: torch.Tensor) -> bool:
    """False for a fake or meta tensor outside torch.compile (profile's projection):
    nothing to read, and the step is costed as unpadded rows."""
    from torch._subclasses.fake_tensor import is_fake
    return not is_fake(t) and t.device.type != "meta"


def _padding_segments(keep: torch.Tensor, seq_q: int, seq_k: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """keep [batch, length] bool, one run of True per row (a padding mask over the first
    `length` of seq_k keys: a static cache's slots past it are unwritten) -> (cu_seqlens_q,
    cu_seqlens_k), int32 [3 * batch + 1]: per row the padding before its tokens, its
    tokens, and the padding after (with any unwritten slots), as three sequences, empty
    ones included; the seq_q queries are the mask's last positions. No host read: a mask
    whose tokens are not one run per row fails a device-side assertion."""
    b, length = keep.shape
    count = keep.sum(1)
    start = keep.int().argmax(1)  # the first True (0 for a row without any)
    end = start + count
    last = length - keep.flip(1).int().argmax(1)  # one past the last True
    torch._assert_async(((end == last) | (count == 0)).all(),
                        "speedlight attention: a 2-D attention mask must be a padding mask "
                        "(each row's tokens one run of ones)")
    offset = length - seq_q  # the mask position of the first query
    rows = torch.arange(b, device=keep.device)

    def cu(starts, ends, seq):
        bounds = torch.stack([rows * seq, rows * seq + starts, rows * seq + ends], 1).reshape(-1)
        return torch.cat([bounds, bounds.new_full((1,), b * seq)]).to(torch.int32)

    return (cu((start - offset).clamp(0, seq_q), (end - offset).clamp(0, seq_q), seq_q),
            cu(start, end, seq_k))


def _packed_lengths(position_ids: torch.Tensor | None, batch: int, seq: int) -> torch.Tensor | None:
    """Sequence lengths of one row packed with several sequences (positions restart at 0),
    or None when position_ids describe ordinary rows (or have no values to read: one
    sequence per row, as the projection assumes). Reads the starts on the host."""
    if (position_ids is None or batch != 1 or position_ids.shape[-1] != seq or seq < 2
            or not _has_values(position_ids)):
        return None
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos == 0).flatten()
    if len(starts) < 2 or int(starts[0]) != 0:
        return None
    ends = torch.cat([starts[1:], starts.new_tensor([seq])])
    return ends - starts


def _every_start(position_ids: torch.Tensor, seq: int) -> torch.Tensor:
    """cu_seqlens [seq + 1] of a row whose sequences start where position_ids are 0 (and
    at 0), without a host read: each position that starts no sequence gives an empty one."""
    pos = position_ids.reshape(-1)
    index = torch.arange(seq, device=pos.device)
    starts = torch.where((pos == 0) | (index == 0), index, seq)
    return torch.cat([starts.sort().values, starts.new_full((1,), seq)]).to(torch.int32)


def _fallback(module, reason: str, *args, **kwargs):
    """The family's eager attention, with the reason recorded once in the patch report."""
    report = getattr(module, REPORT_ATTR, None)
    if report is not None and (f"attention {type(module).__name__}", reason) not in report.not_patched:
        report.not_patched.append((f"attention {type(module).__name__}", reason))
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, *args, **kwargs)


def _packed(query, key, value, cu_q, cu_k, max_q, max_k, options):
    """One row [1, heads, seq, dim] of packed sequences -> [1, seq, heads, dim]."""
    o = attention(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                  cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                  check_seqlens=False, **options)
    return o.unsqueeze(0)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, position_ids: torch.Tensor | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query [batch, heads, seq_q, dim], key/value [batch, kv_heads, seq_k, dim] (as the
    layer hands them) -> ([batch, seq_q, heads, dim], None)."""
    if dropout and dropout > 0:
        raise ValueError(f"speedlight attention has no dropout: config.attention_dropout is "
                         f"{dropout} in training; set it to 0.0 or call speedlight.unpatch")
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    window = (sliding_window - 1, -1) if sliding_window else None
    options = dict(causal=causal, scale=scaling, window=window, softcap=softcap)
    b, hq, sq, d = query.shape
    sk = key.shape[2]
    compiling = torch.compiler.is_compiling()
    if attention_mask is not None and attention_mask.dim() != 2:
        return _fallback(module, f"a {attention_mask.dim()}-D attention mask (only a 2-D "
                                 "padding mask is unpadded to variable length)",
                         query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         sliding_window=sliding_window, softcap=softcap, is_causal=is_causal,
                         position_ids=position_ids, **kwargs)
    if attention_mask is not None and not compiling and not _has_values(attention_mask):
        attention_mask = None  # fake tensors (projection): costed as unpadded rows
    if attention_mask is not None:
        keep = attention_mask[:, -sk:].bool()
        cu_q, cu_k = _padding_segments(keep, sq, sk)
        q_tokens = query.transpose(1, 2).reshape(b * sq, hq, d)
        k_tokens = key.transpose(1, 2).reshape(b * sk, *key.shape[1::2])
        v_tokens = value.transpose(1, 2).reshape(b * sk, *value.shape[1::2])
        o = attention(q_tokens, k_tokens, v_tokens, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                      max_seqlen_q=sq, max_seqlen_k=sk, check_seqlens=False,
                      **options).view(b, sq, hq, d)
        return o.masked_fill(~keep[:, -sq:, None, None], 0), None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None and b == 1:
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        return _packed(query, key, value, cu_q.to(query.device, torch.int32),
                       cu_k.to(query.device, torch.int32),
                       max_q if isinstance(max_q, int) else sq,
                       max_k if isinstance(max_k, int) else sk, options), None
    if position_ids is not None and b == 1 and sq == sk and sq > 1:
        if compiling:
            cu = _every_start(position_ids, sq)
            return _packed(query, key, value, cu, cu, sq, sk, options), None
        lengths = _packed_lengths(position_ids, b, sq)
        if lengths is not None:
            cu = _cu_seqlens(lengths)
            longest = int(lengths.max())
            return _packed(query, key, value, cu, cu, longest, longest, options), None
    return attention(query, key, value, **options).transpose(1, 2), None
