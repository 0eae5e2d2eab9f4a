"""How the student's completions are sampled."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernel.spec.base import SpecModel, field_error

MAX_TOKENS = 32_768


class SamplingSpec(SpecModel):
    max_tokens: int = Field(
        512,
        ge=1,
        le=MAX_TOKENS,
        description="Tokens a rollout may sample; one that reaches it is cut there (a long "
        "answer costs time on every step: the reference's 512 suits DeepMath).",
    )
    temperature: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="The student's sampling temperature for its rollouts (1 = its own "
        "distribution, what on-policy distillation corrects).",
    )
    top_p: float = Field(
        1.0, gt=0.0, le=1.0, description="Nucleus sampling: 1 = the whole distribution."
    )
    engine: Literal["local", "vllm"] = Field(
        "local",
        description="What samples the student's rollouts (local backend): local = the "
        "backend's own decoding loop; vllm = the vLLM server the operator names for the "
        "student's base model in OPD_VLLM_SERVERS, each new sampler version's adapter "
        "loaded into it.",
    )
    top_k: int = Field(
        -1, ge=-1, description="-1 = no top-k truncation.", json_schema_extra={"not": {"const": 0}}
    )

    @model_validator(mode="after")
    def _top_k_not_zero(self) -> SamplingSpec:
        if self.top_k == 0:
            raise field_error(("top_k",), "must be -1 (off) or >= 1")
        return self
