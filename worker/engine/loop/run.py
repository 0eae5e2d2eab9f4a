"""A run's clients and settings, opened once before its first step: the student's training
client (restored, or started from another job's weights), each teacher as the preflight
finds it, the sampling and optimiser settings, and the held-out eval over them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytrio.types import AdamParams, Datum, ForwardBackwardOutput, SamplingParams

from kernel.errors import OPDError
from kernel.samples import MAX_PROMPT_CHARS, MAX_SAMPLE_TOKENS, KeptSample
from kernel.spec import InitFrom, JobSpec, PromptOptions, SavedWeights, TeacherSpec
from kernel.spec.data import named
from worker.engine.backends.contract import (
    SamplingClient,
    ServiceClient,
    TeacherShare,
    TrainingClient,
)
from worker.engine.backends.resilient import Warn
from worker.engine.backends.server import ServerKey
from worker.engine.backends.vllm import VLLMSampler, VLLMServer
from worker.engine.data.mixing import Item, Pool, pools_of
from worker.engine.data.prompts import Prompt, Prompts, prompt_text
from worker.engine.eval.evaluation import Answered, Evaluation, Grade, with_baseline
from worker.engine.eval.grading import format_grader
from worker.engine.eval.prompts import EVAL_DATASET
from worker.engine.loop.pipeline import sampler_weights_name
from worker.engine.loop.state import SavedState, state_name
from worker.engine.rollouts.sampling import Completion, Scorer, stop_sequences
from worker.engine.teachers.cross_tokenizer import Tokenizers, top_k_of
from worker.engine.teachers.mixture import TeacherMixture
from worker.engine.teachers.preflight import PROMPTS_CHECKED, check_objective, teacher_mode
from worker.engine.teachers.views import (
    Answerer,
    Renderer,
    TeacherView,
    self_view,
    server_view,
)
from worker.engine.tracking.sinks import Sink


@dataclass
class Run:
    """One run's clients and settings, made once before its first step."""

    spec: JobSpec
    training: TrainingClient
    teachers: dict[str, TeacherView]
    tokenizer: Any
    params: SamplingParams
    adam: AdamParams
    sink: Sink
    renderer: Renderer
    """The student's chat template."""
    mixture: TeacherMixture | None = None
    """teacher_mixture: mixture: every teacher's weighted mixture."""
    vllm: VLLMServer | None = None
    """sampling.engine: vllm: the server the student's rollouts are sampled on."""

    def render(self, prompt: Prompt, options: PromptOptions) -> list[int]:
        """A prompt as the student's tokens, rendered as its dataset says."""
        return self.renderer(prompt, options)

    def scorer(self, item: Item, prompt: list[int], sampler: SamplingClient) -> Scorer:
        """What scores the completions of an item (`prompt`: the student's) that `sampler`
        sampled: its pool's teacher (route) or the mixture, each teacher after its own
        rendering (a self teacher of `current` weights with `sampler`'s)."""
        pool = item.pool
        views = [self.teachers[pool.teacher]] if pool.teacher else list(self.teachers.values())
        scorers = [
            view.prompted(item.prompt, pool.options, prompt, item.answer, sampler) for view in views
        ]
        if pool.teacher is not None:
            return scorers[0]
        assert self.mixture is not None
        return self.mixture.of(scorers)

    def answerer(self, item: Item, prompt: list[int], sampler: SamplingClient) -> Answerer:
        """The teacher that answers an item for the eval's baseline, from its own rendering
        (a self teacher of `current` weights with `sampler`'s)."""
        pool = item.pool
        view = self.teachers[pool.teacher or next(iter(self.teachers))]
        return view.answerer(item.prompt, pool.options, prompt, item.answer, sampler)

    async def train(
        self, datums: list[Datum], teachers: list[list[TeacherShare]]
    ) -> ForwardBackwardOutput:
        """One forward_backward (with a logit-level objective, against each datum's
        `teachers`) and one optim_step, both submitted before either is awaited."""
        loop = self.spec.loop
        if loop.objective.logit_level:
            fwd_bwd = await self.training.forward_backward_logits_async(
                datums,
                teachers,
                loop.objective,
                coef=loop.kl_penalty_coef,
                loss_fn=loop.loss_fn,
                loss_fn_config=loop.loss_options(),
            )
        else:
            # The ratio's bound is the local trainer's alone (the spec refuses it elsewhere).
            correction = loop.sampler_correction
            gated = {"correction": correction} if correction.active else {}
            fwd_bwd = await self.training.forward_backward_async(
                datums, loss_fn=loop.loss_fn, loss_fn_config=loop.loss_options(), **gated
            )
        optim = await self.training.optim_step_async(self.adam)
        result = await fwd_bwd
        await optim
        return result

    async def save_state(self, steps_done: int) -> SavedState:
        saved = await (await self.training.save_state_async(state_name(self.spec, steps_done)))
        self.sink.checkpoint(steps_done, "state", saved.path)
        return SavedState(saved.path, steps_done)

    async def save_checkpoint(self, steps_done: int) -> tuple[SavedState, str]:
        """A resumable state and sampler weights (and their path), as scheduled by
        `loop.save_every`."""
        state = await self.save_state(steps_done)
        name = sampler_weights_name(self.spec, steps_done)
        saved = await (await self.training.save_weights_for_sampler_async(name))
        self.sink.checkpoint(steps_done, "sampler", saved.path)
        return state, saved.path

    def kept(self, completions: list[Completion], items: list[Item]) -> list[KeptSample]:
        """Completions as people read them: the prompt, the text, each token's KL."""
        decode = self.tokenizer.decode
        kept: list[KeptSample] = []
        for completion in completions:
            tokens = completion.tokens[:MAX_SAMPLE_TOKENS]
            pieces = {token: decode([token]) for token in set(tokens)}
            kept.append(
                KeptSample(
                    prompt=prompt_text(items[completion.group].prompt)[:MAX_PROMPT_CHARS],
                    completion=decode(tokens, skip_special_tokens=True),
                    tokens=[pieces[token] for token in tokens],
                    reverse_kl=completion.reverse_kl[: len(tokens)].tolist(),
                    truncated=len(tokens) < len(completion.tokens),
                )
            )
        return kept

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    async def evaluate(
        self, evaluation: Evaluation, step: int, answered: Answered = None
    ) -> dict[str, float]:
        """The student's eval at this boundary, from a sampler of its own (the training
        sampler's draws are not shifted; on vLLM an adapter of its own, loaded for the
        eval); at step 0 the teacher's baseline too. `answered`: as each prompt is."""
        if self.vllm is None:
            sampler = await self.training.save_weights_and_get_sampling_client_async()
            return await self.evaluate_with(sampler, evaluation, step, answered)
        saved_as = f"{self.spec.weights_name}-vllm-eval-{step:06d}"
        saved = await (await self.training.save_weights_for_sampler_async(saved_as))
        async with self.vllm.adapter(f"eval{step}", saved.path) as adapter:
            sampler = VLLMSampler(self.vllm, adapter, self.tokenizer, version=step)
            return await self.evaluate_with(sampler, evaluation, step, answered)

    async def evaluate_with(
        self, sampler: SamplingClient, evaluation: Evaluation, step: int, answered: Answered
    ) -> dict[str, float]:
        metrics = await evaluation.student(sampler, answered)
        if step == 0 and evaluation.spec.teacher_baseline:
            baseline = await evaluation.teacher_baseline(sampler, answered)
            metrics = with_baseline(metrics, baseline)
            self.note_a_weak_teacher(metrics.get(TEACHER_ACCURACY))
        return metrics

    def note_a_weak_teacher(self, accuracy: float | None) -> None:
        """A note (a warning event the job page shows at its top) when the teacher answers
        far fewer held-out prompts right than its preset measured: its prompts are likely
        not rendered as it learned them (another question_suffix, enable_thinking), and the
        student cannot learn more than the teacher shows it."""
        expected = expected_teacher_accuracy(self.spec)
        if accuracy is None or expected is None or accuracy >= expected * WEAK_TEACHER:
            return
        name = self.spec.teacher.base_model
        suffixes = sorted({share.question_suffix or "" for share in self.spec.dataset_shares()})
        self.sink.event(
            "warning",
            f"The teacher answers {accuracy:.0%} of the held-out prompts right where preset "
            f"{name} measured {expected:.0%} on arithmetic: check that the prompts are "
            f"rendered as it learned them (question_suffix {', '.join(map(repr, suffixes))}, "
            "enable_thinking); the student can learn no more than its teacher shows it",
            {"note": "weak_teacher", "teacher_accuracy": accuracy, "expected": expected},
        )


