"""What each rank runs for test_dtensor.py: speedlight's last-dim ops on DTensors of a
2-rank CPU mesh, sharded along leading dims (uneven shards: 3 rows over 2 ranks) with
replicated weights, against the same op on the whole tensors; the placements it refuses;
and linear_cross_entropy's refusal of an lm_head weight that is not whole."""

from __future__ import annotations

import copy

import torch

from tests.distributed.ranks import check

TOL = dict(rtol=1e-5, atol=1e-6)  # fp32: the row kernels see the same rows; weight
# gradients are summed in another order (per rank, then across ranks)


def _mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _outputs(out):
    return [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]


def _compare(fn, tensors: dict, placements: dict, grads: tuple, **kwargs) -> dict:
    """fn(**tensors, **kwargs) with the tensors named in `placements` as DTensors of those
    placements (the rest plain) against fn on the whole tensors: outputs and the gradients
    of `grads`. Returns each output's placements."""
    from torch.distributed.tensor import distribute_tensor
    mesh = _mesh()
    plain = {n: t.clone().requires_grad_(n in grads) for n, t in tensors.items()}
    dist_in = {n: (distribute_tensor(t.clone(), mesh, placements[n]) if n in placements
                   else t.clone()).requires_grad_(n in grads) for n, t in tensors.items()}
    want = _outputs(fn(**plain, **kwargs))
    got = _outputs(fn(**dist_in, **kwargs))
    assert len(got) == len(want)
    gen = torch.Generator().manual_seed(7)
    upstream = [torch.randn(w.shape, generator=gen) for w in want]
    sum(((w.float() * g).sum() for w, g in zip(want, upstream) if w.is_floating_point()
         and w.requires_grad)).backward()
    sum(((_full(o).float() * g).sum() for o, g in zip(got, upstream) if o.is_floating_point()
         and o.requires_grad)).backward()
    for i, (o, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(_full(o), w, **TOL, msg=lambda m: f"output {i}: {m}")
    for n in grads:
        torch.testing.assert_close(_full(dist_in[n].grad), plain[n].grad, **TOL,
                                   msg=lambda m: f"grad of {n}: {m}")
    return {"placements": [str(tuple(getattr(o, "placements", ()))) for o in got]}


def _refused(fn, tensors: dict, placements: dict, **kwargs) -> dict:
    """The message of the ValueError fn raises on these DTensors (it must raise one)."""
    from torch.distributed.tensor import distribute_tensor
    mesh = _mesh()
    args = {n: distribute_tensor(t, mesh, placements[n]) if n in placements else t
            for n, t in tensors.items()}
    try:
        fn(**args, **kwargs)
    except ValueError as e:
        return {"message": str(e)}
    raise AssertionError(f"{fn.__name__} accepted {placements}")


def _sequence_parallel_norm(x, w) -> dict:
    """speedlight.nn.RMSNorm under torch's SequenceParallel (its weight a Replicate
    DTensor parameter, its input sharded along the sequence): the output and the gradients
    of x and the weight are the unsharded module's."""
    import speedlight.nn
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module
    whole = speedlight.nn.RMSNorm(48)
    with torch.no_grad():
        whole.weight.copy_(w)
    parallel = parallelize_module(copy.deepcopy(whole), _mesh(),
                                  SequenceParallel(use_local_output=False))
    import torch.distributed as dist
    x = x[:, :4]  # SequenceParallel takes each rank's input as an even share of the sequence
    x0 = x.clone().requires_grad_()
    x1 = x.chunk(dist.get_world_size(), 1)[dist.get_rank()].clone().requires_grad_()
    y0, y1 = whole(x0), parallel(x1)
    torch.testing.assert_close(y1.full_tensor(), y0, **TOL)
    g = torch.randn(y0.shape, generator=torch.Generator().manual_seed(3))
    (y0 * g).sum().backward()
    (y1.full_tensor() * g).sum().backward()
    mine = x0.grad.chunk(dist.get_world_size(), 1)[dist.get_rank()]
    torch.testing.assert_close(x1.grad, mine, **TOL)
    torch.testing.assert_close(_full(parallel.weight.grad), whole.weight.grad, **TOL)
    return {"placements": [str(tuple(y1.placements))]}


def _cases():
    import speedlight
    from speedlight.ops.linear_cross_entropy import linear_cross_entropy
    from torch.distributed.tensor import Partial, Replicate, Shard
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    x, w, b = r(3, 5, 48), r(48), r(48)
    logits, target = r(7, 33), torch.randint(0, 33, (7,), generator=g)
    target[2] = -100
    hidden, head = r(7, 16), r(33, 16)
    q, k = r(2, 4, 6, 16), r(2, 2, 6, 16)
    angles = torch.arange(6.0)[:, None] * torch.rand(8, generator=g)[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1)[None], torch.cat([angles.sin()] * 2, -1)[None]
    S0, S1, R = [Shard(0)], [Shard(1)], [Replicate()]
    compare = {
        "rms_norm-shard0": lambda: _compare(
            speedlight.rms_norm, dict(x=x, weight=w), dict(x=S0, weight=R), ("x", "weight")),
        "rms_norm-in-place-shard1": lambda: _compare(
            lambda x, weight: speedlight.rms_norm(x, weight, in_place=True) * 1.0,
            dict(x=x, weight=w), dict(x=S1, weight=R), ("x", "weight")),
        "add_rms_norm-shard1": lambda: _compare(
            speedlight.add_rms_norm, dict(x=x, residual=x.flip(0), weight=w),
            dict(x=S1, residual=S1, weight=R), ("x", "residual", "weight")),
        "layer_norm-shard0": lambda: _compare(
            lambda x, weight, bias: speedlight.layer_norm(x, 48, weight, bias),
            dict(x=x, weight=w, bias=b), dict(x=S0, weight=R, bias=R), ("x", "weight", "bias")),
        "softmax-shard0": lambda: _compare(speedlight.softmax, dict(x=x), dict(x=S0), ("x",)),
        "swiglu-shard0": lambda: _compare(
            speedlight.swiglu, dict(gate=x, up=x.flip(1)), dict(gate=S0, up=S0), ("gate", "up")),
        "geglu-concatenated-shard1": lambda: _compare(
            lambda gate: speedlight.geglu(gate), dict(gate=x), dict(gate=S1), ("gate",)),
        "rope-heads-shard1": lambda: _compare(
            lambda q, k, cos, sin: speedlight.rope(q, k, cos, sin),
            dict(q=q, k=k, cos=cos, sin=sin), dict(q=S1, k=S1), ("q", "k")),
        "cross_entropy-none-shard0": lambda: _compare(
            lambda logits, target: speedlight.cross_entropy(logits, target, reduction="none"),
            dict(logits=logits, target=target), dict(logits=S0, target=S0), ("logits",)),
        "cross_entropy-sum-shard0": lambda: _compare(
            lambda logits, target: speedlight.cross_entropy(logits, target, reduction="sum"),
            dict(logits=logits, target=target), dict(logits=S0, target=S0), ("logits",)),
        "linear_cross_entropy-sum-shard0": lambda: _compare(
            lambda hidden, weight, target: linear_cross_entropy(hidden, weight, target,
                                                                reduction="sum"),
            dict(hidden=hidden, weight=head, target=target),
            dict(hidden=S0, weight=R, target=S0), ("hidden", "weight")),
    }
    compare["nn.RMSNorm-sequence-parallel"] = lambda: _sequence_parallel_norm(x, w)
    qa, ka, va = r(2, 4, 6, 16), r(2, 2, 6, 16), r(2, 2, 6, 16)
    packed = dict(q=r(12, 4, 16), k=r(12, 2, 16), v=r(12, 2, 16))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    attention_qkv = dict(q=qa, k=ka, v=va)
    compare.update({
        "attention-batch-shard0": lambda: _compare(
            lambda q, k, v: speedlight.attention(q, k, v, causal=True, return_lse=True),
            attention_qkv, dict(q=S0, k=S0, v=S0), ("q", "k", "v")),
        "attention-heads-shard1": lambda: _compare(
            lambda q, k, v: speedlight.attention(q, k, v, causal=True, return_lse=True),
            attention_qkv, dict(q=S1, k=S1, v=S1), ("q", "k", "v")),
        "attention-packed-heads-shard1": lambda: _compare(
            lambda q, k, v: speedlight.attention(q, k, v, causal=True, cu_seqlens_q=cu,
                                                 cu_seqlens_k=cu),
            packed, dict(q=S1, k=S1, v=S1), ("q", "k", "v")),
        "matmul-rows-shard0": lambda: _compare(
            lambda a, b, residual: speedlight.matmul(a, b, residual=residual),
            dict(a=x, b=r(48, 8), residual=r(3, 5, 8)), dict(a=S0, b=R, residual=S0),
            ("a", "b", "residual")),
    })
    refused = {
        "rms_norm-shard-last-dim": lambda: _refused(
            speedlight.rms_norm, dict(x=x, weight=w), dict(x=[Shard(2)], weight=R)),
        "rms_norm-sharded-weight": lambda: _refused(
            speedlight.rms_norm, dict(x=x, weight=w), dict(x=S0, weight=S0)),
        "rms_norm-partial": lambda: _refused(
            speedlight.rms_norm, dict(x=x), dict(x=[Partial()])),
        "rms_norm-plain-weight-with-grad": lambda: _refused(
            speedlight.rms_norm, dict(x=x, weight=w.requires_grad_()), dict(x=S0)),
        "softmax-shard-on-dim": lambda: _refused(
            speedlight.softmax, dict(x=x), dict(x=S0), dim=0),
        "add_rms_norm-two-placements": lambda: _refused(
            speedlight.add_rms_norm, dict(x=x, residual=x), dict(x=S0, residual=S1)),
        "cross_entropy-mean": lambda: _refused(
            speedlight.cross_entropy, dict(logits=logits, target=target),
            dict(logits=S0, target=S0)),
        "linear_cross_entropy-sharded-weight": lambda: _refused(
            linear_cross_entropy, dict(hidden=hidden, weight=head, target=target),
            dict(weight=S0)),
        "linear_cross_entropy-empty-weight": lambda: _refused(
            linear_cross_entropy, dict(hidden=hidden, weight=head.new_empty(0), target=target),
            {}),
        "linear_cross_entropy-weight-shard-along-hidden": lambda: _refused(
            linear_cross_entropy, dict(hidden=hidden, weight=head[:, :8], target=target), {}),
        "attention-shard-sequence": lambda: _refused(
            speedlight.attention, attention_qkv, dict(q=[Shard(2)], k=[Shard(2)], v=[Shard(2)])),
        "attention-heads-split-groups": lambda: _refused(
            speedlight.attention, dict(q=qa, k=ka[:, :1], v=va[:, :1]),
            dict(q=S1, k=S1, v=S1)),
        "attention-packed-tokens": lambda: _refused(
            speedlight.attention, packed, dict(q=S0, k=S0, v=S0), cu_seqlens_q=cu,
            cu_seqlens_k=cu),
        "matmul-sharded-b": lambda: _refused(
            speedlight.matmul, dict(a=x, b=r(48, 8)), dict(b=S1)),
        "matmul-a-split-along-k": lambda: _refused(
            speedlight.matmul, dict(a=x, b=r(48, 8)), dict(a=[Shard(2)])),
    }
    return compare, refused


def dtensor(rank: int, world: int) -> dict:
    compare, refused = _cases()
    results: dict = {}
    for name, fn in {**compare, **refused}.items():
        check(results, name, fn)
    return results
