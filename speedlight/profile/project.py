"""Project a model's step at its real size onto a GPU, computing nothing.

The model is built on fake tensors (torch's FakeTensorMode: shapes, dtypes and strides,
no data), so an 8B model costs no memory, and its step (forward; for training also the
backward and the optimizer, by the recipe) runs under the same recorder the measured
profile uses: every aten op with its shapes, dtypes, strides, module, autograd node and
the tensors autograd saved. The ops then get the same FLOPs and bytes (costs.py), floors on
the target (roofline.py), aggregates, memory from tensor lifetimes and fusion advice as a
measured profile. Every time is a projected floor: max(FLOPs / peak, bytes / bandwidth)
per op, never a step time.

Which dispatch is taken (`DISPATCH_NOTE`): a CPU-only torch can make fake CUDA tensors,
but the autograd engine aborts the process on the first node it records for one (it
needs a CUDA device guard), so the fake tensors live on the CPU device and the two places
where a GPU run dispatches differently are routed as a GPU run would take them:
- scaled_dot_product_attention goes to the CUDA kernel torch's selection rules pick for
  the target (flash, else memory-efficient, else the math decomposition; see
  `sdpa_backend`), not to the CPU's flash_attention_for_cpu;
- the optimizer runs torch's multi-tensor (foreach) AdamW, torch's default for CUDA
  parameters.
With `dispatch="here"` neither is routed: the op list is the one this machine's torch
runs, which is what the measured profile records (the test comparing the two uses it).

Hugging Face's masks read one value a fake tensor does not have (whether position ids
pack several sequences into a row); the projection answers it from its own inputs (one
sequence per row, as in the measured run) so the step keeps SDPA's is_causal path.
MoE routing depends on data: the projection assumes uniform routing (stated in the notes).
An experts module that would run Hugging Face's per-expert loop, whose `nonzero` a fake
tensor cannot answer, runs the loop's ops at the rows uniform routing gives each expert
(moe_loop.py), so the expert GEMMs are costed at tokens x k rows in all.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode

from speedlight import target as target_mod
from speedlight.profile import moe_loop, roofline
from speedlight.profile.capture import OpRecorder, StepCapture
from speedlight.profile.memory import LiveMemory

DISPATCH_NOTE = ("fake tensors on the CPU device (a CPU-only torch cannot record autograd "
                 "nodes for fake CUDA tensors); scaled_dot_product_attention routed to the CUDA "
                 "kernel torch would pick on the target, optimizer as torch's CUDA default "
                 "(foreach)")
HERE_NOTE = "fake tensors dispatched as this machine's torch dispatches (no GPU routing)"


# ---------------------------------------------------------------------------------------
# training recipes
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipe:
    """How a training step keeps its numbers: the dtype of the parameters (and so of the
    gradients and activations), of AdamW's two moments, and whether an fp32 master copy
    of the weights is kept."""

    name: str
    params: torch.dtype
    states: torch.dtype
    master: bool
    text: str

    def bytes_per_parameter(self) -> dict[str, int]:
        p = self.params.itemsize
        return {"parameters": p, "gradients": p, "optimizer_state": 2 * self.states.itemsize
                + (4 if self.master else 0)}


RECIPES = {r.name: r for r in [
    Recipe("bf16", torch.bfloat16, torch.float32, False,
           "bf16 parameters and gradients; AdamW's two moments in fp32, one fused update "
           "kernel rounding into the bf16 weights (12 B per parameter)"),
    Recipe("bf16-master", torch.bfloat16, torch.float32, True,
           "bf16 parameters and gradients; an fp32 master copy of the weights and AdamW's "
           "moments in fp32 (mixed precision as Megatron and FSDP keep it; 16 B per parameter)"),
    Recipe("bf16-pure", torch.bfloat16, torch.bfloat16, False,
           "everything in bf16, torch.optim.AdamW on the bf16 parameters (8 B per parameter)"),
    Recipe("fp32", torch.float32, torch.float32, False,
           "everything in fp32, torch.optim.AdamW (16 B per parameter)"),
]}
DEFAULT_RECIPE = "bf16"


class Optimizer:
    """AdamW by a recipe, over fake (or real) parameters. Where the moments' dtype is the
    parameters' (bf16-pure, fp32) it is torch.optim.AdamW itself. With fp32 moments beside
    bf16 weights torch's kernels refuse the mix, and trainers run one fused multi-tensor
    kernel (Transformer Engine's FusedAdam, Megatron's precision-aware optimizer): the
    step is recorded as torch's fused AdamW op over those tensors (read weights, gradients
    and both moments once, write weights and moments once), then, with a master copy, the
    fp32 weights copied into the bf16 ones. Fake tensors only: on real tensors torch's
    fused kernel would refuse the mixed dtypes."""

    def __init__(self, params, recipe: Recipe, lr: float = 1e-4, foreach: bool | None = True):
        self.params = [p for p in params if p.requires_grad]
        self.recipe = recipe
        self.same_dtype = recipe.states == recipe.params and not recipe.master
        if self.same_dtype:
            self.inner = torch.optim.AdamW(self.params, lr=lr, foreach=foreach)
            for p in self.params:  # the state of a step after the first, as torch makes it
                self.inner.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32),
                                       "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                       "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            self.state_tensors = lambda: [v for st in self.inner.state.values()
                                          for v in st.values() if isinstance(v, torch.Tensor)]
            return
        self.lr = lr
        self.moments = [(torch.zeros_like(p, dtype=recipe.states),
                         torch.zeros_like(p, dtype=recipe.states)) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in self.params]
        self.masters = [p.detach().to(torch.float32) for p in self.params] if recipe.master else None

    @property
    def state(self) -> dict:
        """What LiveMemory reads as optimizer state (moments, steps, master weights)."""
        if self.same_dtype:
            return self.inner.state
        out = {}
        for i, p in enumerate(self.params):
            st = {"exp_avg": self.moments[i][0], "exp_avg_sq": self.moments[i][1], "step": self.steps[i]}
            if self.masters is not None:
                st["master"] = self.masters[i]
            out[p] = st
        return out

    def step(self) -> None:
        if self.same_dtype:
            self.inner.step()
            return
        with torch.no_grad():
            live = [i for i, p in enumerate(self.params) if p.grad is not None]
            weights = [self.masters[i] if self.masters is not None else self.params[i] for i in live]
            steps = [self.steps[i] for i in live]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(weights, [self.params[i].grad for i in live],
                                [self.moments[i][0] for i in live], [self.moments[i][1] for i in live],
                                [], steps, lr=self.lr, beta1=0.9, beta2=0.999, weight_decay=0.01,
                                eps=1e-8, amsgrad=False, maximize=False)
            if self.masters is not None:
                torch._foreach_copy_([self.params[i] for i in live], weights)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.same_dtype:
            self.inner.zero_grad(set_to_none=set_to_none)
            return
        for p in self.params:
            p.grad = None


# ---------------------------------------------------------------------------------------
# the GPU's dispatch of scaled_dot_product_attention
# ---------------------------------------------------------------------------------------

def sdpa_backend(q, k, v, attn_mask, dropout_p: float, is_causal: bool,
                 capability: tuple[int, int]) -> tuple[str, str]:
    """(backend, why) torch's CUDA selection picks for these inputs on a GPU of this
    compute capability: flash attention first (fp16/bf16, no explicit mask, equal head
    dims <= 256, causal only with equal query and key lengths, sm80+), else the
    memory-efficient kernel (masks and fp32 allowed; head dims a multiple of the alignment),
    else the math decomposition. Builds of torch that prefer cuDNN attention on sm90/sm100
    run the same FLOPs and compulsory bytes (one fused kernel per direction)."""
    d_qk, d_v = q.shape[-1], v.shape[-1]
    low = q.dtype in (torch.float16, torch.bfloat16)
    sm80 = capability >= (8, 0)
    gqa_ok = q.shape[1] % k.shape[1] == 0 and k.shape[1] == v.shape[1]
    reasons = []
    if not low:
        reasons.append(f"dtype {q.dtype} (flash needs fp16/bf16)")
    if attn_mask is not None:
        reasons.append("an explicit mask")
    if not (d_qk == d_v <= 256):
        reasons.append(f"head dims {d_qk}/{d_v}")
    if is_causal and q.shape[-2] != k.shape[-2]:
        reasons.append("causal with query length != key length")
    if not sm80:
        reasons.append(f"sm_{capability[0]}{capability[1]}")
    if not gqa_ok:
        reasons.append("heads not a multiple of the key/value heads")
    if not reasons:
        return "flash", "fp16/bf16, no mask, head dim <= 256"
    align = 8 if low else 4
    if d_qk % align == 0 and d_v % align == 0 and gqa_ok:
        return "efficient", "flash ruled out by " + ", ".join(reasons)
    return "math", "flash ruled out by " + ", ".join(reasons) + f"; efficient by head dims not a multiple of {align}"


class GpuDispatch(TorchFunctionMode):
    """Routes F.scaled_dot_product_attention to the CUDA kernel a GPU run takes (above
    autograd, so its backward is that kernel's backward), counting each choice."""

    def __init__(self, capability: tuple[int, int]):
        super().__init__()
        self.capability = capability
        self.choices: dict[tuple[str, str], int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            return self._sdpa(*args, **kwargs)
        return func(*args, **kwargs)

    def _sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
              scale=None, enable_gqa=False):
        backend, why = sdpa_backend(query, key, value, attn_mask, dropout_p, is_causal, self.capability)
        self.choices[backend, why] = self.choices.get((backend, why), 0) + 1
        aten = torch.ops.aten
        if backend == "flash":
            return aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if backend == "efficient":
            grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            if key.shape[1] != query.shape[1]:  # its backward wants the query's head count
                rep = query.shape[1] // key.shape[1]
                key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
            mask = attn_mask
            if mask is not None and mask.dtype == torch.bool:  # as torch converts it
                mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill_(~mask, float("-inf"))
            return aten._scaled_dot_product_efficient_attention(
                query, key, value, mask, grad, dropout_p, is_causal, scale=scale)[0]
        with self:  # math: torch's own decomposition, recorded op by op
            return torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                scale=scale, enable_gqa=enable_gqa)