async def open_run(
    spec: JobSpec,
    service: ServiceClient,
    sink: Sink,
    resume: SavedState | None,
    pools: list[Pool] | None = None,
    server_keys: Mapping[str, ServerKey] | None = None,
    vllm_servers: Mapping[str, Sequence[str]] | None = None,
    job_folder: Path | None = None,
    server_replicas: Mapping[str, Sequence[str]] | None = None,
) -> Run:
    """Create the clients, restore a saved state, and check that every teacher can score
    the student's tokens (`preflight`), on the first prompts of each of `pools`;
    `server_keys`: the key the operator bound to each teacher server, by URL, and
    `server_replicas` the replicas behind it; `vllm_servers`: the vLLM servers of each base
    model (OPD_VLLM_SERVERS and OPD_VLLM_REPLICAS), the job's adapters on one of them named
    after `job_folder`."""
    vllm = student_vllm(spec, vllm_servers or {}, warning_to(sink), job_folder)
    try:
        if vllm is not None and (left := await vllm.unload_earlier_attempts()):
            sink.event(
                "info",
                f"Unloaded {len(left)} adapters an earlier attempt left on {vllm.who}",
                {"adapters": left},
            )
        training = await service.create_lora_training_client_async(
            base_model=spec.student.base_model, rank=spec.student.lora_rank, seed=spec.student.seed
        )
        if resume is not None:
            # PyTRIO accepts load_state only before the first training operation.
            await (await training.load_state_with_optimizer_async(resume.path))
            sink.event(
                "info",
                f"Resumed from the state saved at step {resume.step}",
                {"step": resume.step, "path": resume.path},
            )
        elif spec.student.init_from is not None:
            await start_from(training, spec.student.init_from, sink)
        tokenizer = await asyncio.to_thread(training.get_tokenizer)  # may download
        checked = [
            (prompt, pool.options)
            for pool in pools or []
            for prompt in pool.prompts.prompts[:PROMPTS_CHECKED]
        ]
        teachers: dict[str, TeacherView] = {}
        stop = stop_sequences(tokenizer)
        try:
            for name, teacher_spec in spec.teacher_specs().items():
                who = teacher_named(spec, name, teacher_spec)
                if teacher_spec.server is not None:
                    warn = warning_to(sink)
                    url = teacher_spec.server.url
                    key = (server_keys or {}).get(url)
                    replicas = (server_replicas or {}).get(url, ())
                    view = await server_view(
                        spec, name, service, tokenizer, checked, warn, stop, key, replicas
                    )
                elif teacher_spec.self is not None:
                    view = await self_view(
                        spec, name, service, training, tokenizer, pools or [], vllm
                    )
                else:
                    view = await loaded_view(spec, name, service, tokenizer, checked, who)
                teachers[name] = view
                if view.mode != "cross":  # a cross-tokenizer teacher's event gives the probe's
                    mode_event(sink, who, view)  # alignment
        except BaseException:
            await close_teachers(teachers)
            raise
        params = SamplingParams(
            max_tokens=spec.sampling.max_tokens,
            seed=spec.student.seed,
            temperature=spec.sampling.temperature,
            top_p=spec.sampling.top_p,
            top_k=spec.sampling.top_k,
            stop=stop_sequences(tokenizer),
        )
        mixture = None
        if spec.teacher_mixture == "mixture":
            weights = spec.teacher_weights()
            mixture = TeacherMixture([weights[name] for name in teachers])
        adam = AdamParams(**spec.optim.model_dump())
        return Run(
            spec,
            training,
            teachers,
            tokenizer,
            params,
            adam,
            sink,
            Renderer(tokenizer),
            mixture,
            vllm,
        )
    except BaseException:  # its connections, and its place among the tier's jobs
        if vllm is not None:
            await vllm.aclose()
        raise


