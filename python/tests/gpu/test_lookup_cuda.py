"""The lookup matcher and controller on a CUDA device (issue 22; gotchas 20, 21): the same
results as on the CPU, and capturable in a CUDA graph, which proves no step of it reads the
device from the host (a sync inside capture raises); a replay on a changed history gives the
new results, so nothing is frozen at capture. Prints the time of one step.

The overlay module is loaded by file path (torch only); skipped without a GPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

from tests.support.modules import load_module

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LOOKUP_PY = (Path(__file__).resolve().parents[3]
             / "patches/overlay/vllm/v1/worker/gpu/spec_decode/dflash2/lookup.py")


def _load() -> ModuleType:
    return load_module(LOOKUP_PY, "_overlay_dflash2_lookup_cuda")


if TYPE_CHECKING:
    import vllm.v1.worker.gpu.spec_decode.dflash2.lookup as lookup
else:
    lookup = _load()

K, R, MAX_LEN = 15, 4, 262144
CPU = torch.device("cpu")


def history(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    table = torch.randint(0, 1000, (R, MAX_LEN), generator=gen, dtype=torch.int32)
    table[0, 29000:30000] = table[0, 10000:11000]  # state 0 is copying
    table[2, 59990:60000] = table[2, 100:110]  # state 2: a 10-token match, short run
    return table, torch.tensor([30000, 5000, 60000, 20], dtype=torch.int32)


def on_cpu(table: torch.Tensor, total: torch.Tensor, order: torch.Tensor,
           active: torch.Tensor) -> tuple[torch.Tensor, int | None]:
    drafter = lookup.LookupDrafter(K, True, CPU)
    drafts = torch.full((R, K), -1, dtype=torch.int64)
    drafter.step(drafts, order, active, table, total)
    return drafts, drafter.next_num_draft_tokens()


def test_cuda_matches_cpu_and_replays_from_a_captured_graph() -> None:
    dev = torch.device("cuda")
    order = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    active = torch.ones(R, dtype=torch.bool)
    table, total = history(1)
    want, want_count = on_cpu(table, total, order, active)
    assert want_count == K
    drafter = lookup.LookupDrafter(K, True, dev)
    table_d, total_d, order_d, active_d = (x.to(dev) for x in (table, total, order, active))
    drafts = torch.full((R, K), -1, dtype=torch.int64, device=dev)
    blank = drafts.clone()
    drafter.step(drafts, order_d, active_d, table_d, total_d)
    assert torch.equal(drafts.cpu(), want) and drafter.next_num_draft_tokens() == K

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(100):
        drafter.step(drafts, order_d, active_d, table_d, total_d)
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - start) / 100 * 1e6

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        drafter.step(drafts, order_d, active_d, table_d, total_d)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # raises if any op reads the device from the host
        drafter.step(drafts, order_d, active_d, table_d, total_d)

    table2, total2 = history(2)
    table_d.copy_(table2.to(dev))
    drafts.copy_(blank)
    graph.replay()
    want2, count2 = on_cpu(table2, total2, order, active)
    assert torch.equal(drafts.cpu(), want2) and drafter.next_num_draft_tokens() == count2 == K

    table_d[0, 29000:30000] = 7  # state 0 stops copying: no request selects the long block
    drafts.copy_(blank)
    graph.replay()
    assert drafter.next_num_draft_tokens() == 7

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(100):
        graph.replay()
    torch.cuda.synchronize()
    replay_us = (time.perf_counter() - start) / 100 * 1e6
    print(f"lookup step, {R} requests, window {lookup.WINDOW_TOKENS}: eager {eager_us:.0f} us, "
          f"graph replay {replay_us:.0f} us ({torch.cuda.get_device_name()})")
