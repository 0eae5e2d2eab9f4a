"""The logit-level objectives as pure torch functions of two distributions per position.

Each takes the student's and the teacher's log-probabilities over the vocabulary at a
batch of positions ([n, V]) and gives the objective's value at each position and the
teacher probability mass the kept tokens cover. With `top_k` both distributions are first
coarsened to k kept tokens (the student's top k for reverse KL, the teacher's for forward
KL and JSD) plus, with a tail, one bucket holding the rest of the vocabulary's mass.
docs/algorithm.md#objectives gives the definitions; JSD is TRL's generalized JSD.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernel.spec import ObjectiveSpec


def kept(student: Tensor, teacher: Tensor, objective: ObjectiveSpec) -> tuple[Tensor, Tensor]:
    """Both distributions over the tokens the objective keeps (all of them without top_k)."""
    vocab = student.shape[-1]
    if not objective.top_k or objective.top_k >= vocab:
        return student, teacher
    chooser = student if objective.kind == "reverse_kl" else teacher
    index = chooser.detach().topk(objective.top_k, dim=-1).indices
    student_kept, teacher_kept = student.gather(-1, index), teacher.gather(-1, index)
    if not objective.keeps_tail:
        return student_kept, teacher_kept
    rest = torch.ones_like(student, dtype=torch.bool).scatter(-1, index, False)
    return (
        torch.cat([student_kept, rest_mass(student, rest)], dim=-1),
        torch.cat([teacher_kept, rest_mass(teacher, rest)], dim=-1),
    )


def rest_mass(logprobs: Tensor, rest: Tensor) -> Tensor:
    """log of the probability outside the kept tokens, summed exactly (not 1 - kept)."""
    return logprobs.masked_fill(~rest, -math.inf).logsumexp(-1, keepdim=True)


def kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p || q) per position from finite log-probabilities (a log-softmax always is)."""
    return (p.exp() * (p - q)).sum(-1)


def jsd(student: Tensor, teacher: Tensor, beta: float) -> Tensor:
    """beta * KL(teacher || m) + (1 - beta) * KL(student || m), m = beta * teacher +
    (1 - beta) * student; beta 0 is forward KL and 1 reverse KL, as TRL defines it."""
    if beta == 0:
        return kl(teacher, student)
    if beta == 1:
        return kl(student, teacher)
    mixture = torch.logaddexp(student + math.log(1 - beta), teacher + math.log(beta))
    return beta * kl(teacher, mixture) + (1 - beta) * kl(student, mixture)


def divergence(student: Tensor, teacher: Tensor, objective: ObjectiveSpec) -> tuple[Tensor, Tensor]:
    """(the objective at each position, the teacher mass its kept tokens cover there)."""
    student_kept, teacher_kept = kept(student, teacher, objective)
    if objective.top_k and objective.top_k < student.shape[-1]:
        mass = teacher_kept[..., : objective.top_k].exp().sum(-1)
    else:
        mass = torch.ones(student.shape[:-1], dtype=student.dtype, device=student.device)
    if objective.kind == "reverse_kl":
        value = kl(student_kept, teacher_kept)
    elif objective.kind == "forward_kl":
        value = kl(teacher_kept, student_kept)
    else:
        value = jsd(student_kept, teacher_kept, objective.mixture_weight)
    return value, mass