def student_vllm(
    spec: JobSpec, servers: Mapping[str, Sequence[str]], warn: Warn, job_folder: Path | None
) -> VLLMServer | None:
    """The vLLM server the student samples on (`sampling.engine: vllm`), or None: of the
    servers of its base model (OPD_VLLM_SERVERS' and its replicas), the one with the
    fewest jobs of this worker; its adapters are named after the job's folder, so a later
    attempt finds what an earlier one left."""
    if spec.sampling.engine != "vllm":
        return None
    base = spec.student.base_model
    if base not in servers:
        raise OPDError(
            f"sampling.engine is vllm, but no vLLM server serves {base!r} here: the operator "
            "names one in OPD_VLLM_SERVERS (opd vllm serve prints the line)",
            code="vllm_not_configured",
        )
    tier = servers[base]
    return VLLMServer(tier[0], base, warn, folder=job_folder, tier=tier if len(tier) > 1 else ())


async def loaded_view(
    spec: JobSpec,
    name: str,
    service: ServiceClient,
    tokenizer: Any,
    checked: list[tuple[Prompt, PromptOptions]],
    who: str,
) -> TeacherView:
    """Teacher `name` as the backend loads it, in the mode the preflight finds it in."""
    teacher_spec = spec.teacher_specs()[name]
    if teacher_spec.init_from is not None:
        service_filled(teacher_spec.init_from, f"{spec.teacher_field(name)}.init_from")
    teacher = await service.create_sampling_client_async(
        base_model=teacher_spec.base_model, model_path=teacher_spec.weights()
    )
    teacher_tokenizer = await asyncio.to_thread(teacher.get_tokenizer)
    mode = teacher_mode(tokenizer, teacher_tokenizer, checked)
    check_objective(spec, who, mode)
    return TeacherView(
        name,
        teacher,
        None if mode == "same" else Renderer(teacher_tokenizer),
        Tokenizers.of(tokenizer, teacher_tokenizer, stop_sequences(tokenizer), top_k_of(teacher))
        if mode == "cross"
        else None,
    )


