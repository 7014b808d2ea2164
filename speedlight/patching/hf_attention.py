"""speedlight.attention as a Hugging Face attention implementation.

transformers 5.x picks each attention layer's function from `ALL_ATTENTION_FUNCTIONS` by
`config._attn_implementation`, and the mask builder from `ALL_MASK_ATTENTION_FUNCTIONS`
by the same name. speedlight registers both under "speedlight". The mask builder
(`padding_mask`, called once per forward and kind of mask, before any cache is updated)
never builds a [seq, seq] mask and reads nothing on the host: from the 2-D padding mask
and the sizes the cache gives (q_offset, kv_offset, kv_length) it returns
- None where nothing is padded and the keys end at the last query (no cache, a dynamic
  cache, a sliding-window cache once full): the attention runs aligned at the end;
- else a `KeySlots`: which slots of the key buffer each row's queries see, as variable-
  length sequences (a static cache's slots past its length are unwritten and left out;
  its length q_offset is a tensor, compared on the device).
The attention function
- runs causal (or bidirectional, by the layer's is_causal) attention with the layer's
  scaling, its sliding window (keys q - window < k <= q, as Hugging Face's sliding mask)
  and its softcap, GQA as it comes;
- runs a KeySlots as variable length over the key buffer as it is (no token is selected,
  so no shape depends on the mask's values): nothing padded, one sequence of the slots up
  to the last query; padded, per row the slots before its first token, its tokens up to
  its last query, and the slots after (padding, unwritten slots), three sequences, the
  queries of the first and last zeroed in the output. Where every row has the same
  sequences (nothing padded, or one row) the batch is folded into the heads and the keys
  are read in place, else the rows are packed one after another (a copy of q, k and v);
- runs a 2-D padding mask handed to it directly (not by the builder) the same way, its
  last columns taken as the queries;
- runs sequences packed in one row as variable length: from the cu_seq_lens_q/k and
  max_length_q/k a collator passes (TRL's padding_free, DataCollatorWithFlattening's
  return_flash_attn_kwargs), or from `position_ids` restarting at 0 (which are read on the
  host, once per forward, outside torch.compile; inside it, every position is taken as a
  possible sequence start);
- hands any other mask (a 4-D one a caller built) to the family's eager attention,
  recording the reason in the patch report;
- refuses dropout > 0 in training, naming the config field.
Nothing here reads a tensor's values on the host on those paths (but position_ids packing
outside torch.compile), so a training step, and a decode step over a static cache, can be
captured whole by torch.compile and CUDA graphs: the variable-length calls pass
check_seqlens=False (the cu_seqlens are built here, or a collator's, and the kernels stay
within the packed rows whatever their values).
"""

from __future__ import annotations

from typing import NamedTuple

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


