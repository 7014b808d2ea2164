"""torch.compile of speedlight's custom ops gives eager's outputs and gradients, checked
on every torch CI tests and on the GPU machines.

Why a check of its own: torch 2.11 compiles some graphs of autograd.Function and custom
ops to wrong outputs without a word (pytorch/pytorch#180642). speedlight's ops are
torch.library custom ops (speedlight/ops/registration.py), and an op whose forward writes
over an input is an autograd.Function around two of them (cross_entropy's
inplace_backward). Each scenario runs its function compiled (fullgraph) and eager on the
same inputs: training (outputs, then the gradients of every input and parameter), or
without gradients (the `_infer` ops). The compiler's graphs are read for the speedlight
ops they hold (recording_backend); together the scenarios CI runs hold every custom op
the registry built (tests/test_compile_equal.py).

Where CI runs them, on the CPU with backend aot_eager (the graphs inductor is handed,
without its C++ compiles), inside tests that already compile what they need:
  llama-train, phi3-train   tests/patching/test_compile.py, compiled whole over its three
                            forms of input
  contract-<op>             tests/ops/test_contract.py's compile check (aot_eager and
                            inductor), each op on its example case between two other ops
  ops-train, ops-infer      tests/test_compile_equal.py
scripts/gpu/compile_equal.py runs GPU_SCENARIOS on a GPU under aot_eager and inductor.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

# fp32 throughout: compiled and eager run the same kernels; what the compiler adds around
# them (inductor's fusions) moves an fp32 value by a rounding or two
TOL = dict(rtol=2e-4, atol=2e-5)

# the kinds each model scenario patches (apply_kinds' keywords; none: every kind as by
# default). Phi-3's MLP (gate_up_proj) as one gated GEMM and its loss from the logits: the
# two paths the default kinds do not take
MODEL_KINDS = {"llama": {}, "phi3": dict(mlp="fused", linear_cross_entropy=False),
               "qwen2_moe": dict(mlp="fused", linear_cross_entropy=False,
                                 norm_in_place=False)}
# each built-in op -> the registration its public function calls on the contract's example
# (swiglu and geglu are one registration, glu)
CONTRACT_OPS = {"rms_norm": "rms_norm", "softmax": "softmax", "rope": "rope",
                "cross_entropy": "cross_entropy", "layer_norm": "layer_norm",
                "add_rms_norm": "add_rms_norm", "swiglu": "glu", "geglu": "glu",
                "matmul": "matmul", "gated_matmul": "gated_matmul", "attention": "attention",
                "linear_cross_entropy": "linear_cross_entropy",
                "grouped_matmul": "grouped_matmul", "moe_experts": "moe_experts"}
# the ops each op scenario calls (name, or name/variant -> options) on its contract
# example: in training, the variants no other scenario trains (cross_entropy in place,
# linear_cross_entropy's recompute); without gradients, every op that has an inference
# op, each variant once
TRAINED_OPS = {"cross_entropy/in_place": {"inplace_backward": True},
               "linear_cross_entropy/recompute": {"reduction": "none"}}
INFERRED_OPS = {"rms_norm": {}, "rms_norm/in_place": {"in_place": True}, "add_rms_norm": {},
                "add_rms_norm/in_place": {"in_place": True}, "cross_entropy": {},
                "linear_cross_entropy": {}, "layer_norm": {}, "matmul": {},
                "gated_matmul": {}, "grouped_matmul": {}, "moe_experts": {}}

_ATTENTION_ROPE = {"attention_fwd", "attention_bwd", "rope_fwd", "rope_bwd"}
_IN_PLACE_NORMS = {"rms_norm_inplace_fwd", "rms_norm_inplace_bwd", "add_rms_norm_inplace_fwd",
                   "add_rms_norm_inplace_bwd"}
# scenario -> the custom ops (torch.ops.speedlight.*) its compiled graphs must hold
HOLDS = {
    # norms whose backward runs in place, the residual add fused with the next norm,
    # SwiGLU, RoPE, attention, the loss from the hidden states
    "llama-train": _ATTENTION_ROPE | _IN_PLACE_NORMS | {
        "glu_fwd", "glu_bwd", "linear_cross_entropy_fwd", "linear_cross_entropy_bwd"},
    "phi3-train": _ATTENTION_ROPE | _IN_PLACE_NORMS | {
        "gated_matmul_fwd", "gated_matmul_bwd", "cross_entropy_fwd", "cross_entropy_bwd"},
    # routed experts and a shared expert (on a GPU: the CPU trains moe_experts alone)
    "qwen2_moe-train": _ATTENTION_ROPE | {
        "rms_norm_fwd", "rms_norm_bwd", "add_rms_norm_fwd", "add_rms_norm_bwd",
        "moe_experts_fwd", "moe_experts_bwd", "gated_matmul_fwd", "gated_matmul_bwd",
        "cross_entropy_fwd", "cross_entropy_bwd"},
    **{f"contract-{op}": {f"{reg}_fwd", f"{reg}_bwd"} for op, reg in CONTRACT_OPS.items()},
    # every op of the contract in one function (on a GPU: the CPU runs them one by one)
    "registry-train": {f"{reg}_{d}" for reg in CONTRACT_OPS.values() for d in ("fwd", "bwd")},
    "ops-train": {"cross_entropy_inplace_fwd", "cross_entropy_inplace_bwd",
                  "linear_cross_entropy_recompute_fwd",
                  "linear_cross_entropy_recompute_bwd"},
    "ops-infer": {"rms_norm_infer", "rms_norm_inplace_infer", "add_rms_norm_infer",
                  "add_rms_norm_inplace_infer", "cross_entropy_infer",
                  "linear_cross_entropy_infer", "layer_norm_infer", "matmul_infer",
                  "gated_matmul_infer", "grouped_matmul_infer", "moe_experts_infer"},
}
SCENARIOS = tuple(HOLDS)
CI_SCENARIOS = ("llama-train", "phi3-train", *(f"contract-{op}" for op in CONTRACT_OPS),
                "ops-train", "ops-infer")
GPU_SCENARIOS = ("llama-train", "phi3-train", "qwen2_moe-train", "registry-train",
                 "ops-train", "ops-infer")


def registered_custom_ops() -> set[str]:
    """Every custom op register_op built in the speedlight namespace (forward, backward
    and inference ops), by name."""
    from speedlight import registry
    from speedlight.ops import registration

    registry.builtin_specs()  # imports every op module, which registers its ops
    names = set()
    for op in registration.registered_ops():
        for custom in (op.forward_op, op.backward_op, op.inference_op):
            if custom is not None:
                namespace, name = custom._qualname.split("::")
                if namespace == registration.NAMESPACE:
                    names.add(name)
    return names


# --- what the compiler's graphs hold ----------------------------------------------------------

def speedlight_ops(gm: torch.fx.GraphModule) -> set[str]:
    """The speedlight custom ops a graph calls: as a node's target, or as the op a
    higher-order node wraps (auto_functionalized names a mutating op first)."""
    found = set()
    for node in gm.graph.nodes:
        for target in (node.target, *node.args):
            if isinstance(target, torch._ops.OpOverload) and target.namespace == "speedlight":
                found.add(target._opname)
    for child in gm.children():
        if isinstance(child, torch.fx.GraphModule):
            found |= speedlight_ops(child)
    return found


def recording_backend(name: str, seen: set[str]):
    """A torch.compile backend that compiles as `name` ("aot_eager" or "inductor") and adds
    to `seen` the speedlight ops of each graph AOT autograd hands its compiler (forward,
    backward and inference graphs)."""
    if name == "aot_eager":
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.aot_autograd import make_boxed_func

        def record(gm, example_inputs):
            seen.update(speedlight_ops(gm))
            return make_boxed_func(gm.forward)

        return aot_autograd(fw_compiler=record, bw_compiler=record, inference_compiler=record)
    if name == "inductor":
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner(gm, example_inputs, *args, **kwargs):
            seen.update(speedlight_ops(gm))
            return compile_fx_inner(gm, example_inputs, *args, **kwargs)

        def compile_recording(gm, example_inputs):
            # a graph AOT autograd's cache already holds (from an earlier test of the run,
            # or an earlier run) would be served without reaching `inner`: nothing recorded
            with torch._functorch.config.patch(enable_autograd_cache=False), \
                    torch._inductor.config.patch(fx_graph_cache=False):
                return compile_fx(gm, example_inputs, inner_compile=inner)

        return compile_recording
    raise ValueError(f"backend must be 'aot_eager' or 'inductor', got {name!r}")


# --- the scenarios ----------------------------------------------------------------------------
# Each builds (module, call, leaves): call(m) runs m, the module or its compiled form, and
# returns its floating outputs; leaves are what the gradients are taken of.

def _patched(family: str, device, **kinds):
    from speedlight.patching import PatchWarning, apply_kinds
    from tests.patching.tiny_models import batch, build, vocab

    model = build(family).to(device)
    with warnings.catch_warnings():  # a kind a family keeps, or an expert's fused MLP, says so
        warnings.simplefilter("ignore", PatchWarning)
        apply_kinds(model, plan=None, **kinds)
    ids, labels = batch(vocab(model))
    args = dict(input_ids=ids.to(device), labels=labels.to(device))

    def call(m):
        out = m(**args)
        return [out.loss] + ([out.logits] if out.logits is not None else [])

    return model, call, list(model.parameters())


def _ops(calls: dict, device):
    """One function calling each op of `calls` (name, or name/variant -> options) on its
    example case of the contract tests, the op's first differentiable input made inside
    the function (cross_entropy's inplace_backward writes over its logits, which must not
    be a leaf)."""
    from speedlight import registry
    from tests.ops.contract import example

    specs = {key: registry.builtin_spec(key.split("/")[0]) for key in calls}
    inputs = {key: spec.make_inputs(example(spec), device) for key, spec in specs.items()}
    leaves = []
    for key, spec in specs.items():
        for name in spec.grad_inputs:
            if isinstance(inputs[key].get(name), torch.Tensor):
                inputs[key][name] = inputs[key][name].detach().requires_grad_()
                leaves.append(inputs[key][name])

    def ops():
        outs = []
        for key, spec in specs.items():
            args = dict(inputs[key], **calls[key])
            first = spec.grad_inputs[0]
            args[first] = args[first] * 2.0
            out = spec.impl(**args)
            outs += [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                     if isinstance(o, torch.Tensor) and o.is_floating_point()]
        return outs

    return ops, lambda m: m(), leaves


def _build(scenario: str, device):
    what, _ = scenario.rsplit("-", 1)
    if what in MODEL_KINDS:
        return _patched(what, device, **MODEL_KINDS[what])
    if scenario.startswith("contract-") and scenario[len("contract-"):] in CONTRACT_OPS:
        return _ops({scenario[len("contract-"):]: {}}, device)
    if scenario == "registry-train":
        return _ops({op: {} for op in CONTRACT_OPS}, device)
    if scenario == "ops-train":
        return _ops(TRAINED_OPS, device)
    if scenario == "ops-infer":
        return _ops(INFERRED_OPS, device)
    raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")


@dataclass
class Outcome:
    """One scenario under one backend: what its compiled graphs held and how far the
    compiled outputs and gradients were from eager's."""

    scenario: str
    backend: str
    ops: set[str] = field(default_factory=set)
    mismatch: str = ""  # the first output or gradient outside TOL, "" when all agree
    max_abs_diff: float = 0.0
    seconds: float = 0.0

    @property
    def missing(self) -> set[str]:
        return HOLDS[self.scenario] - self.ops

    @property
    def ok(self) -> bool:
        return not self.mismatch and not self.missing

    def row(self) -> dict:
        return {"scenario": self.scenario, "backend": self.backend,
                "status": "pass" if self.ok else "fail", "ops": sorted(self.ops),
                "missing_ops": sorted(self.missing), "mismatch": self.mismatch,
                "max_abs_diff": self.max_abs_diff, "seconds": round(self.seconds, 3)}


