"""Cache geometries, model-free: the fuzz suite's cases for attention over caches.

A cache layer of each kind transformers ships (none, dynamic, static, and their
sliding-window forms before, while and after the window fills and the static buffer
rolls) takes its past and then a step of queries, padded (left, right, a row of padding
only) or not, with a mask of every position or one running past the buffer; the mask
builder and the attention function get what transformers gives them. Outcome classes:
every query that is a token matches float64 attention over the keys transformers' own SDPA
mask lets it see (taken by selection, speedlight.reference.attention), while every slot
no query may see (unwritten, padding, outside the window) holds NaN; or an error naming
the mask: a padding mask that is not one run of tokens per row (a device-side assertion),
a description made for another step or for other shapes (ValueError).
"""

import pytest
import torch

pytest.importorskip("transformers")

from speedlight import reference  # noqa: E402
from speedlight.patching.hf_attention import attention_forward, padding_mask  # noqa: E402
from speedlight.spec import TOLERANCES  # noqa: E402
from speedlight.verify.compare import judge  # noqa: E402
from speedlight.verify.harness import LaunchCounter  # noqa: E402

TOL = TOLERANCES[torch.float32]

HEADS, KV_HEADS, DIM, WINDOW, MAX_LEN = 2, 1, 16, 4, 12


def _layer(kind: str):
    from transformers import cache_utils as cu
    return {"dynamic": lambda: cu.DynamicLayer(),
            "static": lambda: cu.StaticLayer(max_cache_len=MAX_LEN),
            "dynamic-sliding": lambda: cu.DynamicSlidingWindowLayer(sliding_window=WINDOW),
            "static-sliding": lambda: cu.StaticSlidingWindowLayer(max_cache_len=MAX_LEN,
                                                                 sliding_window=WINDOW),
            }[kind]()


class _Layer(torch.nn.Module):
    is_causal = True


def _padding(batch: int, past: int, q_length: int, padding: str) -> torch.Tensor | None:
    """The 2-D mask over the positions so far: None; "ones" (nothing padded, said so);
    the last row left-padded by 2, right-padded by 2 (a prefill), padding only, or with a
    hole (not a padding mask); "long": ones running 3 positions past the last query (a
    mask made for the whole cache)."""
    if padding == "none":
        return None
    mask = torch.ones(batch, past + q_length + (3 if padding == "long" else 0),
                      dtype=torch.long)
    if padding == "left":
        mask[-1, :2] = 0
    elif padding == "right":
        mask[-1, -2:] = 0
    elif padding == "hole":
        mask[-1, 1] = 0
    elif padding == "empty-row":
        mask[-1] = 0
    return mask


def _visible_by_sdpa(kind, batch, q_length, kv_length, q_offset, kv_offset, mask):
    """transformers' own SDPA mask of the call: bool [batch, q_length, kv_length]."""
    from transformers import masking_utils as mu
    function = (mu.sliding_window_causal_mask_function(WINDOW) if "sliding" in kind
                else mu.causal_mask_function)
    four = mu.sdpa_mask(batch_size=batch, q_length=q_length, kv_length=kv_length,
                        q_offset=q_offset, kv_offset=kv_offset, mask_function=function,
                        attention_mask=None if mask is None else mask.bool(),
                        allow_is_causal_skip=False, device=torch.device("cpu"))
    return four.expand(batch, 1, q_length, kv_length)[:, 0]


def _by_selection(q, k, v, visible, scale):
    """o [batch, q_length, heads, dim]: each query row over the keys it sees, selected
    (speedlight.reference.attention, no mask); zeros for a row that sees none."""
    o = q.new_zeros(q.shape[0], q.shape[2], q.shape[1], q.shape[3])
    for b in range(q.shape[0]):
        for r in range(q.shape[2]):
            keys = visible[b, r].nonzero().flatten()
            if len(keys):
                o[b, r] = reference.attention(q[b:b + 1, :, r:r + 1], k[b:b + 1, :, keys],
                                              v[b:b + 1, :, keys], scale=scale)[0, :, 0]
    return o


