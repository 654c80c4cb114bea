"""dflash2-lookup's matcher and controller (issue 22; gotchas 26, 27), on CPU torch tensors.

The overlay module ``vllm/v1/worker/gpu/spec_decode/dflash2/lookup.py`` imports only torch, so
it is loaded by file path: no vLLM, no patched tree. The token history is laid out as the V2
runner keeps it (``all_token_ids`` [max_reqs, max_len] and ``total_len`` by request state, a
batch naming its states through ``idx_mapping``).

The last test decodes with a deterministic toy "model" and verifies drafts the way greedy
verification does (accept the drafts that equal the model's token, then one token of its
own): whatever the drafter proposes, with the lookup and the adaptive block on or off, the
text equals plain greedy decoding, and on a copy task the lookup raises tokens per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

from tests.support.modules import load_module

pytestmark = pytest.mark.unit

LOOKUP_PY = (Path(__file__).resolve().parents[3]
             / "patches/overlay/vllm/v1/worker/gpu/spec_decode/dflash2/lookup.py")


def _load() -> ModuleType:
    return load_module(LOOKUP_PY, "_overlay_dflash2_lookup")


if TYPE_CHECKING:
    import vllm.v1.worker.gpu.spec_decode.dflash2.lookup as lookup
else:
    lookup = _load()

K = 15  # DFLASH_TOKENS=15: the long block; the short one is the drafter's 7
MAX_LEN = 512


def _history(rows: Sequence[Sequence[int]], max_len: int = MAX_LEN) -> tuple[torch.Tensor,
                                                                             torch.Tensor]:
    """``all_token_ids`` (int32, zero past each row's end, as the runner's buffer) and
    ``total_len`` for request states 0..len(rows)-1."""
    table = torch.zeros(len(rows), max_len, dtype=torch.int32)
    for i, row in enumerate(rows):
        table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return table, torch.tensor([len(r) for r in rows], dtype=torch.int32)


def _find(row: Sequence[int], window: int = 64, key: int = 4,
          num: int = K) -> tuple[list[int], int, int]:
    table, total = _history([row])
    tokens, valid = lookup.history_window(table, total, torch.tensor([0]), window)
    res = lookup.find_continuations(tokens, valid, num, key_tokens=key, run_cap=16)
    n = int(res.length[0])
    return res.tokens[0, :n].tolist(), n, int(res.run[0])


# A "document" of distinct tokens; a copy of it reproduces it from the start.
DOC = list(range(100, 140))


def test_a_match_returns_what_followed_it() -> None:
    row = [1, 2, 3, *DOC, 7, 8, *DOC[:10]]
    cont, n, run = _find(row)
    assert cont == DOC[10:25] and n == K
    # The run counts the agreeing tokens back to where the copy started (DOC[0]), capped.
    assert run == 10


def test_no_match_proposes_nothing_and_keeps_every_drafted_token() -> None:
    row = list(range(1, 60))
    cont, n, run = _find(row)
    assert (cont, n, run) == ([], 0, 0)
    table, total = _history([row])
    drafts = torch.arange(900, 900 + K).view(1, K)
    before = drafts.clone()
    drafter = lookup.LookupDrafter(K, adaptive=True, device=torch.device("cpu"), key_tokens=4,
                                   window=64)
    drafter.step(drafts, torch.tensor([0]), torch.tensor([True]), table, total)
    assert torch.equal(drafts, before)
    assert drafter.next_num_draft_tokens() == 7


def test_a_key_shorter_than_asked_does_not_match() -> None:
    # Only 3 tokens agree before the present; the key is 4.
    row = [50, 1, 2, 3, 60, 61, 62, 9, 1, 2, 3]
    assert _find(row)[1] == 0


def test_a_diverging_copy_follows_its_most_recent_source() -> None:
    # The same four tokens were followed by 10.. once and by 20.. later: the copy in progress
    # follows the most recent one.
    row = [5, 6, 7, 8, 10, 11, 12, 0, 0, 5, 6, 7, 8, 20, 21, 22, 23, 0, 5, 6, 7, 8]
    cont, n, _ = _find(row)
    assert cont[:4] == [20, 21, 22, 23]
    assert n == 9  # the occurrence is 9 tokens back


def test_the_continuation_stops_at_the_present_and_the_drafter_keeps_the_rest() -> None:
    # The occurrence is 6 tokens back, so the history holds 6 tokens after it (gotcha 26:
    # past those the drafter's own tokens stand).
    row = [70, 71, 72, 73, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    cont, n, _ = _find(row)
    assert cont == [1, 2, 3, 4, 5, 6] and n == 6
    table, total = _history([row])
    drafts = torch.full((1, K), -7, dtype=torch.int64)
    drafter = lookup.LookupDrafter(K, adaptive=True, device=torch.device("cpu"), key_tokens=4,
                                   window=64)
    drafter.step(drafts, torch.tensor([0]), torch.tensor([True]), table, total)
    assert drafts[0].tolist() == [1, 2, 3, 4, 5, 6] + [-7] * (K - 6)


def test_the_window_limits_how_far_back_it_searches() -> None:
    row = [*DOC[:8], *range(1, 80), *DOC[:4]]
    assert _find(row, window=64)[1] == 0
    assert _find(row, window=128)[0][:4] == DOC[4:8]


def _batch_rows() -> list[list[int]]:
    copying = [9, 9, *DOC, 1, *DOC[:20]]          # copying for 20 tokens: long block
    plain = list(range(200, 260))                  # nothing repeats
    short_match = [3, 4, 5, 6, 31, 32, 9, 3, 4, 5, 6]  # a 4-token match, short run
    tiny = [1, 2]                                  # a history shorter than the key
    return [copying, plain, short_match, tiny]


def _step(rows: list[list[int]], order: Sequence[int], active: Sequence[bool],
          drafter: object | None = None) -> tuple[torch.Tensor, int | None]:
    table, total = _history(rows)
    drafts = torch.full((len(order), K), -1, dtype=torch.int64)
    d = drafter or lookup.LookupDrafter(K, adaptive=True, device=torch.device("cpu"),
                                         key_tokens=4, window=64)
    assert isinstance(d, lookup.LookupDrafter)
    d.step(drafts, torch.tensor(order, dtype=torch.int32), torch.tensor(active), table, total)
    return drafts, d.next_num_draft_tokens()


def test_a_batch_of_mixed_requests_gets_each_row_its_own_lookup() -> None:
    rows = _batch_rows()
    order = [2, 0, 3, 1]  # batch rows name request states out of order
    drafts, count = _step(rows, order, [True] * 4)
    for b, state in enumerate(order):
        alone, _ = _step([rows[state]], [0], [True])
        assert torch.equal(drafts[b], alone[0]), f"batch row {b} (state {state})"
    assert drafts[1, :10].tolist() == DOC[20:30]  # the copying row
    assert drafts[0].tolist() == [31, 32, 9, 3, 4, 5, 6] + [-1] * (K - 7)  # 7 tokens back
    assert (drafts[2] == -1).all() and (drafts[3] == -1).all()  # too short / no repeat
    assert count == K  # one copying request selects the long block for the whole batch


def test_the_controller_takes_the_long_block_only_for_a_copy_in_progress() -> None:
    rows = _batch_rows()
    assert _step(rows, [1, 2, 3], [True] * 3)[1] == 7   # no copy in the batch
    assert _step(rows, [0, 1], [True, True])[1] == K    # a copy in the batch
    # A row that sampled nothing (a prefill chunk) neither selects nor gets lookup tokens.
    drafts, count = _step(rows, [0, 1], [False, True])
    assert count == 7 and (drafts[0] == -1).all()


def test_identical_batches_get_identical_decisions_whatever_ran_before() -> None:
    rows = _batch_rows()
    drafter = lookup.LookupDrafter(K, adaptive=True, device=torch.device("cpu"), key_tokens=4,
                                   window=64)
    first = _step(rows, [1, 2], [True, True], drafter)
    _step(rows, [0, 1, 2], [True] * 3, drafter)  # a copying batch in between (gotcha 27)
    again = _step(rows, [1, 2], [True, True], drafter)
    assert torch.equal(first[0], again[0]) and first[1] == again[1] == 7


def test_not_adaptive_keeps_the_scheduler_count_and_a_short_k_has_nothing_to_choose() -> None:
    cpu = torch.device("cpu")
    assert lookup.LookupDrafter(K, adaptive=False, device=cpu).next_num_draft_tokens() is None
    assert lookup.LookupDrafter(7, adaptive=True, device=cpu).next_num_draft_tokens() is None
    with pytest.raises(ValueError, match="key 0"):
        lookup.LookupDrafter(K, adaptive=True, device=cpu, key_tokens=0)


# --- greedy output under verification ------------------------------------------------------

VOCAB = 50
PERIOD = 23


def toy_model(seq: Sequence[int]) -> int:
    """A deterministic next-token function that mostly copies the text PERIOD tokens back
    (a document being reproduced) and departs from it at fixed positions (the source
    diverges), so lookup drafts are often right and sometimes wrong."""
    n = len(seq)
    if n < PERIOD:
        return (seq[-1] * 7 + n) % VOCAB
    base = seq[n - PERIOD]
    return (base * 3 + 1) % VOCAB if n % 97 == 0 else base


def greedy(prompt: list[int], num: int) -> list[int]:
    seq = list(prompt)
    for _ in range(num):
        seq.append(toy_model(seq))
    return seq[len(prompt):]


Drafter = Callable[[list[int], int], list[int]]


def speculative(prompts: list[list[int]], num: int, drafter: Drafter, use_lookup: bool,
                adaptive: bool) -> tuple[list[list[int]], float]:
    """Decode a batch with drafts verified greedily; returns the outputs and tokens/step.

    Each step: the drafter proposes K tokens per request, the lookup (when on) replaces what
    it can, and the batch verifies the count the controller chose at the previous step (K
    when not adaptive): a request keeps its drafts while they equal the model's token, then
    adds the model's own token."""
    seqs = [list(p) for p in prompts]
    cpu = torch.device("cpu")
    state = lookup.LookupDrafter(K, adaptive=adaptive, device=cpu, key_tokens=8, window=256)
    count = state.short if adaptive else K
    steps = 0
    while any(len(s) - len(p) < num for s, p in zip(seqs, prompts, strict=True)):
        live = [i for i, (s, p) in enumerate(zip(seqs, prompts, strict=True))
                if len(s) - len(p) < num]
        drafts = torch.tensor([drafter(seqs[i], K) for i in live], dtype=torch.int64)
        if use_lookup:
            table, total = _history([seqs[i] for i in live], max_len=1024)
            state.step(drafts, torch.arange(len(live)), torch.ones(len(live), dtype=torch.bool),
                       table, total)
        for row, i in enumerate(live):
            seq = seqs[i]
            for d in drafts[row, :count].tolist():
                target = toy_model(seq)
                seq.append(target)
                if d != target:
                    break
            else:
                seq.append(toy_model(seq))
        steps += 1
        nxt = state.next_num_draft_tokens() if use_lookup else None
        count = nxt if nxt is not None else (state.short if adaptive else K)
    outs = [s[len(p):][:num] for s, p in zip(seqs, prompts, strict=True)]
    emitted = sum(len(s) - len(p) for s, p in zip(seqs, prompts, strict=True))
    return outs, emitted / (steps * len(prompts))


