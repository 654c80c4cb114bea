"""The greedy copy task of the SPEC=dflash2 lives (exercise_server.py) and what its record means.

Shared by the device side (which builds the prompts and reads vLLM's counters) and the tests
(which judge the record), so both count the same way. Standard library only: it runs on the
device machine's Python as well as here.
"""

from __future__ import annotations

import random

# The lookup's key (lookup.py KEY_TOKENS): a position "repeats context" when the KEY tokens
# ending there also occur earlier in the request's history.
KEY_TOKENS = 8
COPY_MAX_TOKENS = 640
OTHER_MAX_TOKENS = 160

_WORD_TEXT = (
    "the river passes the garden bridge every morning while seven small boats wait near the "
    "old mountain city and a blue window reads the first line of a long document about cache "
    "memory kernels tokens blocks graphs and the last question of the evening"
)


def document(lines: int = 24, seed: int = 22) -> str:
    """A numbered document of a few hundred tokens, the same on every run."""
    rng = random.Random(seed)
    vocabulary = _WORD_TEXT.split()
    out = []
    for i in range(lines):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(8, 13))]
        out.append(f"{i + 1}. " + " ".join(words).capitalize() + ".")
    return "\n".join(out)


def copy_prompt() -> str:
    """The document, an instruction to repeat it, and the start of the copy."""
    doc = document()
    return (f"Here is a document.\n\n{doc}\n\nRepeat the document above exactly, line by "
            f"line, starting with its first line.\n\n{doc.splitlines()[0].split(' ', 1)[0]}")


def other_prompt() -> str:
    """A short prompt with nothing to copy (the second row of the mixed batch)."""
    return "Write one short sentence about the weather in the mountain city."


def repeat_fraction(prompt_ids: list[int], output_ids: list[int], key: int = KEY_TOKENS) -> float:
    """The fraction of output positions whose last ``key`` tokens (history included) also occur
    earlier in prompt + output: where a lookup can match. 0.0 for an empty output."""
    history = list(prompt_ids) + list(output_ids)
    seen: dict[tuple[int, ...], int] = {}
    hits = 0
    start = len(prompt_ids)
    for end in range(key, len(history) + 1):
        gram = tuple(history[end - key:end])
        if end > start and gram in seen:
            hits += 1
        seen.setdefault(gram, end)
    return hits / len(output_ids) if output_ids else 0.0


def tokens_per_step(accepted: float | None, drafts: float | None) -> float | None:
    """Mean tokens a verify step emitted: accepted draft tokens per draft (a request's step)
    plus the one token the target samples itself. None without drafts."""
    if accepted is None or not drafts:
        return None
    return accepted / drafts + 1.0


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts); None if
    identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
