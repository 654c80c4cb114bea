"""Run in a vLLM tree: the mtp-draft-vocab reader and restricted head, driven directly.

argv: WORK_DIR. Prints one JSON object; on a tree without the patch, {"module": false}.
"""

import json
import sys
from pathlib import Path

import torch
from torch import nn

VOCAB, HIDDEN = 96, 32
IDS = [41, 7, 3, 88, 11, 60, 25]


class Int8Head(nn.Module):
    """An lm_head whose weight is not a plain float matrix (as a quantized one)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.to(torch.int8), requires_grad=False)


def main() -> None:
    work = Path(sys.argv[1])
    try:
        from vllm.model_executor.models import mtp_draft_vocab as mdv
    except ImportError:
        print(json.dumps({"module": False}))
        return
    torch.manual_seed(0)
    lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(256, HIDDEN)
    full = lm_head(hidden).detach()

    raw = work / "raw"
    raw.mkdir()
    model = work / "model"
    model.mkdir()
    torch.save(torch.tensor(IDS, dtype=torch.int64), model / mdv.DRAFT_VOCAB_FILE)

    head = mdv.DraftVocabHead.from_model_dir(str(model), VOCAB)
    assert head is not None
    head.bind(lm_head, tp_size=1)
    logits = head.logits(hidden, lambda: full)
    assert logits is not None
    top = head.top_tokens(hidden, lambda: full)

    masked = mdv.DraftVocabHead(torch.tensor(IDS), VOCAB, "mask")
    masked.bind(Int8Head(lm_head.weight.detach()), tp_size=1)
    mask_logits = masked.logits(hidden, lambda: full)
    assert mask_logits is not None
    mask_top = masked.top_tokens(hidden, lambda: full)

    reference = torch.full_like(full, float("-inf"))
    reference[:, IDS] = full[:, IDS]

    errors: dict[str, str | None] = {}
    for name, tensor in (
        ("float", torch.tensor(IDS, dtype=torch.float32)),
        ("out_of_range", torch.tensor([*IDS, VOCAB], dtype=torch.int64)),
        ("repeated", torch.tensor([*IDS, IDS[0]], dtype=torch.int64)),
        ("two_dim", torch.tensor([IDS], dtype=torch.int64)),
    ):
        bad = work / name
        bad.mkdir()
        torch.save(tensor, bad / mdv.DRAFT_VOCAB_FILE)
        try:
            mdv.load_draft_vocab(str(bad), VOCAB)
            errors[name] = None
        except ValueError as err:
            errors[name] = str(err)

    int32 = work / "int32"
    int32.mkdir()
    torch.save(torch.tensor(IDS, dtype=torch.int32), int32 / mdv.DRAFT_VOCAB_FILE)
    int32_ids = mdv.load_draft_vocab(str(int32), VOCAB)
    as_list = work / "list"
    as_list.mkdir()
    torch.save(list(IDS), as_list / mdv.DRAFT_VOCAB_FILE)
    list_ids = mdv.load_draft_vocab(str(as_list), VOCAB)

    print(json.dumps({
        "module": True,
        "int32_and_list_read_as_int64": [
            None if t is None else [str(t.dtype), t.tolist()]
            for t in (int32_ids, list_ids)
        ],
        "raw_dir_head": mdv.DraftVocabHead.from_model_dir(str(raw), VOCAB) is not None,
        "sub_weight": head.weight is not None and tuple(head.weight.shape) == (len(IDS), HIDDEN),
        "finite_ids": sorted(torch.isfinite(logits).any(0).nonzero().flatten().tolist()),
        "max_diff_vs_reference": float(
            (logits[:, IDS] - reference[:, IDS]).abs().max()),
        "top_equals_reference": bool(torch.equal(top, reference.argmax(-1))),
        "top_ids": sorted(set(top.tolist())),
        "full_argmax_outside": int((~torch.isin(full.argmax(-1), torch.tensor(IDS))).sum()),
        "mask_path": masked.weight is None,
        "mask_equals_reference": bool(torch.equal(mask_logits, reference)),
        "mask_top_equals_reference": bool(torch.equal(mask_top, reference.argmax(-1))),
        "errors": errors,
    }))


if __name__ == "__main__":
    main()
