"""Gradients of a logit-level objective with memory bounded for a real vocabulary.

The student's and each teacher's last hidden states are computed once for a chunk of rows;
the logits over the vocabulary are then made, compared and back-propagated a few positions
at a time (`position_chunks`), so no [positions, vocabulary] tensor larger than
POSITION_BUDGET elements exists, whatever the vocabulary (150k tokens) or the batch. Only
completion positions (a datum's `weights` 1) are compared; the prompt carries no signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pytrio.client.training_batch import PolicyTrainingSample
from torch import Tensor

from kernel.spec import ObjectiveSpec
from worker.engine.backends.local.decoding import pad_batch
from worker.engine.backends.local.divergences import divergence
from worker.engine.backends.local.losses import Loss

POSITION_BUDGET = 2**24
"""Most elements of one [positions, vocabulary] tensor of a chunk (64 MiB in float32)."""


@dataclass(frozen=True)
class Scorer:
    """A frozen causal LM as the objective reads it: hidden states, then logits."""

    model: torch.nn.Module

    def hidden(self, ids: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        decoder = self.model.get_decoder()
        return decoder(input_ids=ids, attention_mask=mask, position_ids=positions)[0]

    def logprobs(self, hidden: Tensor) -> Tensor:
        return self.model.get_output_embeddings()(hidden).float().log_softmax(-1)


@dataclass(frozen=True)
class Rows:
    """One chunk of rows: their samples, completion masks and teachers (model, weight)."""

    samples: Sequence[PolicyTrainingSample]
    masks: Sequence[Sequence[bool]]
    teachers: Sequence[Sequence[tuple[Scorer, float]]]


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


@torch.no_grad()
def teacher_hidden(rows: Rows, pad_id: int, device: torch.device) -> list[tuple[Scorer, Tensor]]:
    """Each teacher's hidden states at the completion positions of the rows it scores,
    laid out as the student's (positions a teacher does not score stay zero)."""
    counts = [sum(mask) for mask in rows.masks]
    starts = [0, *torch.tensor(counts).cumsum(0).tolist()]
    out: list[tuple[Scorer, Tensor]] = []
    for scorer in dict.fromkeys(s for mixed in rows.teachers for s, _ in mixed):
        mine = [i for i, mixed in enumerate(rows.teachers) if any(s is scorer for s, _ in mixed)]
        ids, mask, positions = pad_batch(
            [rows.samples[i].model_input.to_ints() for i in mine], pad_id, device, left=False
        )
        hidden = selected(scorer.hidden(ids, mask, positions), [rows.masks[i] for i in mine])
        laid_out = hidden.new_zeros((starts[-1], hidden.shape[-1]))
        at = 0
        for i in mine:
            laid_out[starts[i] : starts[i + 1]] = hidden[at : at + counts[i]]
            at += counts[i]
        out.append((scorer, laid_out))
    return out


def teacher_logprobs(
    rows: Rows, hidden: list[tuple[Scorer, Tensor]], span: slice, owners: Tensor
) -> Tensor:
    """log sum_i w_i p_i over the vocabulary at the positions `span`, each from its row's
    teachers (one teacher of weight 1 is its own log-softmax, exactly)."""
    out: Tensor | None = None
    for scorer, states in hidden:
        weights = torch.tensor(
            [next((w for s, w in mixed if s is scorer), 0.0) for mixed in rows.teachers],
            dtype=torch.float32,
            device=states.device,
        )[owners[span]]
        with torch.no_grad():
            scored = scorer.logprobs(states[span]) + weights.log().unsqueeze(-1)
        out = scored if out is None else torch.logaddexp(out, scored)
    assert out is not None
    return out


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
) -> tuple[list[Tensor], list[Tensor]]:
    """Add the gradient of (coef * objective + the policy loss of the datums' advantages)
    summed over the rows' completion positions and divided by `denominator`; returns each
    row's target logprobs, the student's and the teacher's ([its length], 0 on the prompt)."""
    inputs = [s.model_input.to_ints() for s in rows.samples]
    ids, mask, positions = pad_batch(inputs, pad_id, device, left=False)
    student_states = selected(student.hidden(ids, mask, positions), rows.masks)
    leaf = student_states.detach().requires_grad_()
    teachers = teacher_hidden(rows, pad_id, device)
    flat = [
        (row, position)
        for row, row_mask in enumerate(rows.masks)
        for position, on in enumerate(row_mask)
        if on
    ]
    owners = torch.tensor([row for row, _ in flat], dtype=torch.long, device=device)

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
    for span in position_chunks(len(flat), vocab):
        logprobs = student.logprobs(leaf[span])
        teacher = teacher_logprobs(rows, teachers, span, owners)
        value, mass = divergence(logprobs, teacher, objective)
        chosen = logprobs.gather(-1, targets[span].unsqueeze(-1)).squeeze(-1)
        teacher_picked[span] = teacher.gather(-1, targets[span].unsqueeze(-1)).squeeze(-1)
        chunk_inputs = {name: tensor[span] for name, tensor in policy_inputs.items()}
        loss = (coef * value + loss_fn(chosen, chunk_inputs, options)).sum()
        (loss / denominator).backward()
        picked[span] = chosen.detach()
        totals.loss += loss.item()
        totals.objective += value.detach().sum().item()
        totals.mass += mass.sum().item()
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