def warning_to(sink: Sink) -> Callable[[str, dict[str, Any]], None]:
    """A warning event of the run, for what retries a call."""
    return lambda message, data: sink.event("warning", message, data)


def info_to(sink: Sink) -> Callable[[str, dict[str, Any]], None]:
    """An info event of the run, for what a person waiting on it may want to know."""
    return lambda message, data: sink.event("info", message, data)


async def close_teachers(teachers: Mapping[str, TeacherView]) -> None:
    for view in teachers.values():
        await view.aclose()


def teacher_named(spec: JobSpec, name: str, teacher: TeacherSpec) -> str:
    """How messages name a teacher: its model (self: the student's), and its name when
    there are several."""
    model = "self" if teacher.self is not None else repr(teacher.base_model)
    if spec.teachers is None:
        return f"teacher {model}"
    return f"teacher {name!r} ({model})"


def mode_event(sink: Sink, who: str, view: TeacherView, aligned: float | None = None) -> None:
    """The preflight's event naming a teacher's mode and, with another tokenizer, the
    fraction of the probe batch's completion bytes its tokens aligned."""
    data: dict[str, Any] = (
        {
            "teacher": view.name,
            "mode": view.mode,
            "chat_template": "same" if view.mode == "same" else "own",
        }
        | ({} if view.server is None else {"server": view.server})
        | ({} if view.weights is None else {"weights": view.weights})
    )
    message = f"{who[0].upper()}{who[1:]}: {view.template}"
    if view.mode == "cross" and aligned is not None:
        data["aligned_bytes_fraction"] = aligned
        message += f"; {aligned:.1%} of the probe batch's completion bytes aligned"
    sink.event("info", message, data)


