"""The input checks every public op function makes before any launch: each names the
argument, its shape, dtype and device, and what was expected."""

from __future__ import annotations

from typing import Iterable

import torch

from speedlight.runtime import describe

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_LIST = "float32, float16 or bfloat16"


def check_tensor(name: str, t, *, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES,
                 min_dim: int = 0, expected: str | None = None) -> None:
    """TypeError unless t is a dense tensor of one of `dtypes` with at least `min_dim` dims."""
    check_dense(name, t)
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        want = expected or (_DTYPE_LIST if dtypes == FLOAT_DTYPES else
                            " or ".join(str(d).replace("torch.", "") for d in dtypes))
        raise TypeError(f"{name} must be a {want} tensor, got {describe(t)}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dim(s), got {describe(t)}")


def check_dense(name: str, t) -> None:
    """TypeError unless t is a dense (strided, not nested) torch.Tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested:
        raise TypeError(f"{name} must be a dense tensor, got a nested tensor of {t.dim()} dims "
                        f"({t.dtype}); pad it (t.to_padded_tensor(0)) or run each component")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout "
                        f"{str(t.layout).replace('torch.', '')} of shape {tuple(t.shape)}; "
                        f"call .to_dense() first")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}: "
                             f"all tensors must be on one device")


def check_same_dtype(**tensors: torch.Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}: "
                            f"they must match")


def check_bool(name: str, value) -> None:
    """TypeError unless value is a bool: a flag given as "False", None, 1 or a tensor is
    refused, as torch's scaled_dot_product_attention refuses is_causal="False" (a
    non-empty string is truthy, so it would silently mean True)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {value!r} "
                        f"({type(value).__name__})")


def check_choice(name: str, value, choices: Iterable[str], *, optional: bool = False) -> None:
    """An enum option: TypeError unless value is a str (or None where `optional`),
    ValueError unless it is one of `choices`. The message lists the choices."""
    choices = tuple(choices)
    listed = ", ".join(map(repr, choices))
    want = f"{'None or ' if optional else ''}one of {listed}"
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {want}, got {value!r} ({type(value).__name__})")
    if value not in choices:
        raise ValueError(f"{name} must be {want}, got {value!r}")
