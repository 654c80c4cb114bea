"""The built-in prompt set of the ``draft-vocab`` step, and the reader of a user's prompt file.

The built-in set is small and mixed (chat, reasoning, code, numbers, lists, structured output)
so the counted outputs look like a deployment's traffic; for the real model pass a larger file
of your own traffic: coverage is only as good as the prompts are typical (gotcha 11).
"""

from __future__ import annotations

from pathlib import Path

from qwen3090.errors import Qwen3090Error

BUILTIN_PROMPTS: tuple[str, ...] = (
    "Explain what a KV cache is and why it speeds up decoding.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Summarise the plot of a detective story in three sentences.",
    "List five tips for writing clear commit messages.",
    "What is 17 multiplied by 23? Show your working.",
    "Translate 'the river runs under the old bridge' into French and German.",
    "Write a JSON object describing a book with title, author, year and tags.",
    "Compare TCP and UDP in a short table.",
    "Write a haiku about winter mornings.",
    "How do I reverse a linked list in C? Give code.",
    "Give a step-by-step plan to debug a server that answers slowly.",
    "Write a SQL query that counts orders per customer, highest first.",
    "What are the trade-offs of speculative decoding?",
    "Explain recursion to a ten-year-old.",
    "Write a bash one-liner that finds the ten largest files under a directory.",
    "Describe the water cycle.",
    "Write a short email asking a colleague to review a pull request.",
    "What is the derivative of x^3 * sin(x)?",
    "Write a Rust function that parses a comma-separated list of integers.",
    "Name three differences between a process and a thread.",
    "Write a limerick about a cat who learns to code.",
    "Explain what a hash map is and its average lookup cost.",
    "Convert 72 degrees Fahrenheit to Celsius and explain the formula.",
    "Write a TypeScript interface for a user with id, name, email and optional phone.",
    "Give a recipe for a simple tomato soup.",
    "What causes the seasons on Earth?",
    "Write unit tests in pytest for a function add(a, b).",
    "Explain the difference between precision and recall.",
    "Write a regular expression that matches an ISO date like 2024-05-31.",
    "Outline a five-paragraph essay on renewable energy.",
    "What does the HTTP status code 429 mean and how should a client react?",
    "Write a Dockerfile for a small Python web service.",
    "Explain binary search and its complexity.",
    "Write a dialogue between a customer and a support agent about a late parcel.",
    "Count from one to twenty in words.",
    "What are the main causes of inflation?",
    "Write a YAML config with a server host, port and a list of allowed origins.",
    "Explain how a transformer attention layer works.",
    "Write a Go program that prints the current time every second.",
    "Describe a sunset over the mountains in vivid language.",
)


def read_prompt_file(path: Path) -> list[str]:
    """One prompt per non-blank line of ``path`` (the ``--prompts`` flag)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise Qwen3090Error(
            f"--prompts {path}: cannot be read ({err})",
            fix="pass a UTF-8 text file with one prompt per line to `qwen3090 prepare "
            "draft-vocab --prompts FILE`, or leave --prompts out for the built-in set",
        ) from err
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise Qwen3090Error(
            f"--prompts {path}: holds no prompt (every line is blank)",
            fix="write one prompt per line into the file given to `qwen3090 prepare "
            "draft-vocab --prompts FILE`",
        )
    return prompts
