"""Gradients of a logit-level objective with memory bounded for a real vocabulary.

The student's and each teacher's last hidden states are computed once for a chunk of rows;
the logits over the vocabulary are then made, compared and back-propagated a few positions
at a time (`position_chunks`), so no [positions, vocabulary] tensor larger than
POSITION_BUDGET elements exists, whatever the vocabulary (150k tokens) or the batch. Only
completion positions (a datum's `weights` 1) are compared; the prompt carries no signal.
Each teacher reads the completion after its own prompt where it has one (its own chat
template, a self teacher's context): the same completion positions, shifted. A teacher with
another tokenizer reads the completion as its own tokens (`ByteView`), and the two are
compared over the text's next byte at each position (`next_byte.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from pytrio.client.training_batch import PolicyTrainingSample
from pytrio.errors.base import ValidationError
from torch import Tensor
from torch.func import functional_call

from kernel.spec import ObjectiveSpec
from worker.engine.backends.contract import ByteView
from worker.engine.backends.local.decoding import pad_batch
from worker.engine.backends.local.divergences import divergence
from worker.engine.backends.local.losses import Loss
from worker.engine.backends.local.next_byte import (
    REST,
    ByteClasses,
    student_classes,
    teacher_classes,
)

POSITION_BUDGET = 2**24
"""Most elements of one [positions, vocabulary] tensor of a chunk (64 MiB in float32)."""


@dataclass(frozen=True, eq=False)
class Scorer:
    """A causal LM as the objective reads it: hidden states, then logits. A self teacher
    reads the student's own model: with its adapter off (`adapter_off`, peft's
    `disable_adapter`) or with a sampler's saved LoRA weights in place of the live ones
    (`weights`, named as in the decoder). One with another tokenizer knows its tokens by
    the byte each begins with (`classes`)."""

    model: torch.nn.Module
    adapter_off: Callable[[], AbstractContextManager[Any]] | None = None
    weights: Mapping[str, Tensor] | None = None
    classes: ByteClasses | None = None

    def hidden(self, ids: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        decoder = self.model.get_decoder()
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        if self.weights is not None:
            return functional_call(decoder, dict(self.weights), args=(), kwargs=inputs)[0]
        with self.adapter_off() if self.adapter_off is not None else nullcontext():
            return decoder(**inputs)[0]

    def logprobs(self, hidden: Tensor) -> Tensor:
        return self.model.get_output_embeddings()(hidden).float().log_softmax(-1)


@dataclass(frozen=True)
class Reading:
    """One teacher of a row: its scorer, its weight in the row's mixture, the tokens it
    reads before the completion (None: the row's own prompt) and, with another tokenizer,
    the completion as it reads it (`view`)."""

    scorer: Scorer
    weight: float
    prompt: Sequence[int] | None = None
    view: ByteView | None = None


@dataclass(frozen=True)
class Rows:
    """One chunk of rows: their samples, completion masks and teachers."""

    samples: Sequence[PolicyTrainingSample]
    masks: Sequence[Sequence[bool]]
    teachers: Sequence[Sequence[Reading]]


@dataclass
class Totals:
    """What one forward_backward adds up over its chunks."""

    loss: float = 0.0
    objective: float = 0.0
    mass: float = 0.0
    positions: int = 0


def position_chunks(count: int, vocab_size: int) -> list[slice]:
    """Consecutive ranges of `count` positions whose logits fit POSITION_BUDGET."""
    size = max(1, POSITION_BUDGET // vocab_size)
    return [slice(start, min(start + size, count)) for start in range(0, count, size)]


def selected(hidden: Tensor, masks: Sequence[Sequence[bool]]) -> Tensor:
    """The hidden states of the masked positions, row after row: [positions, width]."""
    keep = torch.zeros(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    for row, mask in enumerate(masks):
        keep[row, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    return hidden[keep]


def teacher_input(
    sample: PolicyTrainingSample, mask: Sequence[bool], reading: Reading
) -> tuple[list[int], list[int]]:
    """What a teacher reads of a row, and the positions of it that predict the row's
    completion tokens, in order: the row itself, or its own prompt followed by the
    completion (the row's masked positions are its last ones: the completion's tokens but
    the last)."""
    ids = sample.model_input.to_ints()
    if reading.prompt is None:
        return ids, [index for index, on in enumerate(mask) if on]
    prompt = list(reading.prompt)
    completion = sum(mask)
    tail = ids[len(ids) - completion + 1 :] if completion else []
    own = [*prompt, *tail]
    return own, list(range(len(own) - completion, len(own)))


def check_completion_last(mask: Sequence[bool]) -> None:
    """A teacher with a prompt of its own reads the completion after it (`teacher_input`):
    the datum's completion positions must be its last ones."""
    completion = sum(mask)
    if completion and list(mask[-completion:]) != [True] * completion:
        raise ValidationError(
            "a teacher with a prompt of its own reads the completion after it: the "
            "datum's weights must be 1 on its last positions only",
            code="validation.invalid_loss_fn_inputs",
        )


Group = tuple[Scorer, int]
"""A teacher's scorer and its place in its rows' mixtures: the rows it reads together."""


@torch.no_grad()
def teacher_hidden(rows: Rows, pad_id: int, device: torch.device) -> list[tuple[Group, Tensor]]:
    """Each teacher's hidden states at the completion positions of the rows it scores,
    laid out as the student's (positions a teacher does not score stay zero), one group
    per scorer and place in the mixture."""
    counts = [sum(mask) for mask in rows.masks]
    starts = [0, *torch.tensor(counts).cumsum(0).tolist()]
    out: list[tuple[Group, Tensor]] = []
    groups = [(r.scorer, place) for mixed in rows.teachers for place, r in enumerate(mixed)]
    for group in dict.fromkeys(groups):
        if group[0].classes is not None:  # another tokenizer: read by its `ByteSide`
            continue
        mine = [(i, r) for i, mixed in enumerate(rows.teachers) if (r := reading_of(mixed, group))]
        read = [teacher_input(rows.samples[i], rows.masks[i], r) for i, r in mine]
        ids, mask, positions = pad_batch([ids for ids, _ in read], pad_id, device, left=False)
        hidden = group[0].hidden(ids, mask, positions)
        laid_out = hidden.new_zeros((starts[-1], hidden.shape[-1]))
        for at, ((i, _), (_, where)) in enumerate(zip(mine, read, strict=True)):
            laid_out[starts[i] : starts[i + 1]] = hidden[at, where]
        out.append((group, laid_out))
    return out


def reading_of(mixed: Sequence[Reading], group: Group) -> Reading | None:
    """A row's reading in `group` (its scorer at that place), if it has one."""
    scorer, place = group
    if place < len(mixed) and mixed[place].scorer is scorer:
        return mixed[place]
    return None


def teacher_logprobs(
    rows: Rows, hidden: list[tuple[Group, Tensor]], span: Tensor, owners: Tensor
) -> Tensor:
    """log sum_i w_i p_i over the vocabulary at the positions `span`, each from its row's
    teachers (one teacher of weight 1 is its own log-softmax, exactly)."""
    out: Tensor | None = None
    for group, states in hidden:
        weights = torch.tensor(
            [(r.weight if (r := reading_of(mixed, group)) else 0.0) for mixed in rows.teachers],
            dtype=torch.float32,
            device=states.device,
        )[owners[span]]
        with torch.no_grad():
            scored = group[0].logprobs(states[span]) + weights.log().unsqueeze(-1)
        out = scored if out is None else torch.logaddexp(out, scored)
    assert out is not None
    return out


@dataclass(frozen=True)
class Positions:
    """A chunk of rows' completion positions, row after row: each one's row and place in the
    row, and its completion token's index in the completion."""

    flat: list[tuple[int, int]]
    owners: Tensor
    tokens: list[int]

    @classmethod
    def of(cls, rows: Rows, device: torch.device) -> Positions:
        flat, tokens = [], []
        for row, row_mask in enumerate(rows.masks):
            index = 0
            for position, on in enumerate(row_mask):
                if on:
                    flat.append((row, position))
                    tokens.append(index)
                    index += 1
        owners = torch.tensor([row for row, _ in flat], dtype=torch.long, device=device)
        return cls(flat, owners, tokens)


@dataclass(frozen=True)
class ByteSide:
    """A teacher of another tokenizer and the completion positions of the rows it reads (a
    row read so has that teacher only: the spec refuses it in a mixture), each with its
    hidden state where the teacher predicts the token the position's byte is in, what that
    token had written before it, whether the two texts still agree there, and, right after
    a teacher token, its hidden state where it predicted that token and its bytes
    (`next_byte.teacher_classes`)."""

    scorer: Scorer
    positions: Tensor
    states: Tensor
    written: list[bytes]
    valid: Tensor
    before: Tensor
    ended: list[bytes | None]
    mapped: Tensor
    """The teacher's logprob of each position's sampled token, by the chain rule on bytes."""


@torch.no_grad()
def byte_sides(rows: Rows, where: Positions, pad_id: int, device: torch.device) -> list[ByteSide]:
    """Each teacher of another tokenizer over the positions of the rows it reads: one pass
    of it over each row's own prompt and tokens (`ByteView`)."""
    sides = []
    scorers = [r.scorer for mixed in rows.teachers for r in mixed if r.view is not None]
    for scorer in dict.fromkeys(scorers):
        assert scorer.classes is not None
        mine = {
            row: mixed[0]
            for row, mixed in enumerate(rows.teachers)
            if any(r.scorer is scorer for r in mixed)
        }
        if any(len(rows.teachers[row]) > 1 for row in mine):
            raise ValidationError(
                "a teacher with another tokenizer is read over the next byte, alone: not in "
                "a mixture of teachers",
                code="validation.invalid_teachers",
            )
        order = list(mine)
        inputs = [[*(mine[row].prompt or []), *mine[row].view.tokens] for row in order]  # type: ignore[union-attr]
        ids, mask, positions = pad_batch(inputs, pad_id, device, left=False)
        hidden = scorer.hidden(ids, mask, positions)
        chosen, at, before, written, valid, ended, mapped = [], [], [], [], [], [], []
        for index, ((row, _), token) in enumerate(zip(where.flat, where.tokens, strict=True)):
            if row not in mine:
                continue
            reading = mine[row]
            view = reading.view
            assert view is not None
            start = len(reading.prompt or []) - 1
            k = view.positions[token]
            inside = view.written[token]
            after = k >= 1 and not inside
            chosen.append(index)
            at.append((order.index(row), start + max(k, 0)))
            before.append((order.index(row), start + k - 1 if after else start))
            written.append(inside)
            valid.append(k >= 0)
            ended.append(scorer.classes.pieces[view.tokens[k - 1]] if after else None)
            mapped.append(view.logprobs[token])
        rows_at, columns_at = zip(*at, strict=True) if at else ((), ())
        rows_before, columns_before = zip(*before, strict=True) if before else ((), ())
        sides.append(
            ByteSide(
                scorer,
                torch.tensor(chosen, dtype=torch.long, device=device),
                hidden[list(rows_at), list(columns_at)],
                written,
                torch.tensor(valid, device=device),
                hidden[list(rows_before), list(columns_before)],
                ended,
                torch.tensor(mapped, dtype=torch.float32, device=device),
            )
        )
    return sides


def accumulate(
    student: Scorer,
    rows: Rows,
    objective: ObjectiveSpec,
    coef: float,
    policy: tuple[Loss, dict[str, float]],
    denominator: int,
    pad_id: int,
    device: torch.device,
    totals: Totals,
    student_bytes: Callable[[], ByteClasses] | None = None,
) -> tuple[list[Tensor], list[Tensor]]:
    """Add the gradient of (coef * objective + the policy loss of the datums' advantages)
    summed over the rows' completion positions and divided by `denominator`; returns each
    row's target logprobs, the student's and the teacher's ([its length], 0 on the prompt;
    a teacher of another tokenizer's, of the target's first byte). `student_bytes`: the
    student's tokens by their first byte, for the rows a teacher of another tokenizer reads."""
    # The teachers first: a self teacher's adapter_off turns the student's own LoRA off
    # for a moment, which must not happen with the student's graph in the making.
    teachers = teacher_hidden(rows, pad_id, device)
    where = Positions.of(rows, device)
    sides = byte_sides(rows, where, pad_id, device) if student_bytes is not None else []
    inputs = [s.model_input.to_ints() for s in rows.samples]
    ids, mask, positions = pad_batch(inputs, pad_id, device, left=False)
    student_states = selected(student.hidden(ids, mask, positions), rows.masks)
    leaf = student_states.detach().requires_grad_()
    flat = where.flat

    def column(values: Sequence[Sequence[float]] | Sequence[Sequence[int]]) -> Tensor:
        return torch.tensor([values[row][position] for row, position in flat], device=device)

    targets = column([s.target_tokens for s in rows.samples]).long()
    policy_inputs = {
        "logprobs": column([s.logprobs for s in rows.samples]).float(),
        "advantages": column([s.advantages for s in rows.samples]).float(),
    }
    loss_fn, options = policy
    vocab = student.model.get_output_embeddings().weight.shape[0]
    picked = torch.zeros(len(flat), device=device)
    teacher_picked = torch.zeros(len(flat), device=device)

    def train(
        span: Tensor, value: Tensor, mass: Tensor, logprobs: Tensor, within: Tensor | None = None
    ) -> None:
        """The chunk's loss at positions `span` (the student's `logprobs` there) back to
        the student's hidden states, and its totals; `within`: advantages the sampled tokens
        add to their datums' (the part of a divergence the objective's classes leave out)."""
        chosen = logprobs.gather(-1, targets[span].unsqueeze(-1)).squeeze(-1)
        chunk_inputs = {name: tensor[span] for name, tensor in policy_inputs.items()}
        if within is not None:
            chunk_inputs["advantages"] = chunk_inputs["advantages"] + within
        loss = (coef * value + loss_fn(chosen, chunk_inputs, options)).sum()
        (loss / denominator).backward()
        picked[span] = chosen.detach()
        totals.loss += loss.item()
        totals.objective += value.detach().sum().item()
        totals.mass += mass.sum().item()

    across = torch.zeros(len(flat), dtype=torch.bool, device=device)
    for side in sides:
        across[side.positions] = True
    same = torch.nonzero(~across).squeeze(-1)
    for chunk in position_chunks(len(same), vocab):
        span = same[chunk]
        logprobs = student.logprobs(leaf[span])
        teacher = teacher_logprobs(rows, teachers, span, where.owners)
        value, mass = divergence(logprobs, teacher, objective)
        teacher_picked[span] = teacher.gather(-1, targets[span].unsqueeze(-1)).squeeze(-1)
        train(span, value, mass, logprobs)
    for side in sides:
        assert student_bytes is not None and side.scorer.classes is not None
        for chunk in position_chunks(len(side.positions), vocab):
            span = side.positions[chunk]
            logprobs = student.logprobs(leaf[span])
            with torch.no_grad():
                theirs, kept = teacher_classes(
                    side.scorer.classes,
                    side.scorer.logprobs(side.states[chunk]),
                    side.written[chunk],
                    side.scorer.logprobs(side.before[chunk]),
                    side.ended[chunk],
                )
            ours = student_classes(student_bytes(), logprobs, kept)
            value, mass = divergence(ours, theirs, objective)
            classes = student_bytes()
            first = classes.first.to(device)[targets[span]].unsqueeze(-1)
            kind = torch.where(kept.gather(-1, first), first, REST)
            chosen = logprobs.detach().gather(-1, targets[span].unsqueeze(-1)).squeeze(-1)
            # The reverse KL over tokens is the one over their classes plus, in the class of
            # the sampled token, the sampled token's share of it: its log-ratio to its class
            # on each side (the teacher's from the chain rule's logprob of its bytes; none
            # for a token that is its class's one byte, where the two logprobs are one
            # probability computed two ways). REST folds classes together: no share there.
            theirs_share = side.mapped[chunk] - theirs.gather(-1, kind).squeeze(-1)
            whole = classes.whole.to(device)[targets[span]]
            within = (chosen - ours.detach().gather(-1, kind).squeeze(-1)) - torch.where(
                whole, 0.0, theirs_share
            )
            within = within.masked_fill(kind.squeeze(-1) == REST, 0.0)
            teacher_picked[span] = side.mapped[chunk]
            valid = side.valid[chunk]
            train(span, value * valid, mass, logprobs, -coef * within * valid)
    totals.positions += len(flat)
    if len(flat):
        student_states.backward(leaf.grad)
    return per_row(rows, flat, picked.cpu()), per_row(rows, flat, teacher_picked.cpu())


def per_row(rows: Rows, flat: list[tuple[int, int]], picked: Tensor) -> list[Tensor]:
    """The flat positions' values back in their rows, zeros elsewhere."""
    out = [torch.zeros(s.input_length) for s in rows.samples]
    for (row, position), value in zip(flat, picked.tolist(), strict=True):
        out[row][position] = value
    return out
