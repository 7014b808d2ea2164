"""The memory of speedlight.moe_experts as profile measures it on a CPU (issue 53 item 1):
what the block saves for its backward and the most its backward holds at once, at
Qwen3-30B-A3B's and DeepSeek-V3's widths scaled down, each at three expert granularities
with k I and E I fixed (the same active and total widths cut into 4x fewer or 4x more
experts).

One training step of a module holding the two expert weights runs under profile's capture
(profile/capture.py: tensor lifetimes at dispatch, every tensor a speedlight launcher makes
seen from inside it). Per row: the bytes autograd saved (`saved_bytes`), the backward's and
the forward's own peak (`bwd_peak_bytes`, `fwd_peak_bytes`: their outputs and
intermediates), the backward's peak less its parameter-sized outputs (the two weight
gradients) per token (`bwd_peak_per_token`), and the saved bytes per token. These are
allocations measured on a CPU, not timings; the kernels ran under the Triton interpreter.

    python scripts/moe_memory.py --out benchmarks/results/cpu/moe-memory-<rev>.jsonl
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOKENS = 32
# (hidden, inter, experts, k, shared) at 1 / 16 (Qwen3-30B-A3B: 2048, 768, 128, 8) and
# 1 / 32 of the widths, 1 / 16 of the experts (DeepSeek-V3: 7168, 2048, 256, 8, one shared)
BLOCKS = {"qwen3-30b-a3b/16": (128, 48, 16, 8, 0), "deepseek-v3/32": (224, 64, 16, 8, 1)}
# granularity multipliers: experts and k times g, I divided by g
GRANULARITY = (0.25, 1, 2)


def _revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True).stdout.strip()
    except OSError:
        return "unknown"
    return rev + ("-dirty" if dirty else "")


def measure(hidden: int, inter: int, experts: int, k: int, shared: int, tokens: int) -> dict:
    import torch
    from torch import nn

    import speedlight
    from speedlight.ops import moe_experts_cases as cases
    from speedlight.profile import capture

    case = cases._case(tokens, hidden, inter, experts, k, routing="skewed",
                       **({"shared": shared} if shared else {})).with_(dtype=torch.bfloat16)
    inputs = cases.make_inputs(case, "cpu")

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(inputs["gate_up_proj"])
            self.down_proj = nn.Parameter(inputs["down_proj"])

        def forward(self, hidden, top_k_index, top_k_weights):
            return speedlight.moe_experts(hidden, top_k_index, top_k_weights,
                                          self.gate_up_proj, self.down_proj)

    model = Experts()
    x = {"hidden": inputs["hidden"].requires_grad_(True), "top_k_index": inputs["top_k_index"],
         "top_k_weights": inputs["top_k_weights"]}

    def step(phase):
        phase("forward")
        loss = model(**x).float().sum()
        phase("backward")
        loss.backward()

    cap = capture.capture(model, step, device=torch.device("cpu"), warmup=0, steps=1,
                          train=True, optimizer=None, inputs=x)
    m = cap.memory
    peaks = {p["op"]: p["bytes"] for p in m["op_peaks"]}
    weight_grads = sum(p.numel() * p.element_size() for p in model.parameters())
    e_all, k_all = cases.routed(case)
    return {"experts": e_all, "k": k_all, "shared": shared, "inter": inter, "hidden": hidden,
            "tokens": tokens, "dtype": "bf16", "k_times_inter": k_all * inter,
            "saved_bytes": m["activations_bytes"],
            "saved_per_token": m["activations_bytes"] / tokens,
            "fwd_peak_bytes": peaks.get("moe_experts_fwd"),
            "bwd_peak_bytes": peaks.get("moe_experts_bwd"),
            "weight_grad_bytes": weight_grads,
            "bwd_peak_per_token": (peaks["moe_experts_bwd"] - weight_grads) / tokens,
            "pairs_by_hidden_bytes": tokens * k_all * hidden * 2}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tokens", type=int, default=TOKENS)
    args = p.parse_args(argv)
    from speedlight import results
    from speedlight.runtime import select_device

    select_device("cpu")
    rev = _revision()
    for name, (hidden, inter, experts, k, shared) in BLOCKS.items():
        for g in GRANULARITY:
            t0 = time.process_time()
            row = measure(hidden, int(inter / g), int(experts * g), int(k * g), shared,
                          args.tokens)
            row.update(block=name, granularity=g, git=rev, cpu_s=round(time.process_time() - t0, 1),
                       note="allocations measured by profile's capture on a CPU (Triton "
                            "interpreter); not a timing")
            results.append_jsonl(args.out, [row])
            print(f"{name} x{g}: E {row['experts']} k {row['k']} I {row['inter']}: saved "
                  f"{row['saved_per_token']:.0f} B/token, backward peak beyond its weight "
                  f"gradients {row['bwd_peak_per_token']:.0f} B/token", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
