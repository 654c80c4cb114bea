"""The one exception type the CLI turns into a clean message and a non-zero exit."""

from __future__ import annotations


class Qwen3090Error(Exception):
    """A failure the user can act on: what went wrong, and how to fix it.

    The CLI prints ``qwen3090: error: <message>`` followed by ``fix: <fix>`` and exits with
    ``exit_code``; no traceback, because the message already says everything that matters.
    """

    def __init__(self, message: str, fix: str | None = None, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def render(self) -> str:
        text = f"qwen3090: error: {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text