GEOMETRIES = [  # (cache kind, past tokens, queries, padding, batch)
    ("none", 0, 6, "none", 2), ("none", 0, 6, "left", 2), ("none", 0, 6, "right", 2),
    ("none", 0, 6, "empty-row", 2),
    ("dynamic", 4, 1, "none", 2), ("dynamic", 4, 1, "left", 1), ("dynamic", 4, 3, "left", 2),
    ("dynamic", 4, 1, "long", 1),
    # prefill, decode and a chunk over a buffer of 12 slots
    ("static", 0, 5, "none", 2), ("static", 0, 5, "left", 1), ("static", 0, 5, "right", 2),
    ("static", 0, 5, "right", 1), ("static", 5, 1, "none", 2), ("static", 5, 1, "left", 2),
    ("static", 5, 1, "long", 2), ("static", 5, 3, "ones", 2), ("static", 5, 3, "left", 2),
    # window 4: within it, filling it, past it (the dynamic layer keeps 3 keys)
    ("dynamic-sliding", 0, 6, "left", 2), ("dynamic-sliding", 6, 1, "left", 2),
    ("dynamic-sliding", 6, 2, "none", 1),
    # a buffer of 4 slots: unwritten ones, filling in the step, full (rolled), several
    # tokens over a full buffer
    ("static-sliding", 2, 1, "none", 1), ("static-sliding", 2, 1, "left", 2),
    ("static-sliding", 3, 2, "none", 2), ("static-sliding", 6, 1, "left", 2),
    ("static-sliding", 6, 1, "long", 2), ("static-sliding", 5, 3, "none", 1),
]


def _cache_step(kind, past, q_length, padding, batch, seed=0):
    """A cache layer of `kind` fed `past` tokens, then the sizes transformers hands the mask
    builder for q_length more (taken before the update, as a model's forward does), the
    keys and values the update returns, and which of their slots no query may see."""
    from transformers.cache_utils import Cache
    g = torch.Generator().manual_seed(seed)

    def states(n):
        return (torch.randn(batch, KV_HEADS, n, DIM, generator=g),
                torch.randn(batch, KV_HEADS, n, DIM, generator=g))

    cache = Cache(layers=[_layer(kind)]) if kind != "none" else None
    if cache is not None and past:
        cache.update(*states(past), 0)
    if cache is None:
        q_offset, (kv_length, kv_offset) = 0, (q_length, 0)
    else:
        q_offset, (kv_length, kv_offset) = (cache.get_query_offset(0),
                                            cache.get_mask_sizes(q_length, 0))
    mask = _padding(batch, past, q_length, padding)
    sizes = dict(batch_size=batch, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                 kv_offset=kv_offset)
    ours = padding_mask(**sizes, attention_mask=None if mask is None else mask.bool())
    visible = _visible_by_sdpa(kind, batch, q_length, kv_length, q_offset, kv_offset, mask)
    k, v = states(q_length) if cache is None else cache.update(*states(q_length), 0)
    q = torch.randn(batch, HEADS, q_length, DIM, generator=g)
    tokens = torch.ones(batch, q_length, dtype=torch.bool) if mask is None \
        else mask[:, past:past + q_length].bool()  # the queries that are tokens
    return q, k, v, ours, visible, tokens


@pytest.mark.parametrize("kind,past,q_length,padding,batch", [
    pytest.param(*g, id="-".join(map(str, g))) for g in GEOMETRIES])
def test_every_query_sees_the_keys_transformers_mask_shows_it(kind, past, q_length, padding,
                                                              batch):
    q, k, v, slots, visible, tokens = _cache_step(kind, past, q_length, padding, batch)
    assert k.shape[2] == visible.shape[2]  # the mask's key length is the buffer's
    hidden = ~visible.any(1)  # key slots no query sees: unwritten, padding, out of window
    poisoned = [t.clone().masked_fill(hidden[:, None, :, None], float("nan")) for t in (k, v)]
    scale = DIM ** -0.5
    window = WINDOW if "sliding" in kind else None
    counter = LaunchCounter()
    with counter.active():
        o, _ = attention_forward(_Layer(), q, *poisoned, slots, scaling=scale,
                                 sliding_window=window)
    assert any("_attention_" in name for name in counter.kernels)
    # compared at the queries that are tokens (a padded query's output is not defined)
    ref64 = _by_selection(*(t.double() for t in (q, k, v)), visible, scale)
    theirs = _by_selection(q, k, v, visible, scale)
    check = judge("o", o[tokens], ref64[tokens], theirs[tokens], TOL)
    assert check.passed, check.to_json()


def test_a_mask_that_is_not_one_run_per_row_is_refused():
    with pytest.raises(RuntimeError, match="padding mask"):
        _cache_step("static", 5, 1, "hole", 2)


def test_a_description_made_for_another_step_is_refused():
    q, k, v, slots, _, _ = _cache_step("static", 5, 1, "left", 2)
    with pytest.raises(ValueError, match="attention_mask .*another step"):
        padding_mask(batch_size=2, q_length=2, kv_length=MAX_LEN, attention_mask=slots)
    with pytest.raises(ValueError, match="3 queries and 12 keys"):
        attention_forward(_Layer(), torch.cat([q] * 3, 2), k, v, slots)
