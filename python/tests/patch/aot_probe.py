"""Run by test_aot_cache_load_patch.py in a subprocess, with the vLLM under test first on the path.

Saves an AOT artifact the way vLLM's CPU platform makes one (torch.compile with the stock
inductor backend, fullgraph, aot_compile), then loads it through vLLM's own
``_try_load_aot_compiled_fn`` and prints one JSON line: did it load, and does the loaded
function compute what eager does.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch


class Tiny(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2.0 + 1.0


def main() -> int:
    import vllm
    from vllm.compilation.decorators import _try_load_aot_compiled_fn
    from vllm.config import VllmConfig

    path = sys.argv[1]
    backend = sys.argv[2] if len(sys.argv) > 2 else "inductor"
    model = Tiny()
    example = torch.arange(-4.0, 4.0)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        # Compiled unbound, called with the module first: how vLLM's decorator does it.
        wrapper = torch.compile(Tiny.forward, fullgraph=True, backend=backend)
        # torch sets aot_compile on the wrapper at runtime (only with enable_aot_compile);
        # torch.compile is typed as returning the wrapped function's type, which lacks it.
        compiled = wrapper.aot_compile(((model, example), {}))  # type: ignore[attr-defined]
    compiled.save_compiled_function(path)

    config = VllmConfig()
    # The loader reads these attributes of the decorated model; the artifact, the unpickling
    # and the finalize step under test are vLLM's and torch's own.
    holder = SimpleNamespace(
        vllm_config=config,
        compilation_config=config.compilation_config,
        _is_encoder=False,
        forward=model.forward,
    )
    loaded = _try_load_aot_compiled_fn(holder, path)
    result: dict[str, object] = {"vllm": vllm.__file__, "loaded": loaded is not None}
    if loaded is not None:
        got = loaded(model, example)
        result["matches_eager"] = bool(torch.equal(got, model(example)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
