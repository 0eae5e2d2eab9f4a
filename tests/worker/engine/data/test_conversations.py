"""A file of conversations as a job's prompts: each conversation's `turns`, its assistant
turn the reference; the conversations the unit the seed shuffles, `sample_size` keeps and
a held-out eval draws from; an upload read from the store and checked in a confined child
as its upload was."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernel.chats.conversation import Conversation
from kernel.errors import OPDError
from kernel.spec import FileDataset
from kernel.storage.cache import BlobCache
from kernel.storage.hashing import file_sha256
from tests.chats import OPENAI_EACH, OPENAI_FILE, TRL_MESSAGES, answer, user, write_jsonl
from tests.support import temporary_storage
from worker.engine.data.conversations import conversation_prompts
from worker.engine.data.datasets import load_holdout, load_prompts


def first_question(prompt: object) -> str:
    assert isinstance(prompt, Conversation)
    return next(m.text() for m in prompt.messages if m.role == "user")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "root" / "train.jsonl", OPENAI_FILE)
    return tmp_path / "root"


def test_each_conversation_gives_its_turns_with_their_references():
    conversations = [Conversation.model_validate(row) for row in OPENAI_FILE]
    last, each = (
        conversation_prompts(conversations, "last"),
        conversation_prompts(conversations, "each"),
    )
    assert (len(last), len(each)) == (len(OPENAI_FILE), OPENAI_EACH)
    first = [p for p in each.prompts if first_question(p).startswith("What is 2 + 3?")]
    assert [len(p.messages) for p in first] == [4]  # the answer of weight 0 is only read
    assert each.answers[each.prompts.index(first[0])] == "\\boxed{8}"
    assert all(isinstance(answer, str) for answer in each.answers)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_file_of_conversations_is_shuffled_by_conversation(root: Path, suffix: str):
    if suffix == "parquet":
        pq.write_table(pa.Table.from_struct_array(pa.array(OPENAI_FILE)), root / "train.parquet")
    dataset = FileDataset(path=f"train.{suffix}", seed=3, turns="each")
    prompts = load_prompts(dataset, root, True)
    order = np.random.default_rng(3).permutation(len(OPENAI_FILE))
    shuffled = [Conversation.model_validate(OPENAI_FILE[i]) for i in order]
    assert prompts == conversation_prompts(shuffled, "each")


def test_the_holdout_draws_whole_conversations_outside_the_pool(root: Path):
    dataset = FileDataset(path="train.jsonl", sample_size=3, turns="each", answer_field="messages")
    pool = load_prompts(dataset, root, True)
    held_out = load_holdout(dataset, 2, 7, root, True)
    asked = {first_question(p) for p in pool.prompts}
    assert len({first_question(p) for p in held_out.prompts}) == 2
    assert not asked & {first_question(p) for p in held_out.prompts}
    with pytest.raises(
        OPDError, match=r"asks for 4 conversations but train\.jsonl has 3"
    ) as refused:
        load_holdout(dataset, 4, 7, root, True)
    assert refused.value.code == "bad_eval"


def test_conversations_that_give_no_prompt_are_skipped_and_a_file_of_them_refused(root: Path):
    read_only = {"messages": [user("What is 1 + 1?"), answer(2, weight=0)]}
    write_jsonl(root / "mixed.jsonl", [read_only, *TRL_MESSAGES[:2]])
    assert len(load_prompts(FileDataset(path="mixed.jsonl"), root, True)) == 2
    write_jsonl(root / "none.jsonl", [read_only])
    with pytest.raises(OPDError, match="holds no conversation that gives a prompt"):
        load_prompts(FileDataset(path="none.jsonl"), root, True)


async def test_an_uploaded_file_of_conversations_is_checked_then_read(root: Path, tmp_path: Path):
    with temporary_storage("folder", tmp_path) as storage:
        good, bad = write_jsonl(tmp_path / "good.jsonl", TRL_MESSAGES), tmp_path / "bad.jsonl"
        write_jsonl(bad, [*TRL_MESSAGES, {"messages": [{"role": "bot", "content": "x"}]}])
        for path in (good, bad):
            await storage.put_file(path, file_sha256(path))
        cache = BlobCache(storage, tmp_path / "cache", 1 << 20)
        uploaded = FileDataset(file="file-3", blob=f"{file_sha256(good)}.jsonl")
        prompts = await asyncio.to_thread(load_prompts, uploaded, root, True, cache)
        assert sorted(prompts.answers) == sorted(
            row["messages"][1]["content"] for row in TRL_MESSAGES
        )
        tampered = FileDataset(file="file-4", blob=f"{file_sha256(bad)}.jsonl")
        with pytest.raises(OPDError, match=r"line 7: messages\.0\.role") as refused:
            await asyncio.to_thread(load_prompts, tampered, root, True, cache)
        assert refused.value.code == "bad_dataset"
