"""A decoder layer's residual add and the norm that follows it, as one speedlight.add_rms_norm.

Hugging Face's decoder layers add the residual in PyTorch, then normalize the sum:

  pre_norm  (Llama and most):  h = residual + attn(...); residual = h
                               hidden_states = post_attention_layernorm(h)
  sandwich  (Gemma 2/3):       hidden_states = post_attention_layernorm(attn(...))
                               h = residual + hidden_states; residual = h
                               hidden_states = pre_feedforward_layernorm(h)

Those three statements become `hidden_states, residual = add_norm(self.<norm>, branch,
residual)`: one pass writing both the norm's output and the sum (which continues as the
residual). Nothing else of the layer is written here: the fused forward is the installed
class's own forward with that one statement rewritten (its AST, compiled against its
modeling module's globals, decorators included), so its signature, the keyword arguments
it passes to self_attn and mlp (an MoE block as the layer calls it), caches and return are
the installed transformers version's, whatever that version is. A forward that lacks the
expected statements (another transformers version, a family whose layer scales its branch)
is left alone, and the reason goes to the PatchReport.

The add before the next layer's input norm is not fused: it ends this layer's forward,
whose output is the layer's contract.
"""

from __future__ import annotations

import ast
import inspect

import torch

from speedlight.patching.recompile import SourceError, recompile

FORMS = ("pre_norm", "sandwich")

_HELPER = "_speedlight_add_norm"


class LayerFormError(Exception):
    """The installed layer's forward does not have the expected form; the message says why."""


def layer_modules(model: torch.nn.Module, family) -> list[tuple[str, torch.nn.Module]]:
    """The family's decoder layers: modules of its modeling module whose class name ends in
    DecoderLayer."""
    return [(path, m) for path, m in model.named_modules()
            if type(m).__name__.endswith("DecoderLayer") and type(m).__module__ == family.module]


# --- the check: the statements the form expects ---------------------------------------------

def _name(node, name: str | None = None) -> str | None:
    if isinstance(node, ast.Name) and (name is None or node.id == name):
        return node.id
    return None