@contextlib.contextmanager
def _one_sequence_per_row():
    """Hugging Face checks, by reading position ids, whether a row packs several sequences;
    a fake tensor has no values, so the check would keep an explicit mask. The projection's
    rows hold one sequence each (as the measured run's): the check's ops still run, its
    answer is that."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return

    def one_sequence(position_ids):
        packed = original(position_ids)  # fake: always a tensor, never read
        if packed is not None:
            (packed[:, -1] == 0).all()  # the check's ops, as the measured run has them
        return None

    with mock.patch.object(masking_utils, "find_packed_sequence_indices", one_sequence):
        yield


class _FakeRecorder(OpRecorder):
    """The measured profile's recorder; fake tensors answer metadata queries (prim.device,
    ...) through the dispatcher, which are not ops of the step."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "prim":
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


# ---------------------------------------------------------------------------------------
# the projected step
# ---------------------------------------------------------------------------------------

@dataclass
class Projection:
    capture: StepCapture
    dispatch: str  # "gpu" or "here"
    attention: list[dict]  # backend choices: backend, why, calls
    recipe: Recipe | None
    seconds: float  # wall time of the fake step
    experts_loops: int = 0  # experts modules whose Hugging Face loop ran at uniform routing
    experts_classes: frozenset = frozenset()  # the class names of its experts modules


