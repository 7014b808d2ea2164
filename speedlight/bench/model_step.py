"""`speedlight bench model`: one model's training step, end to end, against every alternative.

A training step is forward, backward and an AdamW step of a causal LM on a fixed batch of
token ids. It is timed for each variant, every one built afresh from the same seed (the
same weights) and fed the same batches:

  hf                  Hugging Face as configured by default (its SDPA attention), eager
  hf-compile          the same model under torch.compile (the optimizer step stays eager)
  liger               Liger-Kernel's patch of the instance (apply_liger_kernel_to_<family>),
                      when liger-kernel is installed and has that family (its kernels do
                      not run under the Triton interpreter: skipped on a CPU, with that
                      reason, unless named in --variants)
  speedlight          "speedlight (all)": speedlight.patch(model, plan=None), every kind
  speedlight-planned  "speedlight (planned)": speedlight.patch(model, plan=...), only the
                      kinds a measured plan keeps (speedlight.plans): a plan file or its
                      JSON, "auto" (the cached plan), or "measure" (the default: the plan is
                      measured on the variant's own model and first batch before its warm-up;
                      on a CPU nothing is timed, every kind is applied unmeasured, so the
                      variant is skipped there, with that reason, unless named in --variants)
  speedlight-compile  speedlight.patch(model, plan=None), then torch.compile
  hf-loop             a mixture of experts only: Hugging Face with its per-expert loop
                      (experts_implementation="eager"), where transformers (5.25+) would
                      otherwise run its grouped_mm implementation; skipped, with the reason,
                      where hf runs the loop already (no experts registry) or the model has
                      no experts

A mixture of experts (`--moe [NAME]`: Qwen3-30B-A3B, DeepSeek-V3 or gpt-oss-20B, MOE_MODELS;
or a --model name with experts) is benched the same way; each row says what its experts ran
(`experts`: count, top-k, widths, implementation: loop, grouped_mm, speedlight...) and the
speedlight rows what the patch replaced (`patched`). On a CPU `--moe` builds the model's
architecture scaled down (Qwen3-30B-A3B's to CPU_MOE_EXPERTS experts, a token picking two):
its rows check the harness, not any speed.

Per variant: `warmup` untimed steps (the first compiles), then `steps` timed ones, each
between two clock marks (CUDA events on a GPU, perf_counter on a CPU). A step is long
enough that no L2 flush or host-lead spin is needed. The row keeps the raw samples, their
median and spread, tokens/s (batch x seq over the median), the peak memory
(torch.cuda.max_memory_allocated after a reset, so weights, gradients, AdamW state and
activations; on a CPU "n/a": torch keeps no allocator peak there), and the loss of every
step, warm-up included: the loss curve. Each step's loss is judged against the hf
variant's at the same step by the model check's rule (speedlight.verify's, one level up):
within k times Hugging Face's own error of its first-step loss against a float64 copy of
the model (`loss_float64`, computed where the model has at most FLOAT64_MAX_PARAMS
parameters, as the model check does; larger models are judged against Hugging Face's
loss itself, so the yardstick is the dtype's unit roundoff), under the dtype's ceiling,
and in Hugging Face's loss dtype (float32: a loss rounded to bf16 moves in steps of 0.06
at 12); the row says whether it is and by what bound (`loss_tolerance`).

The model comes from speedlight.workloads (the builder the tools share); the speedlight
variants' patch is handed in (`patch`, speedlight.patch from the CLI or the report), since
no tool imports another; a plan reaches bench as data (a path or JSON) or as
plan="measure", which that handed-in patch measures, so bench never imports the planning
composer. A speedlight variant's row says which kinds it patched and, per kind, what the
plan decided. Peak memory is reset after a variant is prepared (its plan measured, its
patch applied), so it is the training steps' peak, weights and optimizer state included.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from speedlight.spec import TOLERANCES, dtype_name

# in the order they run (hf first); the planned variant last, so a budget cuts it first
VARIANTS = ("hf", "speedlight", "hf-compile", "speedlight-compile", "liger", "hf-loop",
            "speedlight-planned")
PLANNED = "speedlight-planned"
# what runs by default: hf-loop only for a mixture of experts (variants_for)
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v != "hf-loop")
MOE_MODEL = "qwen3-30b-a3b"
# a CPU --moe model: Qwen3-30B-A3B's architecture, scaled down, with this many experts
CPU_MOE_EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2}
# what `--moe NAME` benches on a GPU: (layers, batch, Hugging Face config fields changed).
# DeepSeek-V3 at its widths with 32 of its 256 routed experts (top-8 over 8 groups of 4,
# its shared expert) and its MoE layer first (first_k_dense_replace 0): a layer of all 256
# with AdamW's state is 136 GB; sized by arithmetic (about 45 GB of weights, gradients
# and AdamW state, and the fp32 logits of 2 x 4096 tokens), unmeasured. gpt-oss-20B at 2 x
# 4096 tokens: its 201088-token vocabulary makes the logits the largest activation.
MOE_MODELS = {"qwen3-30b-a3b": (4, 4, None),
              "deepseek-v3": (1, 2, {"n_routed_experts": 32, "first_k_dense_replace": 0}),
              "gpt-oss-20b": (4, 2, None)}
# ... and on a CPU (their architectures scaled down, one layer)
CPU_MOE_OVERRIDES = {"qwen3-30b-a3b": CPU_MOE_EXPERTS,
                     "deepseek-v3": {"first_k_dense_replace": 0},
                     "gpt-oss-20b": None}
DEFAULT = "hf"
COMPILED = ("hf-compile", "speedlight-compile")
# the dtypes a step runs in (each has a tolerance in speedlight.spec.TOLERANCES)
STEP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# the most parameters whose float64 copy gives Hugging Face's first-step loss its own error
# (the model check's limit: 8 bytes a parameter, plus the activations)
FLOAT64_MAX_PARAMS = 200_000_000
FILE = "model-step.jsonl"
CHART = "model-step.png"
CPU_LIGER_REASON = ("Liger-Kernel on a CPU: its Triton kernels do not run under the Triton "
                    "interpreter (an InterpreterError in its kernels); name the variant in "
                    "--variants to try anyway")
# variants whose failure fails the run: the reference and speedlight's own
OURS = ("hf", "speedlight", "speedlight-compile", PLANNED)
CPU_COMPILE_REASON = ("torch.compile on a CPU: inductor's C++ build of a whole training step "
                      "takes a minute or more even for the small model and says nothing "
                      "about a GPU; name the variant in --variants to run it anyway")
CPU_PLANNED_REASON = ("a plan on a CPU: nothing is timed there, so a measured plan keeps every "
                      "kind (the speedlight variant again); name the variant in --variants, "
                      "with --plan FILE to apply a plan measured on a GPU")


@dataclass
class StepSettings:
    model: str | None
    layers: int | None
    batch: int
    seq: int
    dtype: torch.dtype
    device: torch.device
    warmup: int
    steps: int
    seed: int = 0
    lr: float = 1e-4
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    budget_s: float | None = None
    notes: list[str] = field(default_factory=list)
    overrides: dict | None = None  # Hugging Face config fields set on the built model
    # speedlight-planned's plan: "measure", "auto", a plan file's path or a plan's JSON dict
    plan: str | dict = "measure"


def defaults(device: torch.device, moe: bool | str = False) -> dict:
    """What a bare `speedlight bench model` runs: Llama-3-8B's widths at 4 layers, bf16,
    4 x 4096 tokens on a GPU; the tiny default model in fp32 on a CPU. With `moe` (True:
    Qwen3-30B-A3B, or a MOE_MODELS name): that model's widths at MOE_MODELS' layers, batch
    and fields on a GPU; on a CPU its architecture scaled down, one layer (Qwen3-30B-A3B's
    with CPU_MOE_EXPERTS experts)."""
    if moe:
        name = MOE_MODEL if moe is True else moe
        if name not in MOE_MODELS:
            raise ValueError(f"--moe takes {', '.join(MOE_MODELS)}; got {name!r}")
        layers, batch, fields = MOE_MODELS[name]
        if device.type == "cuda":
            return dict(model=name, layers=layers, batch=batch, seq=4096, dtype=torch.bfloat16,
                        warmup=3, steps=10, overrides=dict(fields) if fields else None)
        cpu = CPU_MOE_OVERRIDES[name]
        return dict(model=name, layers=1, batch=1, seq=32, dtype=torch.float32, warmup=1,
                    steps=3, overrides=dict(cpu) if cpu else None)
    if device.type == "cuda":
        return dict(model="llama-3-8b", layers=4, batch=4, seq=4096, dtype=torch.bfloat16,
                    warmup=3, steps=10, overrides=None)
    return dict(model=None, layers=None, batch=1, seq=32, dtype=torch.float32, warmup=1, steps=3,
                overrides=None)


def names_moe(model: str | None) -> bool:
    """Whether --model names a mixture of experts among speedlight.shapes.MODELS and
    workloads.models.ARCHITECTURES."""
    from speedlight import shapes
    from speedlight.workloads import models
    return (model in shapes.MODELS and bool(shapes.MODELS[model].experts)) or \
        model in models.ARCHITECTURES


def variants_for(s: StepSettings) -> tuple[str, ...]:
    """The variants a run without --variants times: hf-loop joins for a mixture of experts."""
    return VARIANTS if names_moe(s.model) else DEFAULT_VARIANTS


def _build(s: StepSettings):
    from speedlight.runtime import model_defaults
    from speedlight.workloads import models
    _, size = model_defaults(s.device)
    return models.build(s.model, batch=s.batch, seq=s.seq, train=True, dtype=s.dtype,
                        device=s.device, size=size, layers=s.layers, seed=s.seed,
                        overrides=s.overrides)


def check_model(s: StepSettings) -> None:
    """models.ModelError (a ValueError) when --model names nothing that trains as a causal
    LM with labels; builds nothing on the device."""
    from speedlight import shapes
    from speedlight.workloads import models
    if s.model not in (None, models.DEFAULT) and s.model not in shapes.MODELS \
            and s.model not in models.ARCHITECTURES and not str(s.model).endswith(".json"):
        raise models.ModelError(f"--model {s.model!r}: bench model takes a name from "
                                f"{', '.join([*shapes.MODELS, *models.ARCHITECTURES])}, a "
                                f"config.json, or nothing (the default small model)")


def _batches(s: StepSettings, vocab: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(s.seed + 1)
    return [torch.randint(0, vocab, (s.batch, s.seq), generator=g).to(s.device) for _ in range(n)]


@contextlib.contextmanager
def _module_restored(module_name: str):
    """Liger's patch also rebinds names in the family's modeling module (its RMSNorm and MLP
    classes, apply_rotary_pos_emb); put them back so later models are built unpatched."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    saved = dict(vars(module)) if module is not None else {}
    try:
        yield
    finally:
        if module is not None:
            for k, v in saved.items():
                if vars(module).get(k) is not v:
                    setattr(module, k, v)


