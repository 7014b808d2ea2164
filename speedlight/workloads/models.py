"""What `speedlight profile --model` runs: a model, its inputs and (for --train) its loss.

--model takes
- nothing: a small Llama-style causal LM (2 layers, hidden 256, vocab 2048) built from a
  transformers LlamaConfig with seeded random weights, so it runs anywhere in seconds;
- a name from speedlight.shapes.MODELS (llama-3-8b, gemma-2-9b, ...) or ARCHITECTURES
  (deepseek-v3, gpt-oss-20b): that family's architecture, scaled down (--size small: a few
  heads, 2 layers) or at its real widths and depth (--size full, which only makes sense on
  a GPU);
- a Hugging Face config.json: that causal LM, random weights;
- module:callable (or path/to/file.py:callable): your function returning (model, inputs)
  or (model, inputs, loss_fn). inputs is a dict of keyword arguments, a tuple of
  positional ones, or one tensor; loss_fn(outputs) -> scalar is used by --train (without
  one: outputs.loss when there is one, else the sum of the first output).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from speedlight import shapes

DEFAULT = "default"
# The built-in model: Llama's architecture at a size a CPU profiles in seconds.
DEFAULT_LLAMA = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                     vocab_size=2048, rms_norm_eps=1e-5, max_position_embeddings=4096,
                     tie_word_embeddings=False)


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


# Mixtures of experts --model builds by name beside shapes.MODELS (whose families enter
# every op's model suite; these two have attention speedlight does not run: DeepSeek-V3's
# latent attention, gpt-oss's sinks): each model's config.json fields ("full"; their rope
# scaling left at the config class's default) and the fields a scaled-down build changes
# ("small": a few heads and experts, a CPU's widths).
ARCHITECTURES: dict[str, dict] = {
    "deepseek-v3": {
        "source": _hf("deepseek-ai/DeepSeek-V3"),
        "full": dict(model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432,
                     moe_intermediate_size=2048, num_hidden_layers=61,
                     num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                     n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512,
                     q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                     qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
                     first_k_dense_replace=3, norm_topk_prob=True, rms_norm_eps=1e-6,
                     vocab_size=129280, max_position_embeddings=163840,
                     tie_word_embeddings=False),
        "small": dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                      num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
                      q_lora_rank=48, qk_rope_head_dim=16, v_head_dim=32, qk_nope_head_dim=16,
                      n_routed_experts=8, n_group=1, topk_group=1, num_experts_per_tok=2,
                      first_k_dense_replace=1, vocab_size=2048, max_position_embeddings=4096),
    },
    "gpt-oss-20b": {
        "source": _hf("openai/gpt-oss-20b"),
        "full": dict(model_type="gpt_oss", hidden_size=2880, intermediate_size=2880,
                     num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8,
                     head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                     vocab_size=201088, sliding_window=128, swiglu_limit=7.0,
                     rope_theta=150000.0, rms_norm_eps=1e-5, max_position_embeddings=131072,
                     tie_word_embeddings=False),
        "small": dict(hidden_size=128, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_local_experts=8,
                      num_experts_per_tok=2, vocab_size=2048, max_position_embeddings=4096),
    },
}


class ModelError(ValueError):
    """--model names nothing speedlight can build."""


@dataclass
class Workload:
    name: str
    model: torch.nn.Module
    inputs: Any
    loss_fn: Callable[[Any], torch.Tensor]
    config: dict = field(default_factory=dict)  # what was built, for the results
    notes: list[str] = field(default_factory=list)

    def call(self):
        if isinstance(self.inputs, dict):
            return self.model(**self.inputs)
        if isinstance(self.inputs, (tuple, list)):
            return self.model(*self.inputs)
        return self.model(self.inputs)


def default_loss(outputs) -> torch.Tensor:
    """outputs.loss if the model computed one, else the sum of its first tensor output."""
    loss = getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(outputs, torch.Tensor):
        return outputs if outputs.dim() == 0 else outputs.float().sum()
    first = outputs[0] if isinstance(outputs, (tuple, list)) else getattr(outputs, "logits", None)
    if not isinstance(first, torch.Tensor):
        raise ModelError("--train needs a loss: the model's outputs have no .loss and no "
                         "tensor to sum; return (model, inputs, loss_fn) from your callable")
    return first.float().sum()


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ModelError("building Hugging Face models needs transformers: "
                         "pip install 'speedlight[hf]'") from None
    return transformers


# the config field holding a mixture of experts' routed expert count, where not num_experts
_EXPERT_COUNT = {"mixtral": "num_local_experts", "granitemoe": "num_local_experts"}


def hf_kwargs(m: shapes.ModelConfig, layers: int, size: str, seq: int) -> dict:
    """transformers config arguments of a shapes.MODELS family, full or scaled down."""
    hidden, inter, heads, kv, head_dim, vocab = (m.hidden, m.intermediate, m.heads,
                                                 m.kv_heads, m.head_dim, m.vocab)
    if size == "small":
        group = heads // kv
        heads = min(heads, 4)
        kv = max(1, heads // group)
        head_dim = min(head_dim, 64)
        scale = hidden / (m.heads * m.head_dim)
        hidden = max(64, int(round(heads * head_dim * scale / 16)) * 16)
        inter = int(round(hidden * m.intermediate / m.hidden / 16)) * 16
        vocab = 2048
    positions = max(seq, 4096)
    # a smaller vocabulary must not keep special token ids past its end
    tokens = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None) if size == "small" else {}
    if m.hf_model_type in ("gpt2", "gptj"):
        kw = dict(n_embd=hidden, n_head=heads, n_layer=layers, n_inner=inter, vocab_size=vocab,
                  layer_norm_epsilon=m.norm_eps, n_positions=positions)
        if m.hf_model_type == "gptj":
            kw["rotary_dim"] = min(m.rotary_dim, head_dim)
        return dict(kw, **tokens)
    kw = dict(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
              num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
              rms_norm_eps=m.norm_eps, num_hidden_layers=layers,
              max_position_embeddings=positions)
    if m.experts:  # the family's names for the expert count, top-k and expert widths
        kw[_EXPERT_COUNT.get(m.hf_model_type, "num_experts")] = m.experts
        kw["num_experts_per_tok"] = m.experts_per_token
        if m.hf_model_type in ("qwen2_moe", "qwen3_moe"):
            kw["moe_intermediate_size"] = inter
        if m.shared_intermediate:
            kw["shared_expert_intermediate_size"] = m.shared_intermediate if size != "small" \
                else int(round(hidden * m.shared_intermediate / m.hidden / 16)) * 16
    if m.hf_model_type.startswith("gemma"):
        kw.update(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=head_dim,
                  sliding_window=positions, final_logit_softcapping=m.logit_softcap)
    return dict(kw, **tokens)


def _auto_class(transformers, config):
    """AutoModelForCausalLM, or the image-text class for a family whose language model is
    the decoder of an image-text model (Qwen2-VL), run on text alone."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and \
            hasattr(transformers, "AutoModelForImageTextToText"):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def _build_hf(config, dtype: torch.dtype, device: torch.device, seed: int):
    """Random weights (seeded), made on the device in the dtype: a full-size model is
    initialized there, not on the host first. A parameter the model makes in a dtype of its
    own (DeepSeek-V3's router weight stays float32) keeps it, as from_pretrained keeps it."""
    transformers = _transformers()
    torch.manual_seed(seed)
    with torch.device(device):
        model = _auto_class(transformers, config).from_config(config, dtype=dtype)
    if all(p.device == device for p in model.parameters()) and any(
            p.dtype == dtype for p in model.parameters()):
        return model  # made where it belongs (and fake tensors cannot be moved in place)
    return model.to(device=device, dtype=dtype)


