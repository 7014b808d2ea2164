import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch._library.custom_ops import _maybe_get_opdef
from torch.utils._python_dispatch import TorchDispatchMode

import speedlight
import speedlight.nn as snn
from speedlight.ops import linear_cross_entropy as op
from speedlight.verify.harness import LaunchCounter
from tests.helpers import DTYPES, assert_verified, case_maker, seeded

SPEC = op.SPEC

case = case_maker("linear_cross_entropy", "tokens", "hidden", "vocab")


def inputs(tokens, hidden, vocab, device, bias=False, dtype=torch.float32, seed=0):
    h = seeded((tokens, hidden), dtype=dtype, device=device, seed=seed)
    w = seeded((vocab, hidden), dtype=dtype, device=device, seed=seed + 1, scale=0.3)
    b = seeded((vocab,), dtype=dtype, device=device, seed=seed + 2) if bias else None
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    return h, w, t, b


def grads(fn, h, w, t, b, upstream=None, **kwargs):
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in (h, w, b)]
    loss = fn(leaves[0], leaves[1], t, leaves[2], **kwargs)
    wrt = [x for x in leaves if x is not None]
    gs = torch.autograd.grad(loss, wrt, upstream if upstream is not None else torch.ones_like(loss))
    return loss.detach(), gs


def eager(h, w, t, b=None, **kwargs):
    return speedlight.cross_entropy(F.linear(h, w, b), t, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_vocabulary_past_one_register_block_matches_float64(dtype, device):
    """(The quick suite runs through the contract test; this is the looped kernel, in one
    chunk.)"""
    assert_verified(SPEC, case(3, 16, 20011, dtype, reduction="sum", chunk=3), device)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [pytest.param(None, id="one-chunk"),
                                   pytest.param(7, id="chunk7")])