async def start_from(training: TrainingClient, init: InitFrom, sink: Sink) -> None:
    """Load the saved state a continued job starts from (weights, and the optimizer if
    asked); the job still counts its own steps from 0."""
    path = service_filled(init, "student.init_from")
    load = (
        training.load_state_with_optimizer_async
        if init.with_optimizer
        else training.load_state_async
    )
    await (await load(path))
    what = "weights and optimizer" if init.with_optimizer else "weights"
    # A job's weights by name (a team reads the text); `opd run`'s by the path it was given.
    source = path if init.job is None else f"job {init.job}'s checkpoint {init.checkpoint}"
    sink.event("info", f"Started from the {what} of {source}", {"path": path})


def service_filled(ref: SavedWeights, field: str) -> str:
    """The path of saved weights a spec names: filled by the service, or given to `opd run`."""
    if ref.path is None:
        raise OPDError(
            f"{field} names job {ref.job} but no path: a job's weights are found by the "
            f"service (submit the spec to it), or give {field}.path",
            code="bad_init_from",
        )
    return ref.path


def eval_pools(spec: JobSpec, prompts: Prompts | Mapping[str, Prompts]) -> list[Pool]:
    """The eval's prompts by dataset: each dataset's held-out prompts, or eval.dataset's."""
    assert spec.eval is not None
    if spec.eval.dataset is None:
        return pools_of(spec, spec.dataset_shares(), prompts)
    return pools_of(spec, [named(spec.eval.dataset, EVAL_DATASET)], prompts)


def evaluation_for(run: Run, pools: list[Pool], grade: Grade | None) -> Evaluation:
    spec = run.spec.eval
    assert spec is not None
    items = [
        Item(prompt, answer, pool)
        for pool in pools
        for prompt, answer in zip(pool.prompts.prompts, pool.prompts.answers, strict=True)
    ]
    prompts = [run.render(item.prompt, item.pool.options) for item in items]
    formed = spec.grader.regex
    return Evaluation(
        spec=spec,
        prompts=prompts,
        answers=[item.answer for item in items],
        params=run.params.model_copy(
            update={
                "max_tokens": spec.max_tokens or run.spec.sampling.max_tokens,
                "temperature": spec.temperature,
                "seed": spec.seed,
            }
        ),
        teachers=lambda sampler: [
            run.scorer(item, prompt, sampler) for item, prompt in zip(items, prompts, strict=True)
        ],
        answerers=lambda sampler: [
            run.answerer(item, prompt, sampler) for item, prompt in zip(items, prompts, strict=True)
        ],
        decode=run.decode,
        grade=grade if formed is None else format_grader(formed),
        sources=[item.pool.name for item in items] if run.spec.several_datasets() else (),
        reads_answers=formed is None,
    )


WEAK_TEACHER = 0.5
"""A teacher's baseline below this share of its preset's measured accuracy gets a note."""
TEACHER_ACCURACY = "eval/teacher_accuracy"


def expected_teacher_accuracy(spec: JobSpec) -> float | None:
    """What the one teacher's preset measured on the arithmetic task (local backend, no
    weights on top, no context of its own, answers graded boxed), or None where nothing is
    known to expect."""
    teacher = spec.teacher
    if spec.backend != "local" or spec.teachers is not None or teacher.weights() is not None:
        return None
    if teacher.self is not None or (spec.eval is not None and not spec.eval.grader.boxed):
        return None
    from worker.engine.backends.local.trained import measured_accuracy  # the backend's own

    return measured_accuracy(teacher.base_model)
