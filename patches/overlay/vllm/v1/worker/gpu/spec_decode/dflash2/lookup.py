# SPDX-License-Identifier: Apache-2.0
# qwen3090 patch dflash2-lookup: lookup drafting and the adaptive verify block for the DFlash2
# speculator (issue 22; gotchas 18, 20, 21, 26, 27).
#
# Lookup drafting: when a request's latest tokens also occur earlier in its own history
# (prompt + output), the tokens that followed that earlier occurrence are proposed as the next
# draft tokens, in place of the drafter's, as far as the earlier occurrence's continuation
# reaches; the drafter's own tokens stay at the positions past it (gotcha 26: that is where a
# copy lands when its source diverges). The target verifies every draft token as usual, so a
# wrong lookup costs acceptance, never output.
#
# Adaptive verify block: the number of draft tokens the scheduler is told to verify next is
# the drafter's short block (7) or the long block (num_speculative_tokens), chosen for the
# whole batch from this step's lookup result alone. Nothing is held across steps (gotcha 27: a
# held decision made one request's block, and so its greedy text, depend on when the others
# arrived), so identical batches get identical decisions.
#
# Everything here runs on device tensors with no host read, after the drafter's (possibly
# replayed) graph, every step. The one host read, ``next_num_draft_tokens``, is a method the
# model runner calls per step outside any graph (gotchas 20, 21).
#
# The choices, none measured on this implementation yet:
# - the key is the last 8 tokens: the positions a match replaces are the drafter's best
#   (0.79-0.96 acceptance, gotcha 51), so a chance match on a common short phrase costs more
#   than it gains, while a real copy reaches 8 agreeing tokens after 8 copied ones;
# - the search covers the most recent 32768 tokens of the history (about 128 KiB a request
#   read per step; the history lives in host memory mapped into the device);
# - the long block is chosen when some decoding request's match agrees over at least 16
#   tokens and its continuation reaches past the short block.

from dataclasses import dataclass

import torch

KEY_TOKENS = 8
"""The latest tokens a request's history is searched for."""
WINDOW_TOKENS = 32768
"""How many of a request's most recent tokens are searched."""
LONG_RUN_TOKENS = 16
"""Agreeing tokens (the key included) a match needs to select the long verify block."""
SHORT_BLOCK = 7
"""The drafter's trained block: draft tokens verified on a step the lookup does not select."""


@dataclass(frozen=True)
class LookupResult:
    """Per request of a batch (rows), the most recent earlier occurrence of its key."""

    tokens: torch.Tensor
    """[R, K] int64: the tokens that followed the occurrence; 0 past ``length``."""
    length: torch.Tensor
    """[R] int64: how many of ``tokens`` the history holds (0: no occurrence)."""
    run: torch.Tensor
    """[R] int64: how many tokens, ending at the present, agree with those ending at the
    occurrence (at least the key when found, at most the ``run_cap`` searched; 0: none)."""


