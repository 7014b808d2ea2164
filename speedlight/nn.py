"""nn.Module wrappers of speedlight ops, subclassing the torch module each replaces, so the
constructor, parameters and state-dict stay the same."""

from __future__ import annotations

import math

import torch

from speedlight.ops._checks import check_bool, check_choice, check_tensor
from speedlight.ops.add_rms_norm import add_rms_norm, broadcast_residual
from speedlight.ops.attention import attention
from speedlight.ops.cross_entropy import check_options, cross_entropy
from speedlight.ops.geglu import APPROXIMATIONS, geglu
from speedlight.ops.glu import ACTIVATIONS, glu
from speedlight.ops.gated_matmul import gated_matmul
from speedlight.ops.layer_norm import layer_norm
from speedlight.ops.linear_cross_entropy import linear_cross_entropy
from speedlight.ops.matmul import matmul
from speedlight.ops.rms_norm import rms_norm
from speedlight.ops.rope import rope
from speedlight.ops.softmax import softmax
from speedlight.ops.swiglu import swiglu


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by speedlight's kernel.

    Same constructor and state-dict as torch.nn.RMSNorm; eps=None means
    torch.finfo(x.dtype).eps, as in torch. A multi-dim normalized_shape normalizes over
    the flattened trailing dims. in_place=True (keyword only): the backward writes dx over
    the gradient it receives; only where the output feeds no residual add (see
    speedlight.rms_norm).
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None, *,
                 in_place: bool = False):
        check_bool("elementwise_affine", elementwise_affine)
        check_bool("in_place", in_place)
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, min_dim=1)  # before torch.finfo, which needs a float dtype
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        flat = _rows_shape(x, self.normalized_shape)
        weight = self.weight.reshape(-1) if self.weight is not None else None
        return rms_norm(x.reshape(flat), weight, eps, in_place=self.in_place).reshape(x.shape)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", in_place=True" if self.in_place else "")


def _rows_shape(x: torch.Tensor, normalized_shape) -> tuple[int, ...]:
    """x's shape with the normalized trailing dims flattened into one (checked to match)."""
    dims = len(normalized_shape)
    if tuple(x.shape[-dims:]) != tuple(normalized_shape):
        raise ValueError(f"x's trailing dims {tuple(x.shape[-dims:])} do not match "
                         f"normalized_shape {tuple(normalized_shape)}")
    return (*x.shape[:-dims], math.prod(normalized_shape))


