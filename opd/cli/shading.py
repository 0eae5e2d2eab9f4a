"""A kept rollout in a terminal: each token shaded by its reverse KL (red: the student is
surer than the teacher; blue: less sure), or, without colour, the text and the tokens
the teacher disagreed with most."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.samples.schemas import SamplePublic

SATURATION_KL = 2.0  # a token this far from the teacher gets the strongest shade
WORST_SHOWN = 8
SHOWN_KL = 0.0005
"""The least reverse KL worth listing: below it a token prints as 0.000 (or -0.000)."""
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Bytes a terminal would obey rather than show (ESC, NUL, ...); newlines and tabs stay."""


def printable(text: str) -> str:
    """A model's text as a terminal should show it: control bytes written as escapes
    (`\\x1b`), so a completion cannot move the cursor, recolour or clear the screen."""
    return CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


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
    lines = [head, f"prompt: {printable(sample.prompt)}"]
    if color:
        return "\n".join([*lines, shaded_tokens(sample.tokens, sample.reverse_kl), ""])
    lines.append(f"completion: {printable(sample.completion)}")
    lines.append(f"highest reverse KL: {worst_tokens(sample.tokens, sample.reverse_kl)}")
    return "\n".join([*lines, ""])


def shaded_tokens(tokens: list[str], kls: list[float | None]) -> str:
    return "".join(
        f"{shade(kl)}{printable(token)}\033[0m" for token, kl in zip(tokens, kls, strict=True)
    )


def worst_tokens(tokens: list[str], kls: list[float | None]) -> str:
    """The tokens the student was surest of beyond the teacher, with their reverse KL
    (those that print as 0.000 or below are not listed: nothing to see there)."""
    scored = [
        (token, kl)
        for token, kl in zip(tokens, kls, strict=True)
        if kl is not None and kl >= SHOWN_KL
    ]
    worst = sorted(scored, key=lambda pair: -pair[1])[:WORST_SHOWN]
    if not worst:
        return "none (no token above 0.000)"
    return ", ".join(f"{printable(repr(token))} {kl:.3f}" for token, kl in worst)