def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def project_step(workload, *, train: bool, recipe: Recipe | None, capability=(9, 0),
                 dispatch: str = "gpu", mode=None) -> Projection:
    """Record one step of a workload whose model and inputs are fake tensors (made under
    `mode`), computing nothing."""
    if dispatch not in ("gpu", "here"):
        raise ValueError(f"dispatch must be 'gpu' or 'here', got {dispatch!r}")
    mode = mode or fake_mode()
    model = workload.model
    names = {id(m): (fqn, type(m).__name__) for fqn, m in model.named_modules()}
    param_owner = {}
    for fqn, m in model.named_modules():
        for p in m.parameters(recurse=False):
            param_owner.setdefault(id(p), (fqn, type(m).__name__))
    start = time.perf_counter()
    with mode:
        optimizer = None
        if train:
            recipe = recipe or RECIPES[DEFAULT_RECIPE]
            foreach = True if dispatch == "gpu" else None
            optimizer = Optimizer(model.parameters(), recipe, foreach=foreach)
        memory = LiveMemory(model, optimizer, workload.inputs, torch.device("cpu"))
        recorder = _FakeRecorder(names, param_owner, memory, timed=False)
        router = GpuDispatch(capability) if dispatch == "gpu" else contextlib.nullcontext()
        grad_hooks = [p.register_post_accumulate_grad_hook(memory.on_grad)
                      for p in model.parameters() if p.requires_grad] if train else []
        try:
            with _one_sequence_per_row(), moe_loop.projected_loops(model) as loops, router, \
                    recorder.tracking_modules(), recorder, \
                    torch.autograd.graph.saved_tensors_hooks(recorder.pack, recorder.unpack):
                memory.start()
                if train:
                    recorder.phase = "forward"
                    out = workload.call()
                    loss = workload.loss_fn(out)
                    del out
                    recorder.phase = "backward"
                    loss.backward()
                    recorder.phase = "optimizer"
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                else:
                    with torch.inference_mode():  # as the measured profile runs inference
                        recorder.phase = "forward"
                        workload.call()
                memory.stop()
        finally:
            for h in grad_hooks:
                h.remove()
    seconds = time.perf_counter() - start
    choices = [{"backend": b, "why": w, "calls": n}
               for (b, w), n in getattr(router, "choices", {}).items()]
    cap = StepCapture(ops=recorder.ops, calls=recorder.calls, device="projected",
                      step_times=[], recorded_steps=1, gpu=None, memory=memory.summary(), notes=[])
    return Projection(cap, dispatch, choices, recipe if train else None, seconds, loops,
                      frozenset(experts_classes(model)))