def _assign(stmt) -> tuple[str, ast.expr] | None:
    """(target, value) of `target = value` with one plain name as target."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _name(stmt.targets[0]):
        return stmt.targets[0].id, stmt.value
    return None


def _self_call(node, arg: str) -> str | None:
    """X of `self.X(arg)`, a call with that one positional argument."""
    if (isinstance(node, ast.Call) and not node.keywords and len(node.args) == 1
            and _name(node.args[0], arg) and isinstance(node.func, ast.Attribute)
            and _name(node.func.value, "self")):
        return node.func.attr
    return None


def _site(body: list[ast.stmt], i: int, hidden: str) -> tuple[str, ast.expr, str] | None:
    """(residual name, branch expression, norm attribute) when body[i:i+3] reads
    `hidden = residual + branch; residual = hidden; hidden = self.<norm>(hidden)`."""
    if i + 3 > len(body):
        return None
    add, keep, norm = (_assign(s) for s in body[i:i + 3])
    if not (add and keep and norm) or add[0] != hidden or norm[0] != hidden:
        return None
    residual, kept = keep[0], keep[1]
    value = add[1]
    if not (_name(kept, hidden) and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)
            and _name(value.left, residual)) or residual == hidden:
        return None
    attr = _self_call(norm[1], hidden)
    return (residual, value.right, attr) if attr else None


def find_site(forward_def: ast.FunctionDef, form: str, layer: torch.nn.Module,
              norm_class: str) -> tuple[int, str, ast.expr, str]:
    """(index in the body, residual name, branch, norm attribute) of the one residual add
    followed by a norm that `form` expects in the layer's forward; LayerFormError saying
    what differs otherwise."""
    if form not in FORMS:
        raise ValueError(f"layer form must be one of {FORMS}, got {form!r}")
    params = forward_def.args.args
    if len(params) < 2:
        raise LayerFormError("its forward takes no hidden states")
    hidden = params[1].arg
    body = forward_def.body
    sites = [(i, *s) for i in range(len(body)) if (s := _site(body, i, hidden))
             and type(getattr(layer, s[2], None)).__name__ == norm_class]
    if len(sites) != 1:
        raise LayerFormError(
            f"its forward has {len(sites)} residual adds followed by a {norm_class} "
            f"(`{hidden} = residual + ...; residual = {hidden}; {hidden} = self.<norm>({hidden})`)"
            f", the {form} form has one")
    i, residual, branch, attr = sites[0]
    if form == "pre_norm":
        # the branch as it comes, or through the layer's dropout (Phi-3's resid_attn_dropout)
        through = _self_call(branch, hidden)
        if not (_name(branch, hidden) or (through and isinstance(getattr(layer, through, None),
                                                                  torch.nn.Dropout))):
            raise LayerFormError(
                f"it adds `{ast.unparse(branch)}` to the residual, not the attention output "
                f"as it comes (the pre_norm form)")
    else:  # sandwich: the branch is the output of its post-norm, the statement before
        before = _assign(body[i - 1]) if i > 0 else None
        post = _self_call(before[1], hidden) if before and before[0] == hidden else None
        if not (_name(branch, hidden) and post
                and type(getattr(layer, post, None)).__name__ == norm_class):
            raise LayerFormError("the residual add does not follow a post-norm of the branch "
                                 "(the sandwich form)")
    return i, residual, branch, attr


# --- the rewrite -------------------------------------------------------------------------------

_FUSED: dict[tuple, tuple] = {}  # (forward function, form, norm class) -> (maker, norm attr)


def _maker(cls: type, form: str, layer: torch.nn.Module, norm_class: str):
    """A function make(add_norm) -> the class's forward with its fusion site rewritten to
    call add_norm, decorated as the original (recompile.py); and the fused norm's
    attribute name."""
    forward = inspect.unwrap(cls.forward)
    key = (forward, form, norm_class)
    if key in _FUSED:
        return _FUSED[key]
    if _HELPER in forward.__code__.co_names:
        raise LayerFormError(f"{cls.__name__}.forward already uses the name {_HELPER}")

    def fuse(fdef: ast.FunctionDef) -> str:
        """Rewrite the site into `hidden, residual = helper(self.<norm>, branch, residual)`."""
        i, residual, branch, attr = find_site(fdef, form, layer, norm_class)
        hidden = fdef.args.args[1].arg
        fused = ast.parse(f"{hidden}, {residual} = {_HELPER}(self.{attr}, BRANCH, "
                          f"{residual})").body[0]
        fused.value.args[1] = branch
        fdef.body[i:i + 3] = [ast.copy_location(fused, fdef.body[i])]
        return attr

    try:
        maker, attr = recompile(cls.forward, (_HELPER,), fuse)
    except SourceError as e:
        raise LayerFormError(str(e)) from None
    _FUSED[key] = (maker, attr)
    return maker, attr


class AddNorm:
    """`hidden = residual + branch; residual = hidden; hidden = norm(hidden)` as one
    speedlight.add_rms_norm, by the norm's rules as speedlight's patched RMSNorm applies
    them: the family's offset (1 for Gemma's 1 + w), the norm's eps, and its output dtype
    ("promote": weight * x.to(dtype) promotes to the weight's dtype, as Llama's; "input":
    x's dtype). in_place: the backward writes over the norm output's gradient (only where
    that output feeds linear layers alone). Returns (norm output, sum)."""

    def __init__(self, offset: float, out: str, eps_attr: str, in_place: bool):
        from speedlight.ops.add_rms_norm import add_rms_norm
        self.offset, self.out, self.eps_attr, self.in_place = offset, out, eps_attr, in_place
        self.add_rms_norm = add_rms_norm  # looked up now, not inside a traced forward

    def __call__(self, norm: torch.nn.Module, branch: torch.Tensor, residual: torch.Tensor):
        if norm._forward_hooks or norm._forward_pre_hooks:  # hooks see the norm's own call
            h = residual + branch
            return norm(h), h
        dtype = torch.promote_types(branch.dtype, residual.dtype)  # as `residual + branch`
        weight = norm.weight if norm.weight.dtype == dtype else norm.weight.to(dtype)
        y, h = self.add_rms_norm(branch.to(dtype), residual.to(dtype), weight,
                            float(getattr(norm, self.eps_attr)), self.offset,
                            in_place=self.in_place)
        if self.out == "promote":
            y = y.to(torch.promote_types(dtype, norm.weight.dtype))
        return y, h


def fused_forward(layer: torch.nn.Module, family, *, in_place: bool):
    """(forward, norm attribute, AddNorm): the layer class's forward with its residual add
    and the following norm fused, for this layer; LayerFormError saying why not."""
    form = family.layer_form
    if form is None:
        raise LayerFormError(family.layer_note or "the family's layer has no fusable form")
    maker, attr = _maker(type(layer), form, layer, family.norm_class)
    norm = getattr(layer, attr)
    eps_attr = "variance_epsilon" if hasattr(norm, "variance_epsilon") else "eps"
    if not hasattr(norm, eps_attr) or not isinstance(getattr(norm, "weight", None), torch.Tensor):
        raise LayerFormError(f"self.{attr} has no weight and eps speedlight knows")
    add_norm = AddNorm(family.norm_offset, family.norm_out, eps_attr,
                       in_place and attr in family.in_place_norms)
    forward = maker(add_norm)
    original = inspect.signature(type(layer).forward)
    if inspect.signature(forward) != original:
        raise LayerFormError(f"the rewritten forward's signature {inspect.signature(forward)} "
                             f"differs from the installed {original}")
    return forward, attr, add_norm
