"""`speedlight report`: the main job, end to end on one model.

This package sits on top, beside cli.py (it imports the tools; no tool imports it), and
runs the tools in order (`stages.STAGES`, a table the runner walks), each writing its JSON
into one report folder (`folder.built_beside`: swapped in only when whole);
`speedlight.report` then renders those files (and nothing else) into index.html and
summary.md:

  1 profile-before.json  profile the model as it is
  2 patch.json           patch a copy with speedlight's ops (what was and was not swapped)
  3 model-check.json     the patched model against the original: logits, loss and every
                         parameter gradient, both judged against a float64 copy
  4 verify.jsonl         every op the model uses, verified at the model's own shapes (and
                         the ops of --spec files)
  5 bench.jsonl          the same cases timed against PyTorch (and torch.compile, Liger)
  6 inspect.json         the kernels of those cases compiled for the target GPU
  7 profile-after.json   profile the patched model
  8 profile-projected.json  without a GPU: the real-size configuration of the model's
                         family (Llama-3-8B by default) at 4096 tokens, projected onto
                         several GPUs (and profile-projected.html, its page)
  9 plan.json            which of patch's kinds to keep (speedlight.plan, handed in by the
                         CLI): on a GPU each kind timed on the model's first
                         decoder layer against what it replaces; without one nothing is timed
                         and the plan carries the projection's floors, labelled projected
 10 model-step.jsonl     on a GPU only: the model's training step (forward, backward,
                         AdamW) timed for HF, torch.compile, Liger, speedlight.patch (all
                         kinds, and the kinds plan.json keeps) and patch + compile
                         (`speedlight bench model`), at --layers (default 4)
"""

from __future__ import annotations

from speedlight.pipeline.stages import FILES, MANIFEST, ReportRequest, report

__all__ = ["FILES", "MANIFEST", "ReportRequest", "report"]