def put_floors(cap: StepCapture, target: target_mod.Target) -> None:
    """Each op's time is its floor on the target (what every aggregate then sums)."""
    from speedlight.profile.analyze import op_dtype

    for rec in cap.ops:
        if rec.cost is None:
            rec.times = [0.0]
            continue
        key = target_mod.peak_key(op_dtype(rec), tensor_core=rec.cost.tensor_core)
        rec.times = [roofline.floor_seconds(rec.cost, key, target.roof)]


def exact_state_bytes(model: torch.nn.Module, recipe: Recipe | None, train: bool) -> dict:
    """Parameter, gradient and optimizer bytes by arithmetic (every parameter's elements
    times the recipe's bytes), which the lifetimes the projection measured must equal."""
    params = [p for p in model.parameters()]
    n = sum(p.numel() for p in params)
    out = {"parameters": sum(p.numel() * p.element_size() for p in params), "elements": n}
    if train and recipe is not None:
        trainable = sum(p.numel() for p in params if p.requires_grad)
        out["gradients"] = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        steps = 4 * sum(1 for p in params if p.requires_grad)  # a float32 scalar per parameter
        out["optimizer_state"] = trainable * (2 * recipe.states.itemsize + (4 if recipe.master else 0)) + steps
    return out



# ---------------------------------------------------------------------------------------
# the projected profile document
# ---------------------------------------------------------------------------------------

def moe_note(experts: dict, loops: int) -> str:
    """What the projection assumed of a mixture of experts' routing, and how its experts ran."""
    from speedlight.workloads import moe

    note = (f"mixture of experts ({experts['experts']} experts, top-{experts['k']}; experts "
            f"run as {', '.join(experts['implementation'])}): routing depends on the data; the "
            f"projection assumes {moe.UNIFORM_ROUTING}; the expert GEMMs' FLOPs, 2 x tokens x k "
            f"x 3 x H x I forward, do not depend on the routing")
    if loops:
        note += (f"; the Hugging Face per-expert loop ({loops} modules) ran op for op at those "
                 f"rows, its nonzero as nonzero_static (its host syncs are not on the roof)")
    return note


def build_workload(spec: str | None, *, batch: int, seq: int, train: bool, recipe: Recipe,
                   dtype: torch.dtype | None, layers: int | None, seed: int,
                   overrides: dict | None, mode):
    """The model --model names, at its real size, on fake tensors made under `mode`."""
    from speedlight.workloads import models

    dtype = recipe.params if train else (dtype or torch.bfloat16)
    with mode:
        w = models.build(spec, batch=batch, seq=seq, train=train, dtype=dtype,
                         device=torch.device("cpu"), size="full", layers=layers, seed=seed,
                         overrides=overrides)
    return w


def expert_block(result: dict, classes: set[str]) -> dict | None:
    """The routed experts' part of a projected step (an analysis' by_class groups of the
    experts modules' classes, forward and backward): their floor, its share of the step's
    floor, the bound most of it is under, FLOPs and bytes; None without experts."""
    groups = [g for g in result["by_class"] if g["key"] in classes]
    if not groups:
        return None
    bounds: dict[str, float] = {}
    for g in groups:
        for b, t in g["time_by_bound_s"].items():
            bounds[b] = bounds.get(b, 0.0) + t
    floor = sum(g["floor_s"] for g in groups)
    total = result["summary"]["floor_s"]
    return {"classes": sorted(g["key"] for g in groups), "calls": sum(g["calls"] for g in groups),
            "floor_s": floor, "share": floor / total if total else None,
            "bound": max(bounds, key=lambda b: (bounds[b], b)),
            "flops": sum(g["flops"] for g in groups), "bytes": sum(g["bytes"] for g in groups)}


