"""Probe for dflash2-lookup.patch, run inside a vLLM tree (stock or patched) on the CPU.

The patched DFlash2Speculator's own ``__init__``, ``propose``, ``bind_token_history`` and
``next_num_draft_tokens`` run, and the runner's own ``take_draft_token_ids``, on a real
``InputBatch`` and a token history laid out as the V2 runner keeps it. Two things need a GPU
and are stood in for: the base DFlashSpeculator's ``__init__`` (it loads the drafter's config
and allocates its buffers; the stand-in sets the attributes DFlash2 reads) and the draft pass
(the stand-in writes DRAFTER into every draft slot, as a captured graph replay writes the
drafter's tokens). The runner is built without its ``__init__`` (it allocates pinned and GPU
memory), so its ``bind_token_history`` call is made here by hand.

argv[1]: off | adaptive | async | probabilistic (the VLLM_DFLASH2_* variables come from the
caller's environment).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from types import SimpleNamespace
from typing import Any

import torch
from _dflash_stand_in import stand_in_init

K = 15
MAX_REQS = 4
MAX_LEN = 256
DRAFTER = 7777
DOC = list(range(100, 160))


def report(result: dict[str, Any]) -> None:
    sys.stdout.write("QWEN3090-PROBE " + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def history() -> tuple[torch.Tensor, torch.Tensor]:
    rows = [
        [1, 2, *DOC, 3, *DOC[:20]],  # 0: copying DOC for 20 tokens
        list(range(300, 360)),  # 1: nothing repeats
        [400, 401, *([*range(500, 510)] * 3)],  # 2: period 10: its source is 10 tokens back
    ]
    table = torch.zeros(MAX_REQS, MAX_LEN, dtype=torch.int32)
    total = torch.zeros(MAX_REQS, dtype=torch.int32)
    for i, row in enumerate(rows):
        table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        total[i] = len(row)
    return table, total


def main() -> None:
    mode = sys.argv[1]
    from vllm.v1.outputs import DraftTokenIds
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
    from vllm.v1.worker.gpu.spec_decode.utils import DraftTokensHandler

    patched = hasattr(DFlash2Speculator, "next_num_draft_tokens")
    if not patched:
        report({"patched": False})
        return
    cpu = torch.device("cpu")

    def draft_pass(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        n = input_batch.num_reqs
        self.draft_tokens[:n] = DRAFTER
        drafts: torch.Tensor = self.draft_tokens[:n]
        return drafts

    DFlashSpeculator.__init__ = stand_in_init(  # type: ignore[method-assign,assignment]
        K, MAX_REQS, 8 if mode == "probabilistic" else None)
    DFlashSpeculator.propose = draft_pass  # type: ignore[method-assign]
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=mode == "async"))
    try:
        # Any: the methods the patch adds are unknown to the installed vllm's types.
        spec: Any = DFlash2Speculator(config, cpu)  # type: ignore[arg-type]
    except ValueError as exc:
        report({"patched": True, "init_error": str(exc)})
        return
    table, total = history()
    spec.bind_token_history(table, total)

    runner = object.__new__(GPUModelRunner)
    runner.speculator = spec
    handler = object.__new__(DraftTokensHandler)
    runner.draft_tokens_handler = handler
    buffers = InputBuffers(max_num_reqs=MAX_REQS, max_num_tokens=64, device=cpu)

    def step(states: list[int], sampled: list[int], dummy: bool = False) -> dict[str, Any]:
        batch = InputBatch.make_dummy(len(states), len(states), buffers)
        batch = dataclasses.replace(batch, idx_mapping=torch.tensor(states))
        none = torch.empty(0)
        drafts = spec.propose(batch, {}, {}, none, None, torch.tensor(sampled),
                              torch.zeros(len(states), dtype=torch.int32), none, none, none,
                              none, dummy_run=dummy)
        handler.req_ids = batch.req_ids
        handler.draft_tokens_np = None
        handler.num_draft_tokens = drafts.shape[1]
        taken = runner.take_draft_token_ids()
        assert isinstance(taken, DraftTokenIds)
        return {"drafts": drafts.tolist(),
                "scheduled": [len(d) for d in taken.draft_token_ids]}

    report({
        "patched": True,
        "lookup": spec.lookup is not None,
        "adaptive": bool(spec.lookup is not None and spec.lookup.adaptive),
        "plain": step([1], [1]),
        "copying": step([2, 0], [1, 1]),
        "plain_again": step([1], [1]),
        "prefill_row": step([0, 1], [0, 1]),
        "dummy": step([0], [1], dummy=True),
    })


if __name__ == "__main__":
    main()