def _liger(model) -> Callable[[], None]:
    """Apply Liger's patch to the instance; ValueError with the reason when it cannot."""
    try:
        import liger_kernel.transformers as lt
    except ImportError:
        raise ValueError("liger-kernel is not installed (pip install 'speedlight[liger]')") from None
    family = model.config.model_type
    fn = getattr(lt, f"apply_liger_kernel_to_{family}", None)
    if fn is None:
        raise ValueError(f"Liger-Kernel has no apply_liger_kernel_to_{family}")
    fn(model=model)


class Skip(Exception):
    """A variant that does not apply to this model (the row says why)."""


def _hf_loop(model) -> None:
    """Run the model's experts as Hugging Face's per-expert loop; Skip where that is what
    hf runs already, or there are no experts."""
    from speedlight.workloads import moe

    experts = moe.experts_summary(model)
    if experts is None:
        raise Skip("hf-loop: the model has no experts (a mixture of experts' variant)")
    if experts["implementation"] == ["loop"]:
        raise Skip("hf-loop: hf runs the per-expert loop already (this transformers has no "
                   "experts-implementation registry, or the config chose eager)")
    model.set_experts_implementation("eager")


def _prepare(variant: str, model, s: StepSettings, patch: Callable | None,
             example: dict) -> tuple[torch.nn.Module, list[str], dict]:
    """The variant's model, its notes, and for a speedlight variant what its patch did:
    the kinds patched (with counts) and, per kind, what the plan decided."""
    notes: list[str] = []
    patched: dict = {}
    if variant.startswith("speedlight"):
        import warnings

        if patch is None:
            raise ValueError("the speedlight variants need speedlight.patch, handed in as patch=")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if variant != PLANNED:
                report = patch(model, plan=None)
            elif isinstance(s.plan, str) and s.plan == "measure":
                report = patch(model, plan="measure", example_inputs=example)
            else:
                report = patch(model, plan=s.plan)
        if report.not_patched:
            notes.append("not patched: " + "; ".join(f"{a} ({b})" for a, b in report.not_patched))
        if variant == PLANNED:
            dropped = [k for k, st in report.plan.items() if st.startswith("dropped")]
            notes.append(f"plan: {report.plan_note}; dropped: {', '.join(dropped) or 'none'}")
        patched = {"patched": {k: len(v) for k, v in report.patched.items()},
                   "plan": dict(report.plan), "plan_note": report.plan_note}
        if variant == PLANNED and report.candidates:
            patched["candidates"] = report.candidates
    elif variant == "liger":
        _liger(model)
    elif variant == "hf-loop":
        _hf_loop(model)
    if variant in COMPILED:
        torch._dynamo.reset()
        model = torch.compile(model, backend=s.compile_backend, mode=s.compile_mode)
    return model, notes, patched


