"""What each rank runs for test_training.py: a tiny Hugging Face model, patched by
speedlight or not, wrapped in DDP or FSDP2, with or without activation checkpointing,
trained two steps on the rank's half of a batch. Rank 0 returns, per setting, whether the
patched model's losses and gradients equal the unpatched model's under the same wrapping."""

from __future__ import annotations

import copy
import warnings

import torch
import torch.distributed as dist

from speedlight.verify.harness import LaunchCounter
from tests.distributed.ranks import check
from tests.patching.tiny_models import batch, build

TOL = dict(rtol=2e-4, atol=2e-5)  # fp32, as tests/patching: kernels sum in another order

# name -> (wrapping, checkpointing)
SETTINGS = {
    "ddp": ("ddp", None),
    "ddp-hf-checkpointing-reentrant": ("ddp", "hf-reentrant"),
    "fsdp2": ("fsdp2", None),
    "fsdp2-hf-checkpointing": ("fsdp2", "hf"),
    "fsdp2-checkpoint-wrapper": ("fsdp2", "torch"),
    # the lm_head sharded on its own: its weight is whole only inside its own call
    "fsdp2-sharded-lm-head": ("fsdp2-lm-head", None),
}


def _hf_checkpointing(model, kwargs=None):
    """transformers' own switch: activation_checkpointing_enable from 5.2x, before it
    gradient_checkpointing_enable (the GPU machines' 5.17), now its deprecated alias."""
    enable = getattr(model, "activation_checkpointing_enable", None) \
        or model.gradient_checkpointing_enable
    enable(kwargs)


def _wrap(model, wrapping: str, checkpointing: str | None):
    if checkpointing == "hf":
        _hf_checkpointing(model)  # torch's non-reentrant checkpoint
    elif checkpointing == "hf-reentrant":
        _hf_checkpointing(model, {"use_reentrant": True})
    elif checkpointing == "torch":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing)
        layer = type(model.model.layers[0])
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, layer))
    if wrapping == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    if wrapping == "fsdp2-lm-head":
        fully_shard(model.lm_head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full(t):
    """A gradient as one full tensor (FSDP2 holds each rank's shard, a DTensor)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train(model, rank: int, steps: int = 2):
    """Losses and the first step's gradients of `steps` SGD steps on this rank's sample,
    and whether no step made logits (the linear cross-entropy patch's fused loss)."""
    ids, labels = batch(model.config.vocab_size if hasattr(model, "config")
                        else model.module.config.vocab_size, batch=2, seq=9)
    ids, labels = ids[rank:rank + 1], labels[rank:rank + 1]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads, no_logits = [], None, True
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        out = model(input_ids=ids, labels=labels, use_cache=False)
        loss, no_logits = out.loss, no_logits and out.logits is None
        loss.backward()
        losses.append(loss.detach())
        if grads is None:
            grads = {n: _full(p.grad).clone() for n, p in model.named_parameters()
                     if p.grad is not None}
        opt.step()
    return torch.stack(losses), grads, no_logits


def _compare(rank: int, wrapping: str, checkpointing: str | None) -> dict:
    import speedlight
    base = build("llama")
    patched = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # everything asked for is patched
        report = speedlight.patch(patched)
    kinds = sorted(report.patched)
    loss0, grads0, _ = _train(_wrap(base, wrapping, checkpointing), rank)
    counter = LaunchCounter()
    with counter.active():
        loss1, grads1, fused_loss = _train(_wrap(patched, wrapping, checkpointing), rank)
    losses = torch.stack([loss0, loss1])
    dist.all_reduce(losses)  # the ranks' losses summed: both ranks' must match
    torch.testing.assert_close(losses[1], losses[0], **TOL)
    assert sorted(grads0) == sorted(grads1), (sorted(grads0), sorted(grads1))
    assert len(grads0) == sum(1 for _ in base.parameters()), "a parameter got no gradient"
    for name, g0 in grads0.items():
        torch.testing.assert_close(grads1[name], g0, **TOL, msg=lambda m: f"{name}: {m}")
    return {"patched": kinds, "kernels": sorted(set(counter.kernels)), "fused_loss": fused_loss,
            "losses": losses[1].tolist(), "n_grads": len(grads0)}


def _shared_plan(rank: int) -> dict:
    """Rank 0 holds a measured plan (mlp dropped), rank 1 none, as after rank 0 alone
    measured or found one in its cache: speedlight.plans.shared gives every rank rank 0's,
    and patch then applies the same kinds on each. What each rank received, gathered."""
    from speedlight import plans
    from speedlight.patching.planned import wanted

    model = build("llama")
    mine = None
    if rank == 0:
        mine = plans.Plan(plans.key_for(model, batch=1, seq=8, compile_mode=None),
                          {"mlp": plans.Decision("mlp", "dropped", "stand-in: slower"),
                           "rms_norm": plans.Decision("rms_norm", "kept", "stand-in: faster")},
                          True, "stand-in timed on rank 0", created="2026-01-01T00:00:00+00:00")
    got = plans.shared(mine)
    kinds = wanted({"mlp": True, "rms_norm": True, "rope": True}, got)
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, {"note": got.note if got else None, "kinds": kinds})
    return {"ranks": seen}


def training(rank: int, world: int) -> dict:
    results: dict = {}
    for name, (wrapping, checkpointing) in SETTINGS.items():
        check(results, name, lambda: _compare(rank, wrapping, checkpointing))
    check(results, "plan", lambda: _shared_plan(rank))
    return results