class KeySlots(NamedTuple):
    """Which slots of the key buffer [batch, kv_heads, kv_length, dim] each row's queries
    see, as the sequences of a variable-length call, the kernels aligning each sequence's
    queries at its last key. Padded rows: per row, the slots before its first token, its
    tokens up to its last query, and the slots after it (padding, a static cache's
    unwritten slots), three sequences over the rows packed one after another, the queries
    of the first and last zeroed. Nothing padded: one sequence for every row alike, the
    slots up to the last query (cu_seqlens_k [0, q_start + q_length]); the slots after it
    are in no sequence and never read."""
    cu_seqlens_q: torch.Tensor  # int32 [3 * batch + 1], or [2] when nothing is padded
    cu_seqlens_k: torch.Tensor  # int32, as cu_seqlens_q
    queries: torch.Tensor | None  # bool [batch, q_length]: the queries that are tokens
    q_length: int
    kv_length: int

    # transformers' mask preparation converts a mask whose ndim is 2 and passes a 4-D one
    # on; this one it hands back to padding_mask as it is (generate makes the masks of a
    # step with a static cache before the step, and the model's forward calls the builder
    # again with them)
    ndim = 0


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0,
                 kv_offset: int = 0, mask_function=None, attention_mask=None, **kwargs):
    """The mask builder: None, or the KeySlots of the call (see the module docstring).
    q_offset is the position of the first query (an int, or a static cache's length as a
    0-d tensor), kv_offset the position of the first key slot; the 2-D attention_mask
    covers positions from 0 (its columns past kv_offset + kv_length are ignored, missing
    ones are padding, as in transformers' own builders). Unlike FlashAttention's builder it
    does not test whether anything is padded (a host read): an all-ones mask is described
    as it is."""
    if isinstance(attention_mask, KeySlots):  # made for this step by generate
        made = (attention_mask.q_length, attention_mask.kv_length)
        if made != (q_length, kv_length):
            raise ValueError(f"speedlight attention: attention_mask describes {made[0]} queries "
                             f"over {made[1]} key slots, and this call has {q_length} over "
                             f"{kv_length}: it was made for another step")
        return attention_mask
    if (attention_mask is not None and not torch.compiler.is_compiling()
            and not _has_values(attention_mask)):
        attention_mask = None  # fake tensors (projection): costed as unpadded rows
    padding = None
    if attention_mask is not None:
        columns = attention_mask[:, kv_offset:kv_offset + kv_length].bool()
        padding = torch.nn.functional.pad(columns, (0, kv_length - columns.shape[1]))
    device = next((t.device for t in (attention_mask, q_offset) if isinstance(t, torch.Tensor)),
                  kwargs.get("device"))
    return key_slots(padding, q_length, kv_length, q_offset - kv_offset, device)


def _has_values(t: torch.Tensor) -> bool:
    """False for a fake or meta tensor outside torch.compile (profile's projection):
    nothing to read, and the step is costed as unpadded rows."""
    from torch._subclasses.fake_tensor import is_fake
    return not is_fake(t) and t.device.type != "meta"


def key_slots(padding: torch.Tensor | None, q_length: int, kv_length: int, q_start,
              device=None) -> KeySlots | None:
    """padding: bool [batch, kv_length] (True: the slot holds a token of the row) or None
    (every slot does); q_start: the slot of the first query (an int, or a 0-d tensor read
    on the device), the queries taking the q_length slots from it and every later slot
    being unwritten or in the future -> the KeySlots, or None when nothing is padded and
    the keys end at the last query. No host read: a padding mask whose tokens (up to the
    last query) are not one run per row fails a device-side assertion."""
    if padding is None and not isinstance(q_start, torch.Tensor) \
            and q_start + q_length == kv_length:
        return None
    seen = torch.arange(kv_length, device=device) < q_start + q_length  # up to the last query
    if padding is None:  # every row alike: one sequence, its keys up to the last query
        end = seen.sum().reshape(1)
        return KeySlots(torch.tensor([0, q_length], dtype=torch.int32, device=device),
                        torch.cat([torch.zeros_like(end), end]).to(torch.int32), None,
                        q_length, kv_length)
    keep = padding & seen
    count = keep.sum(1)
    start = keep.int().argmax(1)  # the first token (0 for a row without any)
    end = start + count
    last = kv_length - keep.flip(1).int().argmax(1)  # one past the last token
    torch._assert_async(((end == last) | (count == 0)).all(),
                        "speedlight attention: a 2-D attention mask must be a padding mask "
                        "(each row's tokens one run of ones)")
    first = (start - q_start).clamp(0, q_length)  # the row's first and one past its last
    after = (end - q_start).clamp(0, q_length)  # query that is a token
    index = torch.arange(q_length, device=device)
    queries = (index >= first[:, None]) & (index < after[:, None])
    return KeySlots(_bounds(first, after, q_length), _bounds(start, end, kv_length), queries,
                    q_length, kv_length)