def _peak_reset(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _timed_steps(model, opt, batches: list, warmup: int, clock) -> tuple[list, list, float]:
    """Training steps (forward, backward, optimizer) over `batches`: the first `warmup`
    untimed -> (each step's loss as a device tensor, the timed steps' seconds, the warm-up's
    wall seconds)."""
    def step(ids):
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    losses, marks = [], []
    t0 = time.perf_counter()
    for ids in batches[:warmup]:
        losses.append(step(ids))
    clock.sync()
    warm_s = time.perf_counter() - t0
    for ids in batches[warmup:]:
        a = clock.record()
        losses.append(step(ids))
        marks.append((a, clock.record()))
    clock.sync()
    return losses, [clock.elapsed(a, b) for a, b in marks], warm_s


def run_variant(variant: str, s: StepSettings, patch: Callable | None = None) -> dict:
    """One variant's row: its timed steps, peak memory and loss curve (no agreement yet);
    `patch` (speedlight.patch) makes the speedlight variants."""
    from speedlight.bench.stats import summarize
    from speedlight.bench.timer import clock_for
    from speedlight.workloads import moe

    _peak_reset(s.device)
    w = _build(s)
    model = w.model
    family = getattr(getattr(model, "config", None), "model_type", None)
    restore = (_module_restored(f"transformers.models.{family}.modeling_{family}")
               if variant == "liger" and family else contextlib.nullcontext())
    with restore:
        model.train()
        batches = _batches(s, w.model.config.vocab_size, s.warmup + s.steps)
        loss64 = _float64_loss(model, batches[0]) if variant == DEFAULT else None
        example = {"input_ids": batches[0], "labels": batches[0], "use_cache": False}
        model, notes, patched = _prepare(variant, model, s, patch, example)
        del example
        _peak_reset(s.device)  # a plan measured in _prepare is no part of the step's peak
        experts = moe.experts_summary(w.model)
        opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
        clock = clock_for(s.device)
        losses, samples, warm_s = _timed_steps(model, opt, batches, s.warmup, clock)
        curve = [float(x) for x in torch.stack(losses).float().cpu()]
        loss_dtype = dtype_name(losses[0].dtype) if losses else None
    peak = torch.cuda.max_memory_allocated(s.device) if s.device.type == "cuda" else None
    summary = summarize(samples)
    tokens = s.batch * s.seq
    row = {"variant": variant, "status": "ok", "model": w.name, "config": w.config,
           "layers": w.config.get("num_hidden_layers", w.config.get("n_layer", s.layers)),
           "samples_s": samples, "median_s": summary.median, "p20_s": summary.p20,
           "p80_s": summary.p80, "spread": summary.spread, "stop": f"{s.steps} steps",
           "method": clock.method, "warmup_steps": s.warmup, "warmup_s": round(warm_s, 3),
           "tokens_per_step": tokens, "tokens_per_s": tokens / summary.median,
           "peak_bytes": peak,
           "peak_method": ("torch.cuda.max_memory_allocated after reset_peak_memory_stats"
                           if peak is not None else "n/a: torch keeps no allocator peak on a CPU"),
           "losses": curve, "loss_dtype": loss_dtype, "notes": notes + list(w.notes),
           **patched}
    if variant == DEFAULT:
        row["loss_float64"] = loss64
    if experts is not None:
        row["experts"] = experts
        if s.overrides:
            row["notes"].append("experts scaled down: " + ", ".join(
                f"{k}={v}" for k, v in s.overrides.items()))
    del model, opt, w
    _peak_reset(s.device)
    return row


def _float64_loss(model, ids: torch.Tensor) -> float | None:
    """The training loss of a float64 copy of `model` on `ids` (the model check's basis),
    or None when the model has more than FLOAT64_MAX_PARAMS parameters. The loss is taken
    from the copy's float64 logits as Hugging Face's causal-LM loss takes it (labels = ids
    shifted by one), in float64: that loss itself upcasts the logits with .float(), which
    would round a float64 copy's to float32."""
    if sum(p.numel() for p in model.parameters()) > FLOAT64_MAX_PARAMS:
        return None
    ref = copy.deepcopy(model).double()
    if hasattr(ref, "set_experts_implementation"):
        ref.set_experts_implementation("eager")  # grouped_mm takes no float64; the loop does
    with torch.no_grad():
        logits = ref(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    del ref, logits
    return float(loss)


def loss_bound(ref: dict, dtype: torch.dtype) -> tuple[float, str]:
    """(the relative difference a step's loss may have from the hf row's, how it was set):
    the model check's rule, k x max(hf's own relative error of its first-step loss against
    float64, the dtype's unit roundoff), at most the dtype's ceiling."""
    tol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    loss64, losses = ref.get("loss_float64"), ref.get("losses") or []
    if loss64 is not None and losses:
        own = abs(losses[0] - loss64) / max(abs(loss64), 1e-300)
        basis = f"hf's first-step error against a float64 copy, {own:.3g}"
    else:
        own, basis = 0.0, "no float64 copy (a model too large for one)"
    yardstick = max(own, tol.floor)
    bound = min(tol.k * yardstick, tol.ceiling)
    return bound, (f"k={tol.k:g} x {yardstick:.3g} ({basis}; the {dtype_name(dtype)} floor "
                   f"{tol.floor:.3g}), ceiling {tol.ceiling:g}")


def agree(rows: list[dict], dtype: torch.dtype) -> None:
    """Set each row's loss agreement with the hf variant's, step by step, in place: each
    step within loss_bound of hf's, and the loss in hf's dtype (rows that name one)."""
    ref = next((r for r in rows if r["variant"] == DEFAULT and r["status"] == "ok"), None)
    for r in rows:
        if r["status"] != "ok":
            continue
        if ref is None:
            r.update(loss_agrees=None, loss_note=f"no {DEFAULT} row to compare with")
            continue
        tol, rule = loss_bound(ref, dtype)
        r.update(loss_tolerance=tol, loss_rule=rule)
        diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], ref["losses"])]
        r["loss_rel_diff"] = diffs
        r["loss_max_rel_diff"] = max(diffs) if diffs else None
        same_dtype = r.get("loss_dtype") == ref.get("loss_dtype")
        if not same_dtype:
            r["loss_note"] = f"loss in {r.get('loss_dtype')}, {DEFAULT}'s in {ref.get('loss_dtype')}"
        r["loss_agrees"] = bool(diffs) and len(r["losses"]) == len(ref["losses"]) \
            and all(d <= tol for d in diffs) and same_dtype
        r["speedup_vs_hf"] = ref["median_s"] / r["median_s"]
        if r.get("peak_bytes") and ref.get("peak_bytes"):
            r["memory_vs_hf"] = r["peak_bytes"] / ref["peak_bytes"]


