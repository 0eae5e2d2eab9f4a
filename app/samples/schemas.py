"""Kept rollouts as the API shows them."""

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.core.pages import Page


class SamplePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    step: int = Field(description="The training step that sampled it.")
    position: int = Field(description="Its place among the step's kept rollouts.")
    prompt: str = Field(description="The question, before the chat template.")
    completion: str
    tokens: list[str] = Field(description="The completion's tokens, decoded one by one.")
    reverse_kl: list[float | None] = Field(
        description="student - teacher logprob of each token (null: not finite)."
    )
    truncated: bool = Field(description="Cut to the stored length (the tokens' tail is gone).")
    created_at: datetime


class SamplesPage(Page[SamplePublic]):
    """Oldest step first; pass `next_cursor` as `after` to get the next page."""
