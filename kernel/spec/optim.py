"""The optimiser: Adam's settings, as PyTRIO's AdamParams takes them."""

from __future__ import annotations

from pydantic import Field

from kernel.spec.base import SpecModel


class OptimSpec(SpecModel):
    """AdamW parameters, passed to the backend as PyTRIO's AdamParams."""

    learning_rate: float = Field(
        4e-5,
        gt=0.0,
        le=1.0,
        description="The reference's 4e-5 (a 4B model's LoRA). Not given, on the local "
        "backend, a built-in preset student takes one it learns with (tiny presets 1e-3, "
        "arithmetic presets 3e-3).",
    )
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="Adam's first-moment decay.")
    beta2: float = Field(
        0.95, ge=0.0, lt=1.0, description="Adam's second-moment decay (the reference's 0.95)."
    )
    eps: float = Field(
        1e-12, gt=0.0, le=1.0, description="Added to Adam's denominator (the reference's)."
    )
    weight_decay: float = Field(
        0.0, ge=0.0, le=1.0, description="Decoupled (AdamW) weight decay of the LoRA weights."
    )
    grad_clip_norm: float = Field(0.0, ge=0.0, description="0 = no clipping.")
