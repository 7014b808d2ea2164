"""RoPE inside a patched attention layer: the layer class's forward, recompiled with the
name `apply_rotary_pos_emb` bound to speedlight.rope (recompile.py).

The family's module-level function is never replaced: an unpatched model of the same
family keeps it, unpatch only restores the instance's forward, and the patched forward
decides nothing at call time (no context variable, no import), so torch.compile traces
it as it traces the original.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from speedlight.patching.recompile import recompile

NAME = "apply_rotary_pos_emb"

_MAKERS: dict = {}  # the class's forward function -> make(apply_rotary_pos_emb)


def _unsqueeze_position(original) -> int | None:
    """Where unsqueeze_dim sits among the positional parameters of the family's function
    (4 in transformers 5.x: q, k, cos, sin, unsqueeze_dim; 5 in 4.x, after position_ids),
    or None when it has none. A function wrapped as a hub-kernel module is read through its
    forward."""
    for candidate in (original, getattr(original, "forward", None)):
        if candidate is None:
            continue
        try:
            params = list(inspect.signature(candidate).parameters)
        except (TypeError, ValueError):
            continue
        if "unsqueeze_dim" in params:
            return params.index("unsqueeze_dim")
    return None


def speedlight_rope(original, interleaved: bool = False, half_table: bool = False, fn=None):
    """A function called as the family's apply_rotary_pos_emb(q, k, cos, sin, ...) that
    computes speedlight.rope. interleaved: GLM's form, pairs (2i, 2i + 1) rotated by the
    first half of cos/sin (cat(freqs, freqs) over the rotary dims) repeat-interleaved, as
    its function does. half_table: gpt-oss's cos/sin, one angle per pair (head_dim / 2),
    rotating halves: taken as cat(cos, cos), Llama's table of the same rotation. fn:
    another candidate's RoPE (candidates.adapt), called with rope's inputs by name."""
    from speedlight.ops.rope import rope
    rope = fn or rope

    at = _unsqueeze_position(original)
    extra_at = None if at is None else at - 4  # its index among the arguments after sin

    def apply_rotary_pos_emb(q, k, cos, sin, *rest, unsqueeze_dim: int = 1, **_):
        if extra_at is not None and len(rest) > extra_at:
            unsqueeze_dim = rest[extra_at]
        if half_table:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        if interleaved:
            half = cos.shape[-1] // 2
            cos = cos[..., :half].repeat_interleave(2, dim=-1)
            sin = sin[..., :half].repeat_interleave(2, dim=-1)
        return rope(q=q, k=k, cos=cos, sin=sin, unsqueeze_dim=unsqueeze_dim,
                    interleaved=interleaved)

    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def forward_with_rope(cls: type, family, function=None, label: str = "speedlight"):
    """The attention class's own forward with speedlight's RoPE, for binding to an instance
    (SourceError if its source cannot be recompiled). function(original) -> the function
    bound in its place (another candidate's), named `label` in the cache of forwards."""
    key = (inspect.unwrap(cls.forward), family.module, family.rope_interleaved,
           family.rope_half_table, label)
    if key not in _MAKERS:
        make, _ = recompile(cls.forward, (NAME,))
        original = getattr(importlib.import_module(family.module), NAME)
        _MAKERS[key] = make(function(original) if function is not None else speedlight_rope(
            original, family.rope_interleaved, family.rope_half_table))
    return _MAKERS[key]