def history_window(
    all_token_ids: torch.Tensor,
    total_len: torch.Tensor,
    idx_mapping: torch.Tensor,
    window: int = WINDOW_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``window`` tokens of each batch row's history, right-aligned.

    ``all_token_ids`` [max_reqs, max_len] and ``total_len`` [max_reqs] are indexed by request
    state; ``idx_mapping`` [R] maps batch rows to states. Returns int64 tokens [R, W] and a
    bool mask [R, W] of the positions the history holds (a short history leaves its left
    columns invalid)."""
    width = min(window, all_token_ids.shape[1])
    ends = total_len.index_select(0, idx_mapping.long()).long()
    offsets = torch.arange(width, device=all_token_ids.device, dtype=torch.int64)
    positions = ends[:, None] - width + offsets[None, :]
    valid = positions >= 0
    rows = idx_mapping.long()[:, None].expand_as(positions)
    tokens = all_token_ids[rows, positions.clamp(min=0, max=all_token_ids.shape[1] - 1)]
    return tokens.long(), valid


def find_continuations(
    tokens: torch.Tensor,
    valid: torch.Tensor,
    num_tokens: int,
    key_tokens: int = KEY_TOKENS,
    run_cap: int = LONG_RUN_TOKENS,
) -> LookupResult:
    """For each row of ``tokens`` [R, W] (right-aligned, ``valid`` as from
    :func:`history_window`), the most recent earlier occurrence of its last ``key_tokens``
    tokens and up to ``num_tokens`` tokens that followed it.

    The continuation stops where the history ends: an occurrence ``d`` tokens back yields at
    most ``d`` tokens (the drafter covers the rest)."""
    rows, width = tokens.shape
    device = tokens.device
    steps = torch.arange(num_tokens, device=device, dtype=torch.int64)
    candidates = width - key_tokens  # windows that end before the last token
    if candidates < 1 or key_tokens < 1:
        empty = torch.zeros(rows, dtype=torch.int64, device=device)
        return LookupResult(torch.zeros(rows, num_tokens, dtype=torch.int64, device=device),
                            empty, empty.clone())
    key = tokens[:, candidates:]
    key_valid = valid[:, candidates]  # right-aligned: its first token valid, all valid
    grams = tokens[:, : width - 1].unfold(1, key_tokens, 1)  # [R, candidates, key]
    hit = (grams == key[:, None, :]).all(dim=-1) & valid[:, :candidates]
    starts = torch.arange(candidates, device=device, dtype=torch.int64)
    best = torch.where(hit, starts[None, :], -1).amax(dim=1)
    found = (best >= 0) & key_valid
    end = (best + key_tokens - 1).clamp(min=0)  # the occurrence's last token
    distance = (width - 1) - end
    length = torch.where(found, distance.clamp(max=num_tokens), 0)
    follow = (end[:, None] + 1 + steps[None, :]).clamp(max=width - 1)
    continuation = tokens.gather(1, follow)
    continuation = torch.where(steps[None, :] < length[:, None], continuation, 0)
    back = torch.arange(run_cap, device=device, dtype=torch.int64)
    source = end[:, None] - back[None, :]
    present = (width - 1 - back).clamp(min=0)[None, :].expand_as(source)
    source_ok = (source >= 0) & valid.gather(1, source.clamp(min=0))
    agree = source_ok & valid.gather(1, present) & (
        tokens.gather(1, source.clamp(min=0)) == tokens.gather(1, present)
    )
    run = torch.cumprod(agree.long(), dim=1).sum(dim=1)
    run = torch.where(found, run, 0)
    return LookupResult(continuation, length, run)


def apply_lookup(drafts: torch.Tensor, result: LookupResult, active: torch.Tensor) -> None:
    """Overwrite ``drafts`` [R, K] in place with each active row's continuation, as far as it
    reaches; positions past it keep the drafter's tokens (gotcha 26)."""
    steps = torch.arange(drafts.shape[1], device=drafts.device, dtype=torch.int64)
    use = (steps[None, :] < result.length[:, None]) & active[:, None]
    drafts.copy_(torch.where(use, result.tokens.to(drafts.dtype), drafts))


def choose_num_drafts(
    result: LookupResult,
    active: torch.Tensor,
    short: int,
    long: int,
    long_run: int = LONG_RUN_TOKENS,
) -> torch.Tensor:
    """The draft count to verify next, for the whole batch: ``long`` when some active row is
    copying (its match agrees over ``long_run`` tokens and its continuation reaches past the
    short block), else ``short``. A function of this step's rows only (gotcha 27); a 0-d
    int64 tensor on the rows' device, read by the host only between steps."""
    copying = active & (result.run >= long_run) & (result.length > short)
    return torch.where(copying.any(), long, short).to(torch.int64)


class LookupDrafter:
    """Per-speculator lookup state: the configuration and the device scalar the controller
    writes each step for :meth:`next_num_draft_tokens`."""

    def __init__(
        self,
        num_drafts: int,
        adaptive: bool,
        device: torch.device,
        key_tokens: int = KEY_TOKENS,
        window: int = WINDOW_TOKENS,
        long_run: int = LONG_RUN_TOKENS,
        short_block: int = SHORT_BLOCK,
    ) -> None:
        if key_tokens < 1 or window <= key_tokens or long_run < key_tokens:
            raise ValueError(
                f"lookup drafting: key {key_tokens}, window {window}, long run {long_run}: "
                "need 1 <= key < window and key <= long run"
            )
        self.num_drafts = num_drafts
        self.short = min(short_block, num_drafts)
        # With k at most the short block there is only one length to choose.
        self.adaptive = adaptive and num_drafts > self.short
        self.key_tokens = key_tokens
        self.window = window
        self.long_run = long_run
        self.next_count = torch.full((), self.short if self.adaptive else num_drafts,
                                     dtype=torch.int64, device=device)

    def step(
        self,
        drafts: torch.Tensor,
        idx_mapping: torch.Tensor,
        active: torch.Tensor,
        all_token_ids: torch.Tensor,
        total_len: torch.Tensor,
    ) -> LookupResult:
        """Apply the lookup to this step's ``drafts`` [R, K] (in place) and, when adaptive,
        write the next draft count. ``active`` [R] marks rows that sampled a token this step
        (a prefill chunk's row has no output to copy from and its drafts are discarded)."""
        tokens, valid = history_window(all_token_ids, total_len, idx_mapping, self.window)
        result = find_continuations(tokens, valid, drafts.shape[1], self.key_tokens,
                                    self.long_run)
        apply_lookup(drafts, result, active)
        if self.adaptive:
            self.next_count.copy_(
                choose_num_drafts(result, active, self.short, self.num_drafts, self.long_run)
            )
        return result

    def next_num_draft_tokens(self) -> int | None:
        """The draft count the scheduler should schedule next (None: not adaptive, keep
        num_speculative_tokens). Reads a device scalar: call it per step, outside any
        captured graph, never from inside the draft pass (gotchas 20, 21)."""
        if not self.adaptive:
            return None
        return int(self.next_count.item())