def test_matches_linear_then_cross_entropy(reduction, chunk, device):
    h, w, t, b = inputs(30, 24, 200, device, bias=True)
    t[::4] = -100
    kwargs = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3, softcap=20.0)
    upstream = seeded((30,) if reduction == "none" else (), device=device, seed=9)
    loss, gs = grads(speedlight.linear_cross_entropy, h, w, t, b, upstream, chunk_size=chunk,
                     **kwargs)
    ref, gs_ref = grads(eager, h, w, t, b, upstream, **kwargs)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for g, g_ref in zip(gs, gs_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_the_loss_is_float32_at_bf16_inputs_within_float32s_rule(reduction, device):
    """The loss, z-loss and accuracy are float32 from bf16 inputs, and the loss and z-loss
    are the float64 loss of the bf16 logits (what F.linear computes) within float32's rule:
    k x the error of Hugging Face's computation (those logits upcast to fp32). A loss
    rounded to bf16 (12.25 for 12.2604) fails it."""
    from speedlight import reference
    from speedlight.spec import TOLERANCES
    from speedlight.verify.compare import judge

    h, w, t, _ = inputs(64, 32, 300, device, dtype=torch.bfloat16)
    t[::7] = -100
    kwargs = dict(reduction=reduction, z_loss=1e-3, return_z_loss=True,
                  return_token_accuracy=True)
    ours = speedlight.linear_cross_entropy(h, w, t, **kwargs)
    logits = F.linear(h, w)
    truth = reference.cross_entropy(logits.double(), t, **kwargs)
    hf = reference.linear_cross_entropy(h, w, t, **kwargs)
    assert [x.dtype for x in ours[:3]] == [torch.float32] * 3
    assert [x.dtype for x in hf[:3]] == [torch.float32] * 3
    fp32 = TOLERANCES[torch.float32]
    for name, got, want, yardstick in zip(("loss", "z_loss"), ours, truth, hf):
        check = judge(name, got, want, yardstick, fp32)
        assert check.passed, check.reason
    rounded = judge("loss", ours.loss.bfloat16().float(), truth[0], hf[0], fp32)
    assert not rounded.passed  # the test would catch a bf16 loss


def test_leading_dims_and_module(device):
    h, w, t, _ = inputs(12, 16, 50, device)
    h3, t3 = h.view(2, 6, 16), t.view(2, 6)
    loss_fn = snn.LinearCrossEntropyLoss(reduction="none", z_loss=1e-3, chunk_size=5)
    assert "chunk_size=5" in repr(loss_fn)
    loss = loss_fn(h3, w, t3)
    assert loss.shape == (2, 6)
    torch.testing.assert_close(loss, eager(h3, w, t3, reduction="none", z_loss=1e-3))


def test_all_ignored_mean_is_zero_with_zero_gradients(device):
    h, w, t, b = inputs(9, 16, 40, device, bias=True)
    t.fill_(-100)
    loss, gs = grads(speedlight.linear_cross_entropy, h, w, t, b, chunk_size=4)
    assert loss.item() == 0.0 and all(torch.equal(g, torch.zeros_like(g)) for g in gs)


class SeeThrough(TorchDispatchMode):
    """A dispatch mode that also sees the aten ops inside speedlight's custom ops (which
    are opaque to a mode): it runs their Python implementation under itself."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen(func, args)
        opdef = (_maybe_get_opdef(func) if func.namespace == "speedlight" else None)
        if opdef is not None:
            with self:
                out = opdef._init_fn(*args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        self.made(out, args)
        return out

    def seen(self, func, args):
        pass

    def made(self, out, args):
        pass


def test_only_what_autograd_needs_is_computed(device):
    h, w, t, _ = inputs(20, 16, 64, device)

    class Matmuls(SeeThrough):
        def __init__(self):
            super().__init__()
            self.count = 0

        def seen(self, func, args):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm,
                                       torch.ops.aten.matmul):
                self.count += 1

    def count(fn):
        with Matmuls() as m:
            fn()
        return m.count

    with torch.no_grad():  # evaluation: the logits matmul of each chunk, nothing else
        assert count(lambda: speedlight.linear_cross_entropy(h, w, t, chunk_size=5)) == 4
    frozen_head = lambda: speedlight.linear_cross_entropy(  # noqa: E731
        h.requires_grad_(), w, t, chunk_size=5)
    assert count(frozen_head) == 8  # logits, d_hidden; no d_weight for a frozen lm_head
    h.requires_grad_(False)


def test_a_second_backward_is_refused(device):
    h, w, t, _ = inputs(8, 16, 40, device)
    h.requires_grad_()
    loss = speedlight.linear_cross_entropy(h, w, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


# --- memory: the logits are never whole ----------------------------------------------------

class LiveBytes(SeeThrough):
    """Peak bytes of the storages created inside (inputs excluded), each followed from the
    op that made it to its release by a weak reference on the storage: the same tensor-
    lifetime accounting as speedlight.profile.memory, at the granularity of each aten op
    (inside speedlight's custom ops too)."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.ptrs = 0, 0, set()

    def __enter__(self):
        # what exists before is frozen out of the collector's scans, so each collection
        # below looks at the objects made inside alone (milliseconds, not a second)
        gc.collect()
        gc.freeze()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            gc.unfreeze()

    def seen(self, func, args):
        if func.overloadpacket in (torch.ops.aten.addmm, torch.ops.aten.matmul):
            # the Triton interpreter leaves the tensors of a launch in reference cycles
            # until the collector runs (a GPU launch holds none): collect before each
            # chunk's logits, so that only what the op itself keeps alive counts
            gc.collect()

    def made(self, out, args):
        ins = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if st.nbytes() and ptr not in self.ptrs and ptr not in ins:
                    self.ptrs.add(ptr)
                    self.live += st.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(st, self._free, ptr, st.nbytes())

    def _free(self, ptr, n):
        self.ptrs.discard(ptr)
        self.live -= n


def test_peak_memory_is_one_chunk_of_logits_plus_the_gradients(device):
    tokens, hidden, vocab, chunk = 100, 16, 4000, 32  # 4 chunks, the last of 4 tokens
    h, w, t, b = inputs(tokens, hidden, vocab, device, bias=True)
    chunk_logits = chunk * vocab * 4
    full_logits = tokens * vocab * 4
    gradients = (tokens * hidden + vocab * hidden + vocab) * 4

    def step(fn, **kwargs):
        hl, wl, bl = (x.clone().requires_grad_() for x in (h, w, b))
        with LiveBytes() as mem:
            loss = fn(hl, wl, t, bl, **kwargs)
            loss.backward()
            del loss
        return mem.peak

    ours = step(speedlight.linear_cross_entropy, chunk_size=chunk)
    # beyond: a chunk's column sums for d_bias ([vocab] fp32), the loss rows, the mean's
    # divisor and scale
    slack = vocab * 4 + 4096
    assert ours <= chunk_logits + gradients + slack, (ours, chunk_logits, gradients)
    assert ours < full_logits
    theirs = step(eager)
    assert theirs >= full_logits  # eager holds the whole [tokens, vocab] logits


# --- bad input -------------------------------------------------------------------------------

def _ok(d, **kw):
    h, w, t, _ = inputs(4, 8, 10, d)
    return dict(hidden=h, weight=w, target=t) | kw


@pytest.mark.parametrize("kwargs,error,match", [
    (lambda d: _ok(d, weight=torch.ones(10, 7, device=d)), ValueError,
     r"weight must have shape \(vocab, 8\).*got shape \(10, 7\)"),
    (lambda d: _ok(d, weight=torch.ones(10, 8, dtype=torch.float16, device=d)), TypeError,
     "weight must have hidden's dtype torch.float32"),
    (lambda d: _ok(d, bias=torch.ones(9, device=d)), ValueError, r"bias must have shape \(10,\)"),
    (lambda d: _ok(d, target=torch.zeros(4, 1, dtype=torch.long, device=d)), ValueError,
     r"target must have shape \(4,\)"),
    (lambda d: _ok(d, target=torch.zeros(4, device=d)), TypeError, "target must be an integer"),
    (lambda d: _ok(d, chunk_size=0), ValueError, "chunk_size must be None or a positive int"),
    (lambda d: _ok(d, memory_budget=-1), ValueError,
     "memory_budget must be None or a number of bytes >= 0, got -1"),
    (lambda d: _ok(d, memory_budget=1.5), ValueError, "memory_budget must be None"),
    (lambda d: _ok(d, reduction="avg"), ValueError, "reduction must be one of"),
    (lambda d: _ok(d, target=torch.tensor([0, 10, 1, 2], device=d)), ValueError,
     r"outside \[0, 10\)"),
])
def test_bad_input_is_named_and_launches_nothing(kwargs, error, match, device):
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        speedlight.linear_cross_entropy(**kwargs(device))
    assert counter.count == 0
