"""What a team reads of the weights a playground answer loaded (issue 47): the worker fills
each output's `weights` with the folder it loaded; the answer (kept for replays) names the
checkpoint from its job's folder on and a teacher's `model_path` as the team wrote it."""

from __future__ import annotations

from app.playground.service import team_answer
from kernel.playground import ModelOutput, SampleAnswer


def output(model: str, weights: str | None) -> ModelOutput:
    return ModelOutput(
        model=model,
        base_model="tiny-a",
        weights=weights,
        cached=False,
        prompt="hi",
        prompt_tokens=1,
        prompt_token_ids=[1],
        completions=[],
    )


def test_an_answer_names_its_weights_as_the_team_may_see_them():
    home = "/srv/opd-home"
    answer = SampleAnswer(
        prompt="hi",
        prompt_tokens=1,
        outputs=[
            output("checkpoint", f"{home}/artifacts/job-1/sampler/tiny-a"),
            output("teacher", f"{home}/data/models/tiny-a"),
            output("base", None),
        ],
        seconds=0.1,
    )
    shown = team_answer(answer, {f"{home}/data/models/tiny-a": "models/tiny-a"})
    assert [o.weights for o in shown.outputs] == ["job-1/sampler/tiny-a", "models/tiny-a", None]
    unknown = team_answer(answer, {})
    assert unknown.outputs[1].weights == "[server folder]"
    assert home not in unknown.model_dump_json()