def _values(call, module, leaves, train: bool) -> list[torch.Tensor | None]:
    """The outputs, then (training) the gradient of a loss over them for every leaf."""
    if not train:
        with torch.no_grad():
            return [o.detach() for o in call(module)]
    outs = call(module)
    loss = sum(o.float().pow(2).mean() for o in outs if o.requires_grad)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [o.detach() for o in outs] + list(grads)


def compare(got: list, want: list, outcome: Outcome) -> None:
    """Record in `outcome` the largest difference and the first value outside TOL."""
    if len(got) != len(want):
        outcome.mismatch = f"{len(got)} values compiled, {len(want)} eager"
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            if (g is None) != (w is None):
                outcome.mismatch = outcome.mismatch or f"value {i}: None in one run only"
            continue
        if g.numel():
            diff = (g.double() - w.double()).abs().nan_to_num(0.0).max()
            outcome.max_abs_diff = max(outcome.max_abs_diff, float(diff))
        try:
            torch.testing.assert_close(g, w, **TOL)
        except AssertionError as e:
            outcome.mismatch = outcome.mismatch or f"value {i}: {str(e).splitlines()[0]}"


def check(scenario: str, backend: str, device="cpu") -> Outcome:
    """Run `scenario` compiled with `backend` (recording its ops), then eager, and compare
    every output and gradient."""
    start = time.perf_counter()
    module, call, leaves = _build(scenario, torch.device(device))
    train = scenario.endswith("-train")
    outcome = Outcome(scenario, backend)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True,
                             backend=recording_backend(backend, outcome.ops))
    got = _values(call, compiled, leaves, train)
    torch._dynamo.reset()
    compare(got, _values(call, module, leaves, train), outcome)
    outcome.seconds = time.perf_counter() - start
    return outcome
