"""The DFlash base speculator's ``__init__`` stood in for the lookup probes: it loads a drafter
model, which the CPU tree cannot, and the probes need only the attributes the lookup reads."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch


def stand_in_init(k: int, max_reqs: int, logits_vocab: int | None = None
                  ) -> Callable[[Any, Any, torch.device], None]:
    """An ``__init__`` for ``k`` draft tokens and ``max_reqs`` requests; ``logits_vocab``
    gives it draft logits of that width (probabilistic drafting), None leaves them out."""

    def init(self: Any, vllm_config: Any, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.device = device
        self.num_speculative_steps = k
        self.num_query_per_req = k + 1
        self.max_num_reqs = max_reqs
        self.draft_model_config = SimpleNamespace(
            hf_config=SimpleNamespace(dflash_config={"selector_top_k": 4}))
        self.draft_tokens = torch.zeros(max_reqs, k, dtype=torch.int64)
        self.draft_logits = (None if logits_vocab is None
                             else torch.zeros(max_reqs, k, logits_vocab))

    return init