def run_variants(s: StepSettings, variants: Sequence[str], out_path: Path, *,
                 forced: Sequence[str] = (), on_row: Callable[[dict], None] | None = None,
                 patch: Callable | None = None) -> list[dict]:
    """Every variant's row, each appended to out_path (JSON lines) as it finishes, hf first
    (the others' loss agreement is judged against its row), so a run killed part way keeps
    the rows it finished. A variant that raises is an error row with the reason;
    one skipped (compile or Liger on a CPU unless in `forced`, or past budget_s) says why.
    `patch` (speedlight.patch, from the caller) makes the speedlight variants."""
    from speedlight import results

    env = results.environment(s.device)
    common = {"tool": "bench-model", "dtype": dtype_name(s.dtype), "batch": s.batch,
              "seq": s.seq, "layers": s.layers, "requested_model": s.model or "default",
              "representative": s.device.type == "cuda", **env}
    order = sorted(variants, key=lambda v: v != DEFAULT)  # hf first: the others compare with it
    start = time.perf_counter()
    rows: list[dict] = []
    for v in order:
        if v in COMPILED and s.device.type != "cuda" and v not in forced:
            row = {"variant": v, "status": "skipped", "reason": CPU_COMPILE_REASON}
        elif v == "liger" and s.device.type != "cuda" and v not in forced:
            row = {"variant": v, "status": "skipped", "reason": CPU_LIGER_REASON}
        elif v == PLANNED and s.device.type != "cuda" and v not in forced:
            row = {"variant": v, "status": "skipped", "reason": CPU_PLANNED_REASON}
        elif s.budget_s is not None and time.perf_counter() - start > s.budget_s:
            row = {"variant": v, "status": "skipped",
                   "reason": f"not started: the {s.budget_s:g} s budget was spent"}
        else:
            try:
                row = run_variant(v, s, patch)
            except Skip as e:
                row = {"variant": v, "status": "skipped", "reason": str(e)}
                _peak_reset(s.device)
            except Exception as e:  # recorded with the reason; the other variants still run
                # a peer that cannot run here is unavailable, not speedlight's failure
                row = {"variant": v, "status": "error" if v in OURS else "unavailable",
                       "reason": f"{type(e).__name__}: {e}"}
                _peak_reset(s.device)
        row = {**common, **row, "implementation": row["variant"]}
        rows.append(row)
        ref = [r for r in rows[:-1] if r["variant"] == DEFAULT]
        agree(ref + [row], s.dtype)
        results.append_jsonl(out_path, [row])
        if on_row is not None:
            on_row(row)
    return rows


