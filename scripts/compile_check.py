"""A patched model under torch.compile(mode="reduce-overhead", fullgraph=True): CUDA graphs
over the whole training step's forward, with a padded batch, against the eager patched
model's loss (issue 28). GPU only: on a machine without one it says so and exits 0.

    python scripts/compile_check.py --out compile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("compile_check: no CUDA GPU: CUDA graphs need one; nothing run")
        return 0
    import transformers as tf

    import speedlight
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4)
    model = tf.AutoModelForCausalLM.from_config(cfg).cuda().to(torch.bfloat16)
    report = speedlight.patch(model)
    ids = torch.randint(0, cfg.vocab_size, (4, 512), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :37] = 0  # one left-padded row
    eager = model(input_ids=ids, attention_mask=mask, labels=ids).loss.float()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    t0 = time.perf_counter()
    losses = []
    for _ in range(args.steps):
        loss = compiled(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        losses.append(float(loss))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    agrees = abs(losses[-1] - float(eager)) <= 2e-2 * max(1.0, abs(float(eager)))
    doc = {"mode": "reduce-overhead", "fullgraph": True, "eager_loss": float(eager),
           "compiled_losses": losses, "agrees": agrees, "seconds_with_compile": seconds,
           "patched": {k: len(v) for k, v in report.patched.items()},
           "device": torch.cuda.get_device_name()}
    print(json.dumps(doc, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if agrees else 1


if __name__ == "__main__":
    sys.exit(main())