class Softmax(torch.nn.Softmax):
    """torch.nn.Softmax computed by speedlight's kernel (same constructor and state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim
        if dim is None:  # torch's legacy implicit-dim rule
            dim = 0 if x.dim() in (0, 1, 3) else 1
        return softmax(x, dim)


class ApplyRotary(torch.nn.Module):
    """Hugging Face's apply_rotary_pos_emb as a module, computed by speedlight.rope.

    No torch module computes RoPE, so this one subclasses torch.nn.Module; it holds no
    parameters or buffers (cos and sin come from the model's rotary embedding, as in HF).
    forward(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) -> (q_rot, k_rot) takes
    the arguments of apply_rotary_pos_emb; interleaved=True selects GPT-J's pairs.
    """

    def __init__(self, interleaved: bool = False):
        check_bool("interleaved", interleaved)
        super().__init__()
        self.interleaved = interleaved

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                position_ids: torch.Tensor | None = None,
                unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(q, k, cos, sin, position_ids, unsqueeze_dim, self.interleaved)

    def extra_repr(self) -> str:
        return f"interleaved={self.interleaved}"


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss computed by speedlight's kernel.

    Same constructor as torch's (ignore_index, reduction, label_smoothing, the legacy
    size_average/reduce), plus keyword-only z_loss (adds z_loss * logsumexp^2 per
    non-ignored token), softcap (softcap * tanh(logits / softcap) before the loss) and
    inplace_backward (see speedlight.cross_entropy). Inputs follow torch: [N, C] or [C], or
    [N, C, d1, ...] with the classes at dim 1 (read in place, not copied); integer class
    targets only. weight (per-class, [C]) is a buffer as in torch, with torch's semantics.
    A mean over no non-ignored target (or whose counted weights sum to 0) is 0, not
    torch's NaN.
    """

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0, *,
                 z_loss: float = 0.0, softcap: float | None = None,
                 inplace_backward: bool = False):
        super().__init__(weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        check_options(ignore_index, self.reduction, label_smoothing, z_loss, softcap)
        check_bool("inplace_backward", inplace_backward)
        self.z_loss = z_loss
        self.softcap = softcap
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if isinstance(input, torch.Tensor) and input.dim() > 2:
            input = input.movedim(1, -1)  # torch's [N, C, d1, ...]: classes at dim 1
        return cross_entropy(input, target, self.ignore_index, self.reduction,
                             self.label_smoothing, self.z_loss, self.softcap, weight=self.weight,
                             inplace_backward=self.inplace_backward)

    def extra_repr(self) -> str:
        extra = f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"
        if self.label_smoothing:
            extra += f", label_smoothing={self.label_smoothing}"
        if self.z_loss:
            extra += f", z_loss={self.z_loss}"
        if self.softcap is not None:
            extra += f", softcap={self.softcap}"
        return extra


class LinearCrossEntropyLoss(torch.nn.Module):
    """An lm_head's matmul and the cross-entropy of its logits without the logits:
    forward(hidden, weight, target, bias=None) -> speedlight.linear_cross_entropy(...).

    Holds only the loss's options (ignore_index, reduction, label_smoothing, z_loss,
    softcap, chunk_size, memory_budget, and class_weight, a buffer as torch's loss
    `weight`); the
    lm_head's weight and bias are passed in, so a model keeps its own lm_head (and its
    state-dict) unchanged.
    """

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, *, z_loss: float = 0.0,
                 softcap: float | None = None, chunk_size: int | None = None,
                 memory_budget: int | None = None, class_weight: torch.Tensor | None = None):
        super().__init__()
        check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.z_loss, self.softcap = label_smoothing, z_loss, softcap
        self.chunk_size, self.memory_budget = chunk_size, memory_budget
        self.register_buffer("class_weight", class_weight)

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear_cross_entropy(hidden, weight, target, bias,
                                    ignore_index=self.ignore_index, reduction=self.reduction,
                                    label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                                    softcap=self.softcap, class_weight=self.class_weight,
                                    chunk_size=self.chunk_size,
                                    memory_budget=self.memory_budget)

    def extra_repr(self) -> str:
        extra = f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"
        for name in ("label_smoothing", "z_loss", "softcap", "chunk_size", "memory_budget"):
            if getattr(self, name):
                extra += f", {name}={getattr(self, name)}"
        return extra


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by speedlight's kernel (same constructor, parameters and
    state-dict; elementwise_affine=False and bias=False as in torch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class AddRMSNorm(torch.nn.RMSNorm):
    """The residual add and RMSNorm of a pre-norm block in one kernel:
    forward(x, residual) -> (y, h) with h = x + residual and y = RMSNorm(h). The residual
    is checked and broadcast as speedlight.add_rms_norm does; residual=None (the first
    block, where the stream starts) gives (RMSNorm(x), x).

    Same constructor, parameters and state-dict as torch.nn.RMSNorm, so a model's norm
    weights load unchanged; eps=None means torch.finfo(x.dtype).eps, as in torch.
    offset=1.0 (keyword only) is Gemma's (1 + w) form, whose weight then starts at 0.
    in_place=True (keyword only): the backward writes over the gradient of y (see
    speedlight.add_rms_norm).
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None, *,
                 offset: float = 0.0, in_place: bool = False):
        check_bool("elementwise_affine", elementwise_affine)
        check_bool("in_place", in_place)
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        self.offset = float(offset)
        self.in_place = in_place
        if self.offset and self.weight is not None:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        if getattr(self, "offset", 0.0) and self.weight is not None:
            torch.nn.init.zeros_(self.weight)  # scale offset + 0 = 1
        else:
            super().reset_parameters()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, h) with h = x + residual and y = RMSNorm(h). residual=None means the residual
        stream starts here (a model's first block): nothing is added, h is x itself (the
        same tensor, not a copy) and y = RMSNorm(x)."""
        check_tensor("x", x, min_dim=1)  # before torch.finfo, which needs a float dtype
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        weight = self.weight.reshape(-1) if self.weight is not None else None
        if residual is None:  # the residual stream starts at x: no add, and h is x
            flat = _rows_shape(x, self.normalized_shape)
            y = rms_norm(x.reshape(flat), weight, eps, self.offset, in_place=self.in_place)
            return y.reshape(x.shape), x
        # checked and broadcast as add_rms_norm does, before the rows are flattened
        check_tensor("residual", residual)
        x, residual = broadcast_residual(x, residual)
        flat = _rows_shape(x, self.normalized_shape)
        y, h = add_rms_norm(x.reshape(flat), residual.reshape(flat), weight, eps, self.offset,
                            in_place=self.in_place)
        return y.view(x.shape), h.view(x.shape)

    def extra_repr(self) -> str:
        return (super().extra_repr() + (f", offset={self.offset}" if self.offset else "")
                + (", in_place=True" if self.in_place else ""))


