"""The report's real-size projection: on a machine without a GPU, the measured run is a
small model; this stage adds the real configuration of its family (by default Llama-3-8B)
at 4096 tokens, projected onto several GPUs (`speedlight profile --project --targets`)."""

from __future__ import annotations

from speedlight import shapes

DEFAULT_FAMILY = "llama-3-8b"
TARGETS = "h100-sxm,h200,b200"
TOKENS = 4096


def family_of(model: str | None, model_type: str | None) -> str:
    """The shapes.MODELS name of the measured model's family: the name itself, else the
    first real configuration with its Hugging Face model type, else Llama-3-8B."""
    if model in shapes.MODELS:
        return model
    for m in shapes.MODELS.values():
        if model_type and m.hf_model_type == model_type:
            return m.name
    return DEFAULT_FAMILY


def project_family(name: str, *, train: bool, target, targets: str = TARGETS) -> dict:
    """`speedlight profile --project --targets` on the family's real size: floors on the
    report's `target` (a speedlight.target.Target), compared with it across `targets`."""
    from speedlight.patching import apply_kinds
    from speedlight.profile.project_command import ProjectionRequest, projected_profile

    keys = [k for k in targets.split(",") if k]
    keys += [] if target.sku.key in keys else [target.sku.key]
    request = ProjectionRequest(model=name, batch=1, seq=TOKENS, train=train, size="full",
                                targets=",".join(keys))
    return projected_profile(request, target, patch=apply_kinds)
