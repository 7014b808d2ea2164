"""torch.compile's answer: the Triton kernels inductor generates for the function.

Inductor generates Triton only for CUDA tensors (on a CPU it generates C++), so on a machine
without a GPU this is skipped, with that reason. On a GPU the function is compiled at the
given shapes and the generated kernels are listed (launches, names, kind) against the eager
launches; `speedlight inspect` then reads their resources and bytes.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import torch

from speedlight.shape.trace import InputSpec

_KERNEL = re.compile(r"async_compile\.triton\(\s*'(\w+)'")


def inductor(fn: Callable, inputs: Sequence[InputSpec], *, train: bool) -> dict:
    """{'status': 'ran' | 'skipped' | 'failed', ...}: what inductor made of `fn` here."""
    if not torch.cuda.is_available():
        return {"status": "skipped",
                "reason": "no GPU here: inductor generates C++ for a CPU, and Triton kernels only "
                          "for CUDA tensors; run `speedlight shape` on a GPU machine for its answer"}
    try:
        from torch._inductor.utils import run_and_get_code

        args = []
        for s in inputs:
            if s.dtype.is_floating_point:
                t = torch.randn(s.shape, device="cuda").to(s.dtype)
                t.requires_grad_(train and s.dtype.itemsize >= 2)
            else:
                t = torch.randint(0, 2, s.shape, device="cuda", dtype=s.dtype)
            args.append(t)
        torch._dynamo.reset()
        compiled = torch.compile(fn, dynamic=False)

        def step():
            out = compiled(*args)
            if train:
                outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                        if isinstance(o, torch.Tensor) and o.requires_grad]
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            return out

        _, codes = run_and_get_code(step)
    except Exception as e:  # the compiler's failure is the answer, not a crash of shape
        return {"status": "failed", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    kernels = [k for code in codes for k in _KERNEL.findall(code)]
    kinds = {}
    for k in kernels:
        kind = k.split("_")[1] if k.count("_") >= 2 else "other"  # triton_per_/red_/poi_/tem_
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"status": "ran", "kernels": kernels, "launches": len(kernels), "kinds": kinds,
            "graphs": len(codes),
            "next": "speedlight inspect reads these kernels' registers, spills and bytes "
                    "(TORCH_COMPILE_DEBUG=1 keeps their sources)"}
