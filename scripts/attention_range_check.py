"""Attention's fp32 range: how far speedlight.attention and torch's flash SDPA backend are
from float64 as the scores grow, at the same inputs (issue 29, item 4).

q and k are scaled by powers of two (exact in every dtype), causal, and each output and
gradient's relative L2 error against the float64 reference is printed next to that of
torch's flash backend and of eager attention in the same dtype. On a GPU the flash
backend is FlashAttention-2's kernel; on a CPU torch's own flash implementation (run the
CPU side with TRITON_INTERPRET=1). Both store an fp32 log-sum-exp and recompute
p = exp(s - lse) backward, so both lose dq and dk (then dv) as |s| grows; the docstring of
speedlight.attention states the bound this shows. Writes one JSON file with --out.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _grads(fn, q, k, v, do, dtype):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(do.to(dtype))
    return [t.double() for t in (o.detach(), q.grad, k.grad, v.grad)]


def _flash(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--shape", default="1,2,256,128", help="batch,heads,seq,dim")
    parser.add_argument("--log2-amplitudes", default="0,4,5,6,8,10,13")
    parser.add_argument("--out")
    args = parser.parse_args()

    import speedlight
    from speedlight import reference

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    b, h, s, d = (int(x) for x in args.shape.split(","))
    rows = []
    for lg in (float(x) for x in args.log2_amplitudes.split(",")):
        gen = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, d, generator=gen).to(device) for _ in range(4))
        q, k = q * 2 ** lg, k * 2 ** lg
        q, k, v = (t.to(dtype).double() for t in (q, k, v))  # the inputs each side sees
        want = _grads(lambda *t: reference.attention(*t, causal=True), q, k, v, do,
                      torch.float64)
        row = {"log2_amplitude": lg,
               "max_abs_score": float((q @ k.transpose(-1, -2)).abs().max() * d ** -0.5)}
        for name, fn in (("speedlight", lambda *t: speedlight.attention(*t, causal=True)),
                         ("sdpa-flash", _flash),
                         ("eager", lambda *t: reference.attention(*t, causal=True))):
            try:
                got = _grads(fn, q, k, v, do, dtype)
            except RuntimeError as e:  # no flash kernel for this device or dtype
                row[name] = str(e).splitlines()[0]
                continue
            row[name] = {n: float((g - w).norm() / w.norm())
                         for n, g, w in zip(("o", "dq", "dk", "dv"), got, want)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "dtype": args.dtype, "shape": args.shape,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
