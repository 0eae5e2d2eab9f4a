"""A kept rollout in a terminal: each token shaded by its reverse KL (red: the student is
surer than the teacher; blue: less sure), or, without colour, the text and the tokens
the teacher disagreed with most."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.samples.schemas import SamplePublic

SATURATION_KL = 2.0  # a token this far from the teacher gets the strongest shade
WORST_SHOWN = 8


def wants_color() -> bool:
    """Shade only a terminal, and not where NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def shade(kl: float | None) -> str:
    """A 24-bit background colour escape for one token's reverse KL."""
    if kl is None:
        return "\033[48;2;90;90;90m"
    strength = min(1.0, abs(kl) / SATURATION_KL)
    fade = int(255 * (1 - strength))
    red, blue = (255, fade) if kl > 0 else (fade, 255)
    return f"\033[48;2;{red};{fade};{blue}m\033[38;2;0;0;0m"


def sample_text(sample: SamplePublic, color: bool) -> str:
    kls = [v for v in sample.reverse_kl if v is not None]
    mean = sum(kls) / len(kls) if kls else float("nan")
    cut = " (cut to the stored length)" if sample.truncated else ""
    head = f"step {sample.step} #{sample.position}: reverse KL mean {mean:.4f}{cut}"
    lines = [head, f"prompt: {sample.prompt}"]
    if color:
        return "\n".join([*lines, shaded_tokens(sample.tokens, sample.reverse_kl), ""])
    lines.append(f"completion: {sample.completion}")
    lines.append(f"highest reverse KL: {worst_tokens(sample.tokens, sample.reverse_kl)}")
    return "\n".join([*lines, ""])


def shaded_tokens(tokens: list[str], kls: list[float | None]) -> str:
    return "".join(f"{shade(kl)}{token}\033[0m" for token, kl in zip(tokens, kls, strict=True))


def worst_tokens(tokens: list[str], kls: list[float | None]) -> str:
    """The tokens the teacher disagreed with most, with their reverse KL."""
    scored = [(token, kl) for token, kl in zip(tokens, kls, strict=True) if kl is not None]
    worst = sorted(scored, key=lambda pair: -pair[1])[:WORST_SHOWN]
    return ", ".join(f"{token!r} {kl:.3f}" for token, kl in worst)