def apply_overrides(cfg, overrides: dict | None, where: str):
    """Set Hugging Face config fields by their names there (`--vary num_key_value_heads=2`)."""
    for key, value in (overrides or {}).items():
        if not hasattr(cfg, key):
            raise ModelError(f"{where}: the {type(cfg).__name__} has no field {key!r}")
        try:
            setattr(cfg, key, value)
        except Exception as e:  # transformers' configs validate their fields' types
            raise ModelError(f"{where}: {key}={value!r} is refused by the "
                             f"{type(cfg).__name__}: {_first_line(e)}") from None
    check_heads(cfg, where)
    return cfg


def check_heads(cfg, where: str) -> None:
    """ModelError unless the attention heads split evenly: num_key_value_heads must divide
    num_attention_heads (each key/value head serves a whole group of query heads); a
    model built otherwise fails deep in transformers (a RecursionError, a shape error)."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = getattr(text, "num_attention_heads", None)
    kv = getattr(text, "num_key_value_heads", None)
    for name, value in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ModelError(f"{where}: {name} must be a positive int, got {value!r}")
    if heads and kv and heads % kv:
        raise ModelError(f"{where}: num_key_value_heads={kv} does not divide "
                         f"num_attention_heads={heads}: each key/value head serves a whole "
                         f"group of query heads")


def _first_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[:2]) or type(e).__name__


def _lm_workload(name: str, model, vocab: int, batch: int, seq: int, train: bool,
                 device: torch.device, seed: int, config: dict, notes=()) -> Workload:
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    # training keeps no KV cache; inference fills one, as a prefill does
    inputs = {"input_ids": ids, "labels": ids, "use_cache": False} if train else {"input_ids": ids}
    params = sum(p.numel() for p in model.parameters())
    config = dict(config, parameters=params, batch=batch, seq=seq)
    return Workload(name, model, inputs, default_loss, config, list(notes))


def _config_summary(cfg) -> dict:
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "n_embd", "n_layer", "n_head", "n_inner")
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg  # Qwen2-VL
    summary = {k: getattr(text, k) for k in keys if getattr(text, k, None) is not None}
    return dict(summary, model_type=cfg.model_type) if hasattr(cfg, "model_type") else summary


def build(spec: str | None, *, batch: int, seq: int, train: bool, dtype: torch.dtype,
          device: torch.device, size: str = "small", layers: int | None = None,
          seed: int = 0, overrides: dict | None = None) -> Workload:
    """The workload --model names (see the module docstring); ModelError when it names
    nothing speedlight can build."""
    if batch < 1 or seq < 1:
        raise ModelError(f"--batch and --seq must be at least 1, got {batch} and {seq}")
    if layers is not None and layers < 1:
        raise ModelError(f"--layers must be at least 1, got {layers}")
    spec = spec or DEFAULT
    if spec == DEFAULT:
        transformers = _transformers()
        kw = dict(DEFAULT_LLAMA, num_hidden_layers=layers or DEFAULT_LLAMA["num_hidden_layers"])
        cfg = apply_overrides(transformers.LlamaConfig(**kw), overrides, "--model default")
        model = _build_hf(cfg, dtype, device, seed)
        return _lm_workload("llama-tiny", model, cfg.vocab_size, batch, seq, train, device, seed,
                            dict(_config_summary(cfg), source="speedlight default (LlamaConfig, "
                                 "random weights)"))
    if spec in shapes.MODELS:
        m = shapes.MODELS[spec]
        depth = layers or (shapes.NUM_LAYERS[spec] if size == "full" else 2)
        transformers = _transformers()
        cfg = transformers.AutoConfig.for_model(m.hf_model_type, **hf_kwargs(m, depth, size, seq))
        cfg = apply_overrides(cfg, overrides, f"--model {spec}")
        notes = [] if size == "full" else [
            f"{spec} scaled down (--size small): its architecture at {depth} layers and small "
            f"widths; --size full builds the real widths (a GPU's job)"]
        model = _build_hf(cfg, dtype, device, seed)
        return _lm_workload(spec + ("" if size == "full" else "-scaled"), model,
                            cfg.get_text_config().vocab_size,
                            batch, seq, train, device, seed,
                            dict(_config_summary(cfg), source=m.source, size=size), notes)
    if spec in ARCHITECTURES:
        arch = ARCHITECTURES[spec]
        raw = dict(arch["full"], **(arch["small"] if size == "small" else {}))
        raw["num_hidden_layers"] = layers or (raw["num_hidden_layers"] if size == "full" else 2)
        transformers = _transformers()
        cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
        cfg = apply_overrides(cfg, overrides, f"--model {spec}")
        notes = [] if size == "full" else [
            f"{spec} scaled down (--size small): its architecture at "
            f"{cfg.num_hidden_layers} layers and small widths; --size full builds the real "
            f"widths (a GPU's job)"]
        model = _build_hf(cfg, dtype, device, seed)
        return _lm_workload(spec + ("" if size == "full" else "-scaled"), model,
                            cfg.get_text_config().vocab_size, batch, seq, train, device, seed,
                            dict(_config_summary(cfg), source=arch["source"], size=size),
                            notes)
    path = Path(spec)
    if spec.endswith(".json"):
        if not path.is_file():
            raise ModelError(f"--model {spec!r}: no such config file")
        transformers = _transformers()
        try:
            raw = json.loads(path.read_text())
            raw = {k: v for k, v in raw.items() if k not in ("architectures", "auto_map")}
            if layers:
                raw["num_hidden_layers"] = layers
            cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
            cfg = apply_overrides(cfg, overrides, f"--model {spec}")
        except ModelError:
            raise
        except (KeyError, ValueError, json.JSONDecodeError) as e:
            raise ModelError(f"--model {spec!r}: not a Hugging Face config.json with a "
                             f"model_type ({type(e).__name__}: {e})") from None
        except Exception as e:  # transformers' configs validate their fields' types
            raise ModelError(f"--model {spec!r}: the config is refused: "
                             f"{_first_line(e)}") from None
        model = _build_hf(cfg, dtype, device, seed)
        return _lm_workload(path.stem if path.stem != "config" else path.parent.name or "config",
                            model, cfg.get_text_config().vocab_size, batch, seq, train, device,
                            seed, dict(_config_summary(cfg), source=str(path)))
    if ":" in spec:
        return _from_callable(spec, train, dtype, device, seed)
    raise ModelError(f"--model {spec!r}: not a model name "
                     f"({', '.join([*shapes.MODELS, *ARCHITECTURES])}), a "
                     f"config.json file, or module:callable")


def _from_callable(spec: str, train: bool, dtype: torch.dtype, device: torch.device,
                   seed: int) -> Workload:
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            if not Path(target).is_file():
                raise ModelError(f"--model {spec!r}: no such file {target!r}")
            mod_spec = importlib.util.spec_from_file_location(f"speedlight_user_model_{abs(hash(target))}", target)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ImportError as e:
        raise ModelError(f"--model {spec!r}: cannot import {target!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ModelError(f"--model {spec!r}: {target!r} has no callable {attr!r}")
    torch.manual_seed(seed)
    got = fn()
    if not isinstance(got, tuple) or len(got) not in (2, 3) or not isinstance(got[0], torch.nn.Module):
        raise ModelError(f"--model {spec!r}: {attr}() must return (model, inputs) or "
                         f"(model, inputs, loss_fn) with model an nn.Module; got "
                         f"{type(got).__name__}")
    model, inputs = got[0], got[1]
    loss_fn = got[2] if len(got) == 3 else default_loss
    if not all(p.device == device for p in model.parameters()):  # (fake tensors cannot move)
        model = model.to(device)
    inputs = _to_device(inputs, device)
    params = sum(p.numel() for p in model.parameters())
    return Workload(attr, model, inputs, loss_fn,
                    {"source": spec, "class": type(model).__name__, "parameters": params})


def _to_device(x, device):
    if isinstance(x, torch.Tensor):
        return x if x.device == device else x.to(device)
    if isinstance(x, dict):
        return {k: _to_device(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to_device(v, device) for v in x)
    return x
