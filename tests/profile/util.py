"""Capture a small model's step the way `speedlight profile` does."""

import torch

from speedlight.profile import analyze, capture
from speedlight.target import resolve


def profile_model(model, inputs, *, train=True, loss_fn=None, steps=1, warmup=1):
    """(capture, analysis) of one recorded step of `model(inputs)`."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if train else None
    loss_fn = loss_fn or (lambda out: out.sum())
    call = (lambda: model(**inputs)) if isinstance(inputs, dict) else (lambda: model(inputs))

    def step(phase):
        if not train:
            with torch.inference_mode():
                phase("forward")
                call()
            return
        phase("forward")
        loss = loss_fn(call())
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)

    cap = capture.capture(model, step, device=torch.device("cpu"), warmup=warmup, steps=steps,
                          train=train, optimizer=opt, inputs=inputs)
    target = resolve("h100-sxm")
    return cap, analyze.analyze(cap, target), opt
