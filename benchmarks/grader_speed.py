"""How many answers per second the eval's grader checks, cold and warm.

    python benchmarks/grader_speed.py [--answers 2000] [--workers 2] [--seed 0]

Grades seeded, realistic (completion, reference answer) pairs: integers, fractions against
decimals, radicals, intervals, polynomials, sets, multiples of pi, some wrong and some with no
box, each with fresh numbers so that math-verify's small parse caches do not flatter it. The
cold start (spawning the workers, importing sympy, the first answer) is timed apart from the
steady state (all the answers on the warm pool).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable

from worker.engine.eval.grading import Grader, last_boxed

Pair = tuple[str, str]  # (completion, reference answer)


def integer(rng: random.Random) -> Pair:
    value = rng.randint(-500, 5000)
    answer = value if rng.random() < 0.6 else value + rng.randint(1, 9)
    return f"Adding the cases gives a total of $\\boxed{{{answer}}}$.", str(value)


def fraction(rng: random.Random) -> Pair:
    p, q = rng.randint(1, 19), rng.choice([2, 4, 5, 8, 10, 16, 20, 25])
    answer = f"{p / q:g}" if rng.random() < 0.5 else f"\\dfrac{{{2 * p}}}{{{2 * q}}}"
    return f"So the probability is \\boxed{{{answer}}}.", f"\\frac{{{p}}}{{{q}}}"


def radical(rng: random.Random) -> Pair:
    a, b = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
    answer = f"\\sqrt{{{a * a * b}}}" if rng.random() < 0.7 else f"{a}\\sqrt{{{b + 1}}}"
    return f"The length is $\\boxed{{{answer}}}$.", f"{a}\\sqrt{{{b}}}"


def interval(rng: random.Random) -> Pair:
    low, high = sorted(rng.sample(range(-20, 20), 2))
    brackets = "(]" if rng.random() < 0.7 else "[]"
    answer = f"{brackets[0]}{low}, {high}{brackets[1]}"
    return f"Therefore $x \\in \\boxed{{{answer}}}$.", f"({low},{high}]"


def polynomial(rng: random.Random) -> Pair:
    r, s = rng.randint(1, 9), rng.randint(1, 9)
    answer = f"(x-{r})(x-{s})" if rng.random() < 0.6 else f"(x-{r})(x+{s})"
    return f"Factoring, $p(x) = \\boxed{{{answer}}}$.", f"x^2 - {r + s}x + {r * s}"


def finite_set(rng: random.Random) -> Pair:
    roots = rng.sample(range(-9, 10), 3)
    shuffled = rng.sample(roots, 3)
    answer = ", ".join(map(str, shuffled))
    return f"The solutions are \\boxed{{{answer}}}.", "\\{" + ", ".join(map(str, roots)) + "\\}"


def pi_multiple(rng: random.Random) -> Pair:
    p, q = rng.randint(1, 11), rng.choice([2, 3, 4, 6])
    answer = f"\\frac{{{p}\\pi}}{{{q}}}" if rng.random() < 0.6 else f"{p / q:.2f}\\pi"
    return f"The angle is $\\boxed{{{answer}}}$.", f"\\frac{{{p}}}{{{q}}}\\pi"


def no_box(rng: random.Random) -> Pair:
    return f"I keep getting {rng.randint(1, 99)} but I am not sure, let me check again", "7"


KINDS: list[tuple[Callable[[random.Random], Pair], float]] = [
    (integer, 0.40),
    (fraction, 0.15),
    (radical, 0.10),
    (interval, 0.08),
    (polynomial, 0.10),
    (finite_set, 0.05),
    (pi_multiple, 0.07),
    (no_box, 0.05),
]


def realistic_pairs(count: int, seed: int) -> list[Pair]:
    """`count` (completion, reference) pairs in the proportions of KINDS."""
    rng = random.Random(seed)
    makers, weights = zip(*KINDS, strict=True)
    return [maker(rng) for maker in rng.choices(makers, weights, k=count)]


async def measure(answers: int, workers: int, seed: int) -> None:
    pairs = [(last_boxed(completion), ref) for completion, ref in realistic_pairs(answers, seed)]
    async with Grader(workers=workers) as grader:
        started = time.perf_counter()
        await grader.grade([("\\frac{3}{7}", "\\frac{6}{14}")])
        cold = time.perf_counter() - started

        started = time.perf_counter()
        verdicts = await grader.grade(pairs)
        steady = time.perf_counter() - started

    print(f"cold start: the pool (workers={workers}) started and graded one answer in {cold:.2f} s")
    print(
        f"steady state: {answers} answers in {steady:.2f} s = "
        f"{answers / steady:.1f} answers/s (workers={workers})"
    )
    counts = Counter(verdicts)
    print("verdicts: " + ", ".join(f"{verdict} {n}" for verdict, n in sorted(counts.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=2000, help="answers to grade warm")
    parser.add_argument("--workers", type=int, default=2, help="grader processes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the answers")
    args = parser.parse_args()
    asyncio.run(measure(args.answers, args.workers, args.seed))


if __name__ == "__main__":
    main()