def experts_classes(model) -> set[str]:
    """The class names of a model's experts modules: those holding every expert's weights
    in 3-D gate_up_proj and down_proj parameters (transformers 5.x's, gpt-oss's too)."""
    return {type(m).__name__ for m in model.modules()
            if all(isinstance(getattr(m, n, None), torch.Tensor) and getattr(m, n).dim() == 3
                   for n in ("gate_up_proj", "down_proj"))}


def _moe_section(experts: dict | None, pj: Projection, result: dict, model) -> dict | bool:
    """projection.moe: the experts' summary and their block's part of the step; for experts
    in another layout (gpt-oss's) the block alone; False for a dense model."""
    block = expert_block(result, pj.experts_classes)
    if experts:
        return dict(experts, loops=pj.experts_loops, block=block)
    return {"block": block} if block else has_experts(model)


def has_experts(model) -> bool:
    cfg = getattr(model, "config", None)
    return any(getattr(cfg, k, None) for k in ("num_local_experts", "num_experts", "n_routed_experts"))


def analysis(pj: Projection, target: target_mod.Target, top: int = 25) -> dict:
    """The measured profile's analysis of the projected ops, their times being floors."""
    from speedlight.profile import analyze

    put_floors(pj.capture, target)
    return analyze.analyze(pj.capture, target, top=top)


def label_note(target: target_mod.Target) -> str:
    return (f"projected: every time is a floor on {target.sku.name}, max(FLOPs / peak, "
            f"bytes / bandwidth) per op from its {target.roof.source} ceilings, not a step time; "
            f"nothing was run on a GPU")


def projected_document(w, pj: Projection, target: target_mod.Target, *, train: bool, batch: int,
                       seq: int, seed: int, top: int, notes: list[str]) -> dict:
    """The profile document (schema.py) of a projection, labelled projected throughout,
    with a `projection` section saying how it was made."""
    from speedlight import results
    from speedlight.profile import advice, schema
    from speedlight.spec import dtype_name

    result = analysis(pj, target, top=max(top, 25))
    model_dtype = next((p.dtype for p in w.model.parameters()), torch.float32)
    notes = list(notes) + [n for n in w.notes if "scaled down" not in n]
    from speedlight.workloads import moe

    experts = moe.experts_summary(w.model)
    if experts is not None:
        notes.append(moe_note(experts, pj.experts_loops))
    elif has_experts(w.model):  # experts in another layout
        notes.append(f"mixture of experts: routing depends on the data; the projection "
                     f"assumes {moe.UNIFORM_ROUTING}")
    run = {"id": uuid.uuid4().hex[:12],
           "model": w.name, "mode": "train" if train else "infer", "batch": batch, "seq": seq,
           "dtype": dtype_name(model_dtype), "warmup": 0, "steps": 1, "device": "projected",
           "seed": seed}
    measured = {"time": "projected", "floors": "projected", "note": label_note(target)}
    doc = schema.document(
        environment=results.environment(torch.device("cpu")), run=run,
        model=dict(w.config, **{"class": type(w.model).__name__}),
        target=dict(target.to_json(), launch_s=roofline.LAUNCH_S),
        measured=measured, analysis=result, memory=pj.capture.memory,
        advice=advice.advise(result["rows"], pj.capture.calls, target.roof), notes=notes)
    doc["projection"] = {
        "label": "projected floor",
        "dispatch": pj.dispatch,
        "dispatch_note": DISPATCH_NOTE if pj.dispatch == "gpu" else HERE_NOTE,
        "attention": pj.attention,
        "recipe": ({"name": pj.recipe.name, "text": pj.recipe.text,
                    "bytes_per_parameter": pj.recipe.bytes_per_parameter()} if pj.recipe else None),
        "exact_bytes": exact_state_bytes(w.model, pj.recipe, train),
        "tokens": batch * seq,
        "tokens_per_s_at_floor": batch * seq / result["summary"]["floor_s"]
        if result["summary"]["floor_s"] else None,
        "moe": _moe_section(experts, pj, result, w.model),
        "seconds": round(pj.seconds, 2),
    }
    return doc
