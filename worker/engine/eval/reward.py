"""The verifiable reward (`loop.reward`): an outcome term beside the teacher's.

Each completion's final answer is graded as the eval grades it (the last \\boxed{} against
its prompt's reference answer), r = 1 if correct else 0, and every token's advantage gains
coef * (r - mean r of the completions of its prompt): only what tells a group's answers
apart moves the policy, as in GRPO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kernel.errors import OPDError
from worker.engine.data.mixing import Item, Pool
from worker.engine.eval.evaluation import Grade
from worker.engine.rollouts.sampling import Completion


def require_answers(pools: Sequence[Pool], grade: Grade | None) -> None:
    """A reward needs a grader and a reference answer for every training prompt."""
    if grade is None:
        raise OPDError("loop.reward needs a grader, and none was opened", code="bad_reward")
    for pool in pools:
        if any(answer is None for answer in pool.prompts.answers):
            raise OPDError(
                f"loop.reward grades answers, but dataset {pool.name!r} has prompts without a "
                "reference answer",
                code="bad_reward",
            )


async def group_rewards(
    completions: Sequence[Completion],
    items: Sequence[Item],
    decode: Callable[[list[int]], str],
    grade: Grade,
) -> list[float]:
    """r in {0, 1} for each completion, graded against its prompt's reference answer."""
    references = [items[c.group].answer for c in completions]
    correct = await grade([decode(c.tokens) for c in completions], [str(r) for r in references])
    return [float(ok) for ok in correct]


def reward_bonus(
    completions: Sequence[Completion], rewards: Sequence[float], coef: float
) -> list[float]:
    """coef * (r - mean r of the completions of the same prompt), per completion."""
    groups = np.asarray([c.group for c in completions])
    values = np.asarray(rewards, dtype=np.float64)
    means = {g: values[groups == g].mean() for g in set(groups.tolist())}
    return [coef * (r - means[g]) for r, g in zip(values.tolist(), groups.tolist(), strict=True)]


def reward_metrics(
    completions: Sequence[Completion], items: Sequence[Item], rewards: Sequence[float]
) -> dict[str, float]:
    """`reward/mean`, and `reward/mean/<dataset>` with several datasets."""
    metrics = {"reward/mean": float(np.mean(rewards))}
    by_pool: dict[str, list[float]] = {}
    for completion, reward in zip(completions, rewards, strict=True):
        by_pool.setdefault(items[completion.group].pool.name, []).append(reward)
    if len({item.pool.name for item in items}) > 1:
        metrics |= {f"reward/mean/{name}": float(np.mean(v)) for name, v in by_pool.items()}
    return metrics
