"""The job page's "Try it" panel: its form sampled by a worker, exactly as the API's
`POST /v1/jobs/{id}/playground` does (each model's answers kept as stored completions when
"Store these answers" is ticked), answered with the completions as an HTML fragment the
panel's script puts in place (each token shaded by its reverse KL against the teacher)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from app.api.deps import JobId, QueueDep, SessionDep, SettingsDep, WaitsDep
from app.api.routes.playground import serve_playground
from app.core.waits import RETRY_AFTER_SECONDS, TooManyWaiting
from app.jobs.rows import get_job
from app.playground.schemas import PlaygroundAnswer, PlaygroundRequest
from app.playground.service import PlaygroundError, Sampling
from app.stored_completions.errors import StoredQuotaExceeded
from app.web import present
from app.web.deps import ActingViewerDep, FormDep
from app.web.templating import render
from kernel.json_types import FORM_TEXT
from kernel.playground import Completion
from kernel.spec import format_validation_error

router = APIRouter(prefix="/ui", include_in_schema=False)

LABELS = {"checkpoint": "Checkpoint", "teacher": "Teacher", "base": "Untrained student"}
COMPARED = ("teacher", "base")


def sample_request(form: dict[str, str]) -> PlaygroundRequest:
    """The form's fields as the API's request (the same checks, the same bounds; its
    numbers are the text typed)."""
    checkpoint = form.get("checkpoint", "final")
    return PlaygroundRequest.model_validate(
        {
            "prompt": form.get("prompt") or None,
            "reference": form.get("reference") or None,
            "checkpoint": int(checkpoint) if checkpoint.isdigit() else checkpoint,
            "n": form.get("n") or 1,
            "max_tokens": form.get("max_tokens") or 128,
            "temperature": form.get("temperature") or 1.0,
            "top_p": form.get("top_p") or 1.0,
            "compare": [model for model in COMPARED if form.get(f"compare_{model}")],
            "store": bool(form.get("store")),
        },
        context=FORM_TEXT,
    )


def shaded(completion: Completion) -> list[dict[str, Any]]:
    """Each token with its shade (by reverse KL, when the teacher was compared) and logprob."""
    kls = completion.reverse_kl or [None] * len(completion.tokens)
    return [
        {"token": token, "logprob": logprob}
        for token, logprob in zip(
            present.shade_tokens(completion.tokens, kls), completion.logprobs, strict=True
        )
    ]


def answer_view(answer: PlaygroundAnswer) -> list[dict[str, Any]]:
    return [
        {
            "output": output,
            "label": LABELS[output.model],
            "completions": [
                {"tokens": shaded(completion), "aligned": completion.aligned_bytes_fraction}
                for completion in output.completions
            ],
        }
        for output in answer.outputs
    ]


@router.post("/jobs/{job_id}/try")
async def try_it(
    request: Request,
    job_id: JobId,
    session: SessionDep,
    queue: QueueDep,
    settings: SettingsDep,
    waits: WaitsDep,
    viewer: ActingViewerDep,
    form: FormDep,
) -> Response:
    """The completions of the form's prompt, or why there are none, as a fragment. Needs
    the `submit` scope, as the API's `POST /v1/jobs/{id}/playground` does, adds its tokens
    to the job's usage and, with "Store these answers" ticked, keeps each model's as a
    stored completion, as it does."""
    job = await get_job(session, job_id, viewer.scope)
    sampling = Sampling(session, queue, settings, waits, viewer.team_id)
    try:
        served = await serve_playground(sampling, job, sample_request(form))
    except ValidationError as error:
        return render(
            request,
            "try_result.html",
            {"error": format_validation_error(error, PlaygroundRequest)},
            422,
        )
    except PlaygroundError as error:
        return render(request, "try_result.html", {"error": error.message}, error.status)
    except StoredQuotaExceeded as error:
        return render(request, "try_result.html", {"error": str(error)}, 429)
    except TooManyWaiting as error:
        busy = render(request, "try_result.html", {"error": str(error)}, 429)
        busy.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return busy
    answer = served.value
    context = {"error": None, "answer": answer, "outputs": answer_view(answer)}
    return render(request, "try_result.html", context)
