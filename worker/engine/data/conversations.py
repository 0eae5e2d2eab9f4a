"""Conversations as OPD prompts: each conversation (kernel/chats) gives the prompts its
`turns` choose (`Conversation.points`): the messages before an assistant turn it trains on,
that turn the reference answer (graders, a self teacher's `reference`), or a conversation
that ends with a user's turn as a whole, with none. Any source of conversations becomes a
pool of prompts here: a file's (`file_prompts`, `file_holdout`), and whatever else holds
them.

A file's conversations are the unit its seed shuffles, `sample_size` keeps and a held-out
eval draws from, so no conversation gives prompts to both training and eval; each is then
taken apart into its prompts, in its order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from kernel.chats.conversation import Conversation
from kernel.chats.files import ChatFileInvalid, ChatFormat, check_chat_file, read_conversations
from kernel.errors import OPDError
from kernel.spec import FileDataset, StoredCompletionsDataset
from kernel.spec.data import Turns
from kernel.tables.bounds import TableLimits
from kernel.tables.reading import confined_read
from worker.engine.data.holdout import PoolName, held_out
from worker.engine.data.prompts import Prompt, Prompts

logger = logging.getLogger(__name__)


def conversation_prompts(conversations: Sequence[Conversation], turns: Turns) -> Prompts:
    """Each conversation's prompts (`turns` of them), in order, with their references."""
    prompts: list[Prompt] = []
    answers: list[str | None] = []
    for conversation in conversations:
        for point in conversation.points(turns):
            prompts.append(conversation.prompt(point))
            answers.append(conversation.reference(point))
    return Prompts(prompts, answers)


def stored_prompts(dataset: StoredCompletionsDataset, feedback_only: bool) -> Prompts:
    """The prompts of stored completions, in the order they were stored: each one's
    conversation up to the answered turn, the answer served its reference, the feedback
    given on it joined; with `feedback_only` (a teacher that reads feedback scores them)
    those with none are left out, and counted."""
    prompts: list[Prompt] = []
    answers: list[str | None] = []
    feedback: list[str | None] = []
    for row in dataset.rows or []:
        said = "\n".join(row.feedback) or None
        if feedback_only and said is None:
            continue
        chat = {"messages": row.messages} | ({"tools": row.tools} if row.tools else {})
        prompts.append(Conversation.model_validate(chat))
        answers.append(row.answer)
        feedback.append(said)
    left_out = len(dataset.rows or []) - len(prompts)
    if not prompts:
        raise OPDError(
            f"none of the {left_out} stored completions read has feedback, which the "
            "teacher reads (teacher.self.context: feedback): give feedback on them "
            "(POST /v1/chat/completions/{id}/feedback) or filter with has_feedback: true",
            code="bad_dataset",
        )
    return Prompts(prompts, answers, feedback, left_out)


def check_file(path: Path, kind: str, format: ChatFormat, limits: TableLimits) -> None:
    """Every row of an uploaded file of conversations checked in a confined child before a
    job reads it, as its upload was; once a process for each file (a job opens its file up
    to three times, a sweep's trials more)."""
    status = path.stat()
    check_once(path, kind, format, limits, status.st_ino, status.st_size)


@lru_cache(maxsize=256)
def check_once(
    path: Path, kind: str, format: ChatFormat, limits: TableLimits, inode: int, size: int
) -> None:
    try:
        confined_read(check_rows, path, kind, limits, format)
    except ChatFileInvalid as invalid:
        raise OPDError(str(invalid), code="bad_dataset") from None


def check_rows(path: Path, kind: str, format: ChatFormat, limits: TableLimits) -> None:
    check_chat_file(path, kind, format, limits)


def answerable(conversations: Sequence[Conversation], name: str) -> list[Conversation]:
    """The conversations that give a prompt (some may only be read: every assistant turn
    weight 0); a file with none trains nothing, an error."""
    kept = [conversation for conversation in conversations if conversation.points("each")]
    if not kept:
        raise OPDError(f"{name} holds no conversation that gives a prompt", code="bad_dataset")
    if len(kept) < len(conversations):
        logger.warning(
            "Skipped %d conversations of %s that give no prompt",
            len(conversations) - len(kept),
            name,
        )
    return kept


def shuffled(
    path: Path, kind: str, format: ChatFormat, dataset: FileDataset, limits: TableLimits
) -> list[Conversation]:
    """The file's conversations that give a prompt, shuffled with the dataset's seed."""
    conversations = answerable(read_conversations(path, kind, format, limits), dataset.where())
    order = np.random.default_rng(dataset.seed).permutation(len(conversations))
    return [conversations[i] for i in order]


def file_prompts(
    path: Path, kind: str, format: ChatFormat, dataset: FileDataset, limits: TableLimits
) -> Prompts:
    """The training prompts of a file of conversations: the first `sample_size` of its
    shuffled conversations (every one, when not given), each one's `turns`."""
    conversations = shuffled(path, kind, format, dataset, limits)
    return conversation_prompts(conversations[: dataset.sample_size], dataset.turns)


def file_holdout(
    path: Path,
    kind: str,
    format: ChatFormat,
    dataset: FileDataset,
    count: int,
    seed: int,
    limits: TableLimits,
) -> Prompts:
    """The prompts of `count` conversations, drawn with `seed` from those the training
    pool does not hold (each one's `turns`)."""
    conversations = shuffled(path, kind, format, dataset, limits)
    pool = PoolName("conversations", dataset.where())
    places = held_out(len(conversations), dataset.sample_size, count, seed, pool)
    return conversation_prompts([conversations[i] for i in places], dataset.turns)
