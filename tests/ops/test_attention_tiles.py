"""Attention at the tiles a Hopper GPU runs (launches sized for an H100: 128-row query
blocks against 64- or 128-key blocks forward, 128-key blocks against 32 rows dk/dv, K/V
and q/do by tensor descriptors), under the interpreter, on small cases whose loops enter
every kind of block: boundary blocks at a left window edge, on the causal diagonal, at the
end of the keys (a partial block) and at the ends of packed sequences, and interior
blocks; once with a NaN in a boundary block, which the fault kernels redo. fp16 (the
interpreter's bf16 dot is wrong), head dim 16: few programs, cheap tiles."""

import pytest
import torch

import speedlight
from speedlight import reference
from speedlight.launch import for_target
from speedlight.ops import attention_launch
from tests.conftest import gpu_target
from tests.helpers import seeded


def _tiles(block_n):
    """The sm_90 sizing of attention_launch._blocks with the forward's key block set."""
    sized = attention_launch._blocks

    def blocks(direction, *args):
        out = sized(direction, *args)
        return {**out, "BLOCK_N": block_n} if direction == "fwd" else out

    return blocks


def _run(q, k, v, do, **options):
    """o, lse, dq, dk, dv of speedlight sized for an H100 and of the float64 reference."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    with for_target(gpu_target(132)):
        o, lse = speedlight.attention(q, k, v, return_lse=True, **options)
        o.backward(do)
    got = (o, lse, q.grad, k.grad, v.grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, lse64 = reference.attention(q64, k64, v64, return_lse=True, **options)
    o64.backward(do.double())
    return got, (o64, lse64, q64.grad, k64.grad, v64.grad)


def _check(got, want):
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{name}: NaN positions"
        finite = torch.isfinite(w)
        err = (g.double() - w)[finite].abs().max().item() if bool(finite.any()) else 0.0
        scale = w[finite].abs().max().item() if bool(finite.any()) else 1.0
        assert err <= 4e-3 * max(scale, 1.0), f"{name}: error {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("block_n", [64, 128], ids=["128x64", "128x128"])
def test_window_diagonal_tail_and_interior_blocks(block_n, device, monkeypatch):
    """392 queries and keys, causal with a 200-key window: the third query block (rows
    256-383) sees keys 56-383, so its loop runs left-edge boundary blocks, interior blocks
    and the diagonal; the fourth (rows 384-391) ends at a partial key block."""
    monkeypatch.setattr(attention_launch, "_blocks", _tiles(block_n))
    q, k, v, do = (seeded((1, 1, 392, 16), torch.float16, device, seed=i) for i in range(4))
    taken = []
    tma = attention_launch._tma
    monkeypatch.setattr(attention_launch, "_tma", lambda *a: taken.append(tma(*a)) or taken[-1])
    _check(*_run(q, k, v, do, causal=True, window=(200, 0)))
    assert taken == [True, True], "the sm_90 sizing reads the tiles by tensor descriptors"


def test_packed_sequence_ends(device):
    """Two packed sequences of 200 and 130 tokens, causal: the first one's last query block
    and key block end mid-tile, beside the next sequence's rows."""
    cu = torch.tensor([0, 200, 330], dtype=torch.int32, device=device)
    q, k, v, do = (seeded((330, 1, 16), torch.float16, device, seed=i) for i in range(4))
    _check(*_run(q, k, v, do, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu))


def test_nan_in_a_boundary_block_is_redone_exactly(device):
    """A NaN in v at key 200 (and in q at row 150) of 264, causal: the diagonal blocks that
    hold them count a fault, and the fault kernels redo those programs so only the rows and
    keys that see them are NaN."""
    q, k, v, do = (seeded((1, 1, 264, 16), torch.float16, device, seed=i) for i in range(4))
    v[0, 0, 200, 5] = float("nan")
    q[0, 0, 150, 3] = float("nan")
    got, want = _run(q, k, v, do, causal=True)
    _check(got, want)
    assert bool(torch.isfinite(got[0][0, 0, :150]).all())