def random_drafter(seed: int) -> Drafter:
    gen = torch.Generator().manual_seed(seed)
    return lambda seq, k: torch.randint(0, VOCAB, (k,), generator=gen).tolist()


def wrong_drafter(seq: list[int], k: int) -> list[int]:
    """Always wrong at the first position, then whatever the model would say after that."""
    out = [(toy_model(seq) + 1) % VOCAB]
    while len(out) < k:
        out.append(toy_model(seq + out))
    return out


# Prompts with no repeats of their own (the toy model makes the output repeat).
PROMPTS = [torch.randperm(VOCAB, generator=torch.Generator().manual_seed(i))[:40].tolist()
           for i in range(3)]


@pytest.mark.parametrize("drafter_name", ["random", "wrong"])
@pytest.mark.parametrize(("use_lookup", "adaptive"), [(False, False), (True, False), (True, True)])
def test_a_wrong_draft_cannot_change_greedy_output(drafter_name: str, use_lookup: bool,
                                                   adaptive: bool) -> None:
    drafter = random_drafter(0) if drafter_name == "random" else wrong_drafter
    want = [greedy(p, 120) for p in PROMPTS]
    got, _ = speculative(PROMPTS, 120, drafter, use_lookup, adaptive)
    assert got == want


def test_on_a_copy_task_the_lookup_raises_tokens_per_step() -> None:
    off = speculative(PROMPTS, 300, random_drafter(1), use_lookup=False, adaptive=False)[1]
    short = speculative(PROMPTS, 300, random_drafter(1), use_lookup=True, adaptive=False)[1]
    adaptive = speculative(PROMPTS, 300, random_drafter(1), use_lookup=True, adaptive=True)[1]
    print(f"tokens/step on the toy copy task: lookup off {off:.2f}, on (k=15 every step) "
          f"{short:.2f}, adaptive {adaptive:.2f}")
    assert off < 1.2 and short > 4 and adaptive > 4