def _bounds(starts: torch.Tensor, ends: torch.Tensor, seq: int) -> torch.Tensor:
    """cu_seqlens int32 [3 * rows + 1] of rows of `seq` each cut at [starts, ends)."""
    rows = torch.arange(starts.shape[0], device=starts.device) * seq
    bounds = torch.stack([rows, rows + starts, rows + ends], 1).reshape(-1)
    return torch.cat([bounds, bounds.new_full((1,), starts.shape[0] * seq)]).to(torch.int32)


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


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


def _heads_major(t: torch.Tensor) -> torch.Tensor:
    """[batch, heads, seq, dim] -> [seq, batch * heads, dim], a view where t's batch stride
    is heads times its head stride (a cache's buffers, one row), else a copy."""
    b, h, s, d = t.shape
    return t.permute(2, 0, 1, 3).reshape(s, b * h, d)


def _packed(query, key, value, cu_q, cu_k, max_q, max_k, options):
    """One row [1, heads, seq, dim] of packed sequences -> [1, seq, heads, dim]."""
    o = attention(_heads_major(query), _heads_major(key), _heads_major(value),
                  cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                  check_seqlens=False, **options)
    return o.unsqueeze(0)


def _over_slots(query, key, value, slots: KeySlots, options) -> torch.Tensor:
    """query [batch, heads, seq_q, dim], key/value [batch, kv_heads, seq_k, dim] over the
    sequences `slots` describes -> [batch, seq_q, heads, dim], queries that are not tokens
    zeroed."""
    b, hq, sq, d = query.shape
    sk = key.shape[2]
    if (sq, sk) != (slots.q_length, slots.kv_length):
        raise ValueError(f"speedlight attention: the mask describes {slots.q_length} queries "
                         f"over {slots.kv_length} key slots, and the layer has {sq} queries "
                         f"and {sk} keys")
    seqs = dict(cu_seqlens_q=slots.cu_seqlens_q, cu_seqlens_k=slots.cu_seqlens_k,
                max_seqlen_q=sq, max_seqlen_k=sk, check_seqlens=False)
    if slots.queries is None or b == 1:  # one row's sequences for every row: batch x heads
        o = attention(_heads_major(query), _heads_major(key), _heads_major(value), **seqs,
                      **options).view(sq, b, hq, d).transpose(0, 1)
    else:  # a row's sequences each: the rows packed one after another
        q_tokens = query.transpose(1, 2).reshape(b * sq, hq, d)
        k_tokens = key.transpose(1, 2).reshape(b * sk, *key.shape[1::2])
        v_tokens = value.transpose(1, 2).reshape(b * sk, *value.shape[1::2])
        o = attention(q_tokens, k_tokens, v_tokens, **seqs, **options).view(b, sq, hq, d)
    if slots.queries is not None:
        o = o.masked_fill(~slots.queries[:, :, None, None], 0)
    return o


def _slots_of_mask(attention_mask: torch.Tensor, seq_q: int, seq_k: int) -> KeySlots:
    """The KeySlots of a 2-D padding mask handed to the attention function directly: its
    last seq_k columns are the first key slots, its last seq_q columns the queries."""
    keep = attention_mask[:, -seq_k:].bool()
    padding = torch.nn.functional.pad(keep, (0, seq_k - keep.shape[1]))
    return key_slots(padding, seq_q, seq_k, keep.shape[1] - seq_q, keep.device)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: KeySlots | torch.Tensor | None,
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
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() != 2:
        return _fallback(module, f"a {attention_mask.dim()}-D attention mask (only a 2-D "
                                 "padding mask is unpadded to variable length)",
                         query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         sliding_window=sliding_window, softcap=softcap, is_causal=is_causal,
                         position_ids=position_ids, **kwargs)
    if isinstance(attention_mask, torch.Tensor):  # not from the mask builder
        attention_mask = (_slots_of_mask(attention_mask, sq, sk)
                          if compiling or _has_values(attention_mask) else None)
    if attention_mask is not None:
        return _over_slots(query, key, value, attention_mask, options), None
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