class SwiGLU(torch.nn.Module):
    """silu(gate) * up; forward(gate, up=None), up=None taking gate as [..., 2 * I]
    (gate then up, as a fused gate_up projection writes them)."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        return swiglu(gate, up)


class GeGLU(torch.nn.Module):
    """gelu(gate) * up, approximate "tanh" (Gemma's gelu_pytorch_tanh) or "none" (exact);
    forward(gate, up=None) as SwiGLU's."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        check_choice("approximate", approximate, APPROXIMATIONS)
        self.approximate = approximate

    def forward(self, gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        return geglu(gate, up, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


# Hugging Face's activation names (transformers.activations.ACT2FN) -> GatedMLP's
HF_ACTIVATIONS = {
    "silu": "silu", "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # the same tanh formula, its constants arranged differently
    "gelu": "gelu", "gelu_python": "gelu",
}


class GatedMLP(torch.nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)), the MLP of Llama, Mistral, Qwen (silu)
    and Gemma (gelu_tanh), with speedlight's gated-unit kernel between the projections.

    The parameters are named as in Hugging Face's LlamaMLP / GemmaMLP (gate_proj, up_proj,
    down_proj; biases with bias=True, as mlp_bias), so their state-dicts load unchanged.
    activation: "silu", "gelu_tanh" or "gelu" (exact). gate_multiplier, down_multiplier:
    Falcon-H1's mlp_multipliers, down_proj(up * act(gate * gate_multiplier)) *
    down_multiplier, both folded into the gated-unit kernel (down_multiplier scales what
    down_proj reads, which is the same without a bias; with one it scales the output).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu",
                 bias: bool = False, device=None, dtype=None, *, gate_multiplier: float = 1.0,
                 down_multiplier: float = 1.0):
        super().__init__()
        check_choice("activation", activation, ACTIVATIONS)
        check_bool("bias", bias)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.activation = activation
        self.gate_multiplier, self.down_multiplier = float(gate_multiplier), float(down_multiplier)
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, **kw)

    @classmethod
    def from_config(cls, config, layer_idx: int | None = None, device=None,
                    dtype=None) -> "GatedMLP":
        """The GatedMLP of layer `layer_idx` of a Hugging Face config (Llama, Mistral,
        Qwen2/3, Gemma 1/2/3/4, Falcon-H1; a multimodal config's text config): hidden_size,
        intermediate_size (a per-layer list is indexed by layer_idx), hidden_activation
        (Gemma) or hidden_act, mlp_bias, Falcon-H1's mlp_multipliers ([gate, down]), and
        Gemma 4's use_double_wide_mlp, which doubles intermediate_size in the layers that
        reuse another layer's keys and values (the last num_kv_shared_layers); layer_idx
        is needed where the width depends on the layer."""
        get_text = getattr(config, "get_text_config", None)
        config = get_text() if callable(get_text) else config
        name = getattr(config, "hidden_activation", None) or config.hidden_act
        if name not in HF_ACTIVATIONS:
            raise ValueError(f"config's activation {name!r} has no gated kernel: expected one "
                             f"of {', '.join(HF_ACTIVATIONS)}")
        width = config.intermediate_size
        if isinstance(width, (list, tuple)):
            width = width[_layer(config, layer_idx, "intermediate_size is a per-layer list")]
        shared = getattr(config, "num_kv_shared_layers", 0) or 0
        if getattr(config, "use_double_wide_mlp", False) and shared:
            first_shared = config.num_hidden_layers - shared
            if _layer(config, layer_idx, "use_double_wide_mlp widens some layers") >= first_shared:
                width *= 2
        sparsity = getattr(config, "activation_sparsity_pattern", None)
        if sparsity and any(sparsity) and (layer_idx is None or sparsity[layer_idx]):
            raise ValueError("config's activation_sparsity_pattern (Gemma 3n) keeps the top "
                             "activations of a layer's gate; GatedMLP has no kernel for it")
        multipliers = getattr(config, "mlp_multipliers", None) or (1.0, 1.0)
        if len(multipliers) != 2:
            raise ValueError(f"config's mlp_multipliers must be [gate_multiplier, "
                             f"down_multiplier], got {multipliers!r}")
        return cls(config.hidden_size, width, HF_ACTIVATIONS[name],
                   bias=bool(getattr(config, "mlp_bias", False)), device=device, dtype=dtype,
                   gate_multiplier=multipliers[0], down_multiplier=multipliers[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        folded = self.down_proj.bias is None  # down_proj(y) * m == down_proj(y * m)
        y = glu(self.gate_proj(x), self.up_proj(x), self.activation, self.gate_multiplier,
                self.down_multiplier if folded else 1.0)
        out = self.down_proj(y)
        return out if folded or self.down_multiplier == 1.0 else out * self.down_multiplier

    def extra_repr(self) -> str:
        extra = f"activation={self.activation!r}"
        if self.gate_multiplier != 1.0 or self.down_multiplier != 1.0:
            extra += (f", gate_multiplier={self.gate_multiplier}, "
                      f"down_multiplier={self.down_multiplier}")
        return extra


def _layer(config, layer_idx: int | None, why: str) -> int:
    """layer_idx, checked against the config's layers; a ValueError saying why it is needed
    when None."""
    n = config.num_hidden_layers
    if layer_idx is None:
        raise ValueError(f"from_config needs layer_idx: the config's {why}")
    if not isinstance(layer_idx, int) or not 0 <= layer_idx < n:
        raise ValueError(f"layer_idx must be an int in [0, {n}), got {layer_idx!r}")
    return layer_idx


class Linear(torch.nn.Linear):
    """y = x @ W^T + b by speedlight's GEMM (bias fused in its epilogue), W read where it
    lies: the same constructor, parameters and state-dict as torch.nn.Linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return matmul(x, self.weight.t(), bias=self.bias)


class FusedGatedMLP(GatedMLP):
    """GatedMLP with both of its input projections in one kernel: down_proj(
    gated_matmul(x, gate_proj.weight, up_proj.weight)), the gated product written by the
    GEMM's epilogue so neither projection reaches memory. The parameters and state-dict
    are GatedMLP's (Hugging Face's gate_proj / up_proj / down_proj). No biases: the gated
    kernel has no bias epilogue (bias=True raises)."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu",
                 bias: bool = False, device=None, dtype=None, *, gate_multiplier: float = 1.0,
                 down_multiplier: float = 1.0):
        check_bool("bias", bias)
        if bias:
            raise ValueError("FusedGatedMLP has no bias epilogue in its gated kernel; use "
                             "GatedMLP for an MLP with biases (mlp_bias=True)")
        if gate_multiplier != 1.0 or down_multiplier != 1.0:
            raise ValueError("FusedGatedMLP's gated kernel has no gate or down multiplier "
                             "(Falcon-H1's mlp_multipliers); use GatedMLP, which folds them "
                             "into its gated unit")
        super().__init__(hidden_size, intermediate_size, activation, bias=False,
                         device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = gated_matmul(x, self.gate_proj.weight, self.up_proj.weight, self.activation)
        return matmul(h, self.down_proj.weight.t())


class Attention(torch.nn.Module):
    """Scaled dot-product attention over [batch, heads, seq, dim] q, k, v, computed by
    speedlight.attention (flash attention: no [seq, seq] matrix is stored).

    No torch module computes attention alone (torch.nn.MultiheadAttention owns the
    projections too), so this one subclasses torch.nn.Module and holds no parameters:
    the options are fixed at construction, the tensors come per call. GQA/MQA: k and v may
    have fewer heads than q (a divisor). forward(q, k, v, cu_seqlens_q=None,
    cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None) -> o in q's shape (and the
    fp32 log-sum-exp too with return_lse=True). check_seqlens=False skips the host read
    of packed cu_seqlens (CUDA graphs; see speedlight.attention).
    """

    def __init__(self, causal: bool = False, scale: float | None = None,
                 window: tuple[int, int] | None = None, softcap: float | None = None,
                 return_lse: bool = False, check_seqlens: bool = True):
        super().__init__()
        check_bool("causal", causal)
        check_bool("return_lse", return_lse)
        check_bool("check_seqlens", check_seqlens)
        self.causal, self.scale, self.window = causal, scale, window
        self.softcap, self.return_lse, self.check_seqlens = softcap, return_lse, check_seqlens

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cu_seqlens_q: torch.Tensor | None = None,
                cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                max_seqlen_k: int | None = None):
        return attention(q, k, v, causal=self.causal, scale=self.scale, window=self.window,
                         softcap=self.softcap, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, return_lse=self.return_lse,
                         check_seqlens=self.check_seqlens)

    def extra_repr(self) -> str:
        return (f"causal={self.causal}, scale={self.scale}, window={self.window}, "
                f"softcap={self.softcap}")
