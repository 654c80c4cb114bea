"""A counter for the spec-decode-attn patch, loaded by every Python process of the device run
(this directory is put on PYTHONPATH by serve_on_device.sh; nothing else imports it).

When vLLM imports ``vllm.v1.attention.ops.spec_decode_attention``, its
``SpecDecodeAttention.forward`` (returns True when the patch's kernel took the call) is wrapped
to count taken calls, split by whether the current CUDA stream was capturing a graph: a call
taken while capturing is baked into that graph and runs on every replay, which is what the
end-to-end tier must show. Lines go to stderr (the server log) as
``gpue2e-probe: spec-decode-attn taken capturing=<bool> count=<n> kernel=<name> cache=<dtype>``
at counts 1, 10, 100 and 1000 of each kind (capturing or not, and the KV cache's dtype).
With ``GPUE2E_SPLIT=triton`` in the environment it also turns the warp-specialised Hopper
pass off, so that a Hopper card serves through the portable Triton split pass (what an RTX
3090 runs); the patch itself has no such switch.

vLLM's API server answers an exception it did not expect with a 500 whose message is the
exception's text, and logs only its type at debug level; an exception without text (a bare
assert) leaves nothing to read. ``create_error_response`` is wrapped too, so each exception it
turns into a response is printed whole, as ``gpue2e-probe: error-response`` and the traceback.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

SPEC_ATTN = "vllm.v1.attention.ops.spec_decode_attention"
ERROR_RESPONSE = "vllm.entrypoints.serve.exception_handling.error_response"
REPORT_AT = (1, 10, 100, 1000)


def _wrap_error_response(module: ModuleType) -> None:
    import traceback

    original = module.create_error_response

    def create_error_response(message: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(message, BaseException):
            text = "".join(traceback.format_exception(message))
            print(f"gpue2e-probe: error-response {type(message).__name__}\n{text}",
                  file=sys.stderr, flush=True)
        return original(message, *args, **kwargs)

    setattr(module, "create_error_response", create_error_response)  # noqa: B010


def _wrap_spec_attn(module: ModuleType) -> None:
    import torch

    cls = module.SpecDecodeAttention
    original = cls.forward
    counts: dict[tuple[bool, str], int] = {}

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        taken = original(self, *args, **kwargs)
        if taken:
            capturing = bool(torch.cuda.is_current_stream_capturing())
            # forward(query, key_cache, ...): the cache's dtype tells the int8 Hopper pass
            # from the 16-bit one, which share the plan's kernel name.
            cache = kwargs.get("key_cache", args[1] if len(args) > 1 else None)
            dtype = str(getattr(cache, "dtype", None)).removeprefix("torch.")
            n = counts[capturing, dtype] = counts.get((capturing, dtype), 0) + 1
            if n in REPORT_AT:
                kernel = getattr(getattr(self, "last_plan", None), "kernel", None)
                print(
                    f"gpue2e-probe: spec-decode-attn taken capturing={capturing} "
                    f"count={n} kernel={kernel} cache={dtype}",
                    file=sys.stderr, flush=True,
                )
        return taken

    cls.forward = forward
    print("gpue2e-probe: spec-decode-attn forward wrapped", file=sys.stderr, flush=True)
    if os.environ.get("GPUE2E_SPLIT") == "triton":
        # The portable Triton split pass on a Hopper card: the kernel a 3090 runs, served.
        # The workspace asks hopper_available() once, by its module-level name.
        setattr(module, "hopper_available", lambda device: False)  # noqa: B010
        print("gpue2e-probe: spec-decode-attn Hopper pass turned off (GPUE2E_SPLIT=triton)",
              file=sys.stderr, flush=True)


WRAPPERS = {SPEC_ATTN: _wrap_spec_attn, ERROR_RESPONSE: _wrap_error_response}


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.done: set[str] = set()

    def find_spec(
        self, name: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        wrap = WRAPPERS.get(name)
        if wrap is None or name in self.done:
            return None
        self.done.add(name)  # find the real module once, with the other finders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            wrap(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