def step_failures(rows: Sequence[dict]) -> list[str]:
    """What makes the run fail: hf or a speedlight variant that errored (a peer that cannot
    run is recorded as unavailable), a loss curve off the hf one."""
    out = [f"{r['variant']}: {r.get('reason')}" for r in rows if r["status"] == "error"]
    out += [f"{r['variant']}: loss differs from hf by up to {100 * r['loss_max_rel_diff']:.3g}% "
            f"(tolerance {100 * r['loss_tolerance']:.3g}%)"
            + (f"; {r['loss_note']}" if r.get("loss_note") else "")
            for r in rows if r.get("loss_agrees") is False]
    return out


# --- display and chart ------------------------------------------------------------------------

def step_table(rows: Sequence[dict]):
    from rich.table import Table

    from speedlight.bench.display import NOT_REPRESENTATIVE
    first = next((r for r in rows if r.get("model")), rows[0] if rows else {})
    title = (f"speedlight bench model: {first.get('model', '?')}, {first.get('dtype')}, "
             f"batch {first.get('batch')} x {first.get('seq')} tokens, one training step "
             f"(forward, backward, AdamW) on {first.get('device')}")
    if rows and not rows[0].get("representative"):
        title += f" ({NOT_REPRESENTATIVE})"
    planned = [n for r in rows if r["variant"] == PLANNED for n in r.get("notes", [])
               if n.startswith("plan: ")]
    t = Table(title=title, caption=f"{PLANNED}: {planned[0][6:]}" if planned else None)
    for c in ("variant", "step (median)", "spread", "tokens/s", "vs hf", "peak memory",
              "vs hf mem", "loss (first -> last)", "max loss diff", "agrees"):
        t.add_column(c, justify="left" if c in ("variant", "agrees") else "right")
    for r in rows:
        if r["status"] != "ok":
            t.add_row(r["variant"], f"[yellow]{r['status']}[/]: {r.get('reason', '')}",
                      *[""] * 8)
            continue
        diff = r.get("loss_max_rel_diff")
        experts = r.get("experts")
        name = r["variant"] + (f" [dim](experts: {', '.join(experts['implementation'])})[/]"
                               if experts else "")
        t.add_row(name, f"{r['median_s'] * 1e3:.4g} ms", f"{100 * r['spread']:.1f}%",
                  f"{r['tokens_per_s']:.4g}", _x(r.get("speedup_vs_hf")),
                  _mib(r.get("peak_bytes")), _x(r.get("memory_vs_hf")),
                  f"{r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}",
                  "-" if diff is None else f"{100 * diff:.3g}%",
                  {True: "[green]yes[/]", False: "[red]NO[/]", None: "-"}[r.get("loss_agrees")])
    return t


