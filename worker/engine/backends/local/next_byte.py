"""Two tokenizers' next-token distributions as distributions over the text's next byte.

A logit-level objective compares the student's and a teacher's distributions position by
position, which needs one vocabulary. Across tokenizers both models still predict the same
text, so both say what its next byte is: each token stands for its first byte (an end of
sequence for the end, `END`), and a byte's mass is that of the tokens that begin with it.

Where a student position falls inside one of the teacher's tokens, the teacher has already
written part of that token (`written`): its tokens that go on from there give the next byte,
and `written` itself as a whole token says only that the teacher's token ends there, which
is `REST`, as is every byte no token of the teacher goes on with; the student's mass on those
bytes (and on its end) goes to `REST` too. Where a student position falls right after a
teacher token that others go on from (`5`, where `56` is a token too), the teacher predicted
its next token knowing that the number had ended; what it said one position earlier, that
the text might go on as `56` does, joins in (`before`): the next byte is `6` with the mass
of `56`, and with the mass of `5` itself whatever its next token begins with.

The student's side is the exact marginal of its distribution; the teacher's is its
distribution over the text's next byte as its own tokenization of the text so far reads it.
A divergence between them is zero where the student predicts the next byte as the teacher
does; which of its tokens that begin with the byte it writes is the student's own choice.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

END = 256
REST = 257
BYTE_CLASSES = 258
"""The 256 byte values, the end of the sequence, and the rest."""
FLOOR = 1e-12
"""The least probability a class is given before its log, so that a class both models give
no mass adds nothing (instead of 0 * log 0) and one only the student uses costs a bounded
amount (28 nats a unit of mass)."""


class ByteClasses:
    """A vocabulary by the byte each token begins with (`END` for its ends of sequence,
    `REST` for one that stands for no bytes), and by what follows a prefix written so far."""

    def __init__(self, pieces: Sequence[bytes], ends: Collection[int]) -> None:
        self.pieces = list(pieces)
        self.first = torch.tensor(
            [END if i in ends else piece[0] if piece else REST for i, piece in enumerate(pieces)]
        )
        self.whole = torch.tensor([len(piece) <= 1 or i in ends for i, piece in enumerate(pieces)])
        """Whether a token is all of its class's text (one byte, an end): where a teacher's
        logprob of its bytes is its class's, so its share of the class is none."""
        self.after: dict[bytes, tuple[Tensor, Tensor]] = {}

    def following(self, written: bytes) -> tuple[Tensor, Tensor]:
        """The tokens that begin with `written` and the class each gives the next byte: the
        byte after `written`, or `REST` for `written` itself (the token ends there)."""
        if written not in self.after:
            size = len(written)
            pairs = [
                (index, piece[size] if len(piece) > size else REST)
                for index, piece in enumerate(self.pieces)
                if piece.startswith(written)
            ]
            ids, classes = zip(*pairs, strict=True) if pairs else ((), ())
            self.after[written] = (
                torch.tensor(ids, dtype=torch.long),
                torch.tensor(classes, dtype=torch.long),
            )
        return self.after[written]

    def masses(self, logprobs: Tensor) -> Tensor:
        """Each position's mass of each class ([n, V] log-probabilities to [n, classes]
        probabilities), with the gradient of the log-probabilities."""
        first = self.first.to(logprobs.device)
        return logprobs.new_zeros((logprobs.shape[0], BYTE_CLASSES)).index_add(
            1, first, logprobs.exp()
        )


def teacher_classes(
    classes: ByteClasses,
    logprobs: Tensor,
    written: Sequence[bytes],
    before: Tensor | None = None,
    ended: Sequence[bytes | None] = (),
) -> tuple[Tensor, Tensor]:
    """The teacher's next-byte log-probabilities at each position ([n, classes]), given
    what its token there has written so far, and the classes each position keeps apart
    (the others are `REST`'s). `before` ([n, V]) and `ended`: at a position right after
    one of its tokens (those bytes; None elsewhere), its log-probabilities where it
    predicted that token, so that the tokens going on from it count too."""
    masses = classes.masses(logprobs)
    kept = torch.ones_like(masses, dtype=torch.bool)
    for row, prefix in enumerate(written):
        if not prefix:
            continue
        ids, after = classes.following(prefix)
        masses[row] = conditional(logprobs[row], ids, after)
        kept[row] = False
        kept[row, after] = True
        kept[row, REST] = True
    for row, piece in enumerate(ended):
        if before is None or not piece:
            continue
        ids, after = classes.following(piece)
        if len(ids) < 2:  # nothing goes on from it: its next token says it all
            continue
        shares = before[row, ids.to(before.device)].exp()
        stays = (shares * (after.to(before.device) == REST)).sum()
        going = before.new_zeros(BYTE_CLASSES).index_add(0, after.to(before.device), shares)
        going[REST] = 0.0
        masses[row] = (stays * masses[row] + going) / (stays + going.sum()).clamp_min(FLOOR)
    return masses.clamp_min(FLOOR).log(), kept


def conditional(logprobs: Tensor, ids: Tensor, after: Tensor) -> Tensor:
    """The next byte's distribution over the tokens `ids` that begin with the bytes
    written so far (each giving the class `after`), renormalised."""
    device = logprobs.device
    mass = logprobs.new_zeros(BYTE_CLASSES).index_add(
        0, after.to(device), logprobs[ids.to(device)].exp()
    )
    return mass / mass.sum().clamp_min(FLOOR)


def student_classes(classes: ByteClasses, logprobs: Tensor, kept: Tensor) -> Tensor:
    """The student's next-byte log-probabilities at each position ([n, classes]), the
    classes a position does not keep apart (`kept`, the teacher's) folded into `REST`."""
    masses = classes.masses(logprobs)
    folded = masses.masked_fill(kept, 0.0).sum(-1)
    masses = masses.masked_fill(~kept, 0.0)
    masses = masses + torch.nn.functional.one_hot(
        torch.tensor(REST, device=masses.device), BYTE_CLASSES
    ).to(masses.dtype) * folded.unsqueeze(-1)
    return masses.clamp_min(FLOOR).log()