def plan_candidates_table(rows: Sequence[dict]):
    """The plan behind speedlight-planned: every candidate of each kind with its time, ratio
    to the model's own, 95% interval, peak memory and verdict; None without one."""
    from rich.table import Table

    planned = next((r for r in rows if r["variant"] == PLANNED and r.get("candidates")), None)
    if planned is None:
        return None
    t = Table(title=f"{PLANNED}'s plan: every candidate (ratio: median time over the model's "
                    "own on one decoder layer's unit)")
    for c in ("kind", "candidate", "status", "median", "ratio", "95% interval", "peak", "why"):
        t.add_column(c)
    for kind, candidates in planned["candidates"].items():
        for c in candidates:
            t.add_row(kind, c["name"], c["status"],
                      "-" if c["median_s"] is None else f"{c['median_s'] * 1e3:.4g} ms",
                      _x(c["ratio"]), "-" if c["low"] is None
                      else f"[{c['low']:.3f}, {c['high']:.3f}]", _mib(c["peak"]), c["reason"])
    return t


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def chart(rows: Sequence[dict], path: str | Path) -> Path:
    """tokens/s, peak memory and the loss curves of the rows, side by side, in one PNG.
    RuntimeError when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("the chart needs matplotlib: pip install 'speedlight[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r["status"] == "ok"]
    fig, (ax_t, ax_m, ax_l) = plt.subplots(1, 3, figsize=(15, 4.2))
    names = [r["variant"] for r in ok]
    ax_t.bar(names, [r["tokens_per_s"] for r in ok], color="tab:blue")
    ax_t.set_ylabel("tokens/s")
    ax_t.set_title("throughput (median step)")
    peaks = [r.get("peak_bytes") for r in ok]
    if any(p is not None for p in peaks):
        ax_m.bar(names, [(p or 0) / 2 ** 30 for p in peaks], color="tab:orange")
        ax_m.set_ylabel("GiB")
    else:
        ax_m.text(0.5, 0.5, "peak memory: n/a on a CPU", ha="center", va="center",
                  transform=ax_m.transAxes)
        ax_m.set_axis_off()
    ax_m.set_title("peak memory")
    for r in ok:
        ax_l.plot(range(1, len(r["losses"]) + 1), r["losses"], marker="o", label=r["variant"])
    ax_l.set_xlabel("step")
    ax_l.set_ylabel("loss")
    ax_l.set_title("loss curve")
    ax_l.legend()
    for ax in (ax_t, ax_m):
        ax.tick_params(axis="x", rotation=20)
    first = ok[0] if ok else (rows[0] if rows else {})
    title = (f"{first.get('model', '?')} training step, {first.get('dtype')}, batch "
             f"{first.get('batch')} x {first.get('seq')}, {first.get('device')}")
    if rows and not rows[0].get("representative"):
        title += ": CPU, NOT representative"
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
