"""Every rule and warning of PROFILES.md beyond the table rows, and capability gating."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.plan import PlatformFacts
from tests.support.planning import FULL, STOCK, arg_map, json_flag, plan_for

pytestmark = pytest.mark.unit


def _warned(plan_warnings: tuple[str, ...], *needles: str) -> bool:
    return any(all(n in w for n in needles) for w in plan_warnings)


# ---- common rules ---------------------------------------------------------------------------


def test_wsl2_turns_expandable_segments_off(tmp_path: Path) -> None:
    bare = plan_for({}, cwd=tmp_path)
    wsl = plan_for({}, facts=PlatformFacts(wsl2=True), cwd=tmp_path)
    assert bare.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert wsl.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


def test_port_host_api_servers_and_tools(tmp_path: Path) -> None:
    plan = plan_for({"PORT": "18099", "HOST": "::1", "API_SERVERS": "3",
                     "TOOL_PARSER": "hermes"}, cwd=tmp_path)
    flags = arg_map(plan.vllm_args)
    assert (flags["--port"], flags["--host"], flags["--api-server-count"]) == ("18099", "::1", "3")
    assert flags["--tool-call-parser"] == "hermes"
    off = arg_map(plan_for({"TOOLS": "0"}, cwd=tmp_path).vllm_args)
    assert "--enable-auto-tool-choice" not in off and "--tool-call-parser" not in off


def test_vision_keeps_the_tower_and_offloads_it(tmp_path: Path) -> None:
    plan = plan_for({"VISION": "1"}, cwd=tmp_path)
    assert "--language-model-only" not in plan.vllm_args
    assert plan.env["VLLM_VISION_TOWER_CPU_OFFLOAD"] == "1"
    resident = plan_for({"VISION": "1", "VISION_OFFLOAD": "0", "SPEC": "dflash2"}, cwd=tmp_path)
    assert "VLLM_VISION_TOWER_CPU_OFFLOAD" not in resident.env
    assert _warned(resident.warnings, "gotcha 8")


def test_extra_args_come_last_verbatim(tmp_path: Path) -> None:
    plan = plan_for({"EXTRA_ARGS": "--tensor-parallel-size 2 --seed '7'"}, cwd=tmp_path)
    assert list(plan.vllm_args[-4:]) == ["--tensor-parallel-size", "2", "--seed", "7"]


def test_prompt_tokens_details_always(tmp_path: Path) -> None:
    for value in ("0", "1"):
        assert "--enable-prompt-tokens-details" in plan_for(
            {"PREFIX_CACHE": value}, cwd=tmp_path
        ).vllm_args


def test_model_default_prefers_the_fast_variant(tmp_path: Path) -> None:
    assert plan_for({}, cwd=tmp_path).model == "models/Qwen3.8-27B-W4A16-AutoRound"
    (tmp_path / "models/Qwen3.8-27B-W4A16-AutoRound-fast").mkdir(parents=True)
    plan = plan_for({}, cwd=tmp_path)
    assert plan.model == "models/Qwen3.8-27B-W4A16-AutoRound-fast"
    assert plan.vllm_args[0] == plan.model


def test_draft_default_needs_weights(tmp_path: Path) -> None:
    plain = tmp_path / "models/Qwen3.8-27B-DFlash2"
    plain.mkdir(parents=True)
    (plain / "model.safetensors").write_bytes(b"")
    (tmp_path / "models/Qwen3.8-27B-DFlash2-W4A16").mkdir()  # no weights: not chosen
    plan = plan_for({"SPEC": "dflash2"}, cwd=tmp_path)
    assert plan.draft == "models/Qwen3.8-27B-DFlash2"
    assert json_flag(plan, "--speculative-config")["model"] == "models/Qwen3.8-27B-DFlash2"


# ---- single-user overrides -----------------------------------------------------------------


def test_draft_tokens_and_sampling_override_mtp(tmp_path: Path) -> None:
    plan = plan_for({"DRAFT_TOKENS": "2", "DRAFT_SAMPLE": "greedy"}, cwd=tmp_path)
    assert json_flag(plan, "--speculative-config") == {
        "method": "mtp", "num_speculative_tokens": 2, "draft_sample_method": "greedy"}


def test_dflash_lengths_and_pool_overrides(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "DFLASH_MAX_LEN": "8192", "MAX_LEN": "9000",
                     "KV_MEM": "3000000000"}, cwd=tmp_path)
    flags = arg_map(plan.vllm_args)
    assert flags["--max-model-len"] == "8192"  # DFLASH_MAX_LEN wins under dflash2
    assert flags["--kv-cache-memory-bytes"] == "3000000000"
    unpinned = arg_map(plan_for({"SPEC": "dflash2", "KV_MEM": ""}, cwd=tmp_path).vllm_args)
    assert "--kv-cache-memory-bytes" not in unpinned
    assert unpinned["--gpu-memory-utilization"] == "0.93"


def test_cg_is_capped_at_64_unless_given(tmp_path: Path) -> None:
    capped = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "15", "MAX_SEQS": "8"}, cwd=tmp_path)
    assert json_flag(capped, "--compilation-config")["max_cudagraph_capture_size"] == 64
    given = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "15", "MAX_SEQS": "8", "CG": "128"},
                     cwd=tmp_path)
    assert json_flag(given, "--compilation-config")["max_cudagraph_capture_size"] == 128
    assert _warned(given.warnings, "gotcha 34", "VLLM_V2_CUDAGRAPH_MEM_MIB")


def test_async_follows_lookup_and_block(tmp_path: Path) -> None:
    no_lookup = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "15", "LOOKUP": "0"}, cwd=tmp_path)
    assert "--async-scheduling" in no_lookup.vllm_args
    forced = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "15", "ASYNC_SCHED": "1"},
                      cwd=tmp_path)
    assert "--async-scheduling" in forced.vllm_args
    assert _warned(forced.warnings, "ASYNC_SCHED=1", "gotchas 18, 19")
    sync = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "7", "ASYNC_SCHED": "0"}, cwd=tmp_path)
    assert "--no-async-scheduling" in sync.vllm_args


def test_adaptive_lookup_off_only_when_lookup_is_implicit(tmp_path: Path) -> None:
    knobs = {"SPEC": "dflash2", "CTX": "huge", "DFLASH_TOKENS": "15", "PREFIX_CACHE": "1"}
    implicit = plan_for(knobs, cwd=tmp_path)
    assert implicit.env["VLLM_DFLASH2_LOOKUP_ADAPTIVE"] == "0"
    assert _warned(implicit.warnings, "VLLM_DFLASH2_LOOKUP_ADAPTIVE=0", "turn 2")
    explicit = plan_for({**knobs, "LOOKUP": "1"}, cwd=tmp_path)
    assert "VLLM_DFLASH2_LOOKUP_ADAPTIVE" not in explicit.env
    chosen = plan_for({**knobs, "LOOKUP_ADAPTIVE": "1"}, cwd=tmp_path)
    assert chosen.env["VLLM_DFLASH2_LOOKUP_ADAPTIVE"] == "1"


def test_huge_cudagraph_mode_rule(tmp_path: Path) -> None:
    chosen = plan_for({"CTX": "huge", "CUDAGRAPH_MODE": "FULL_AND_PIECEWISE"}, cwd=tmp_path)
    assert json_flag(chosen, "--compilation-config")["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert _warned(chosen.warnings, "Bug B", "gotcha 33")
    dflash = plan_for({"CTX": "huge", "SPEC": "dflash2"}, cwd=tmp_path)
    assert "cudagraph_mode" not in json_flag(dflash, "--compilation-config")


def test_mtp_prefix_cache_below_huge_warns_of_the_v1_runner(tmp_path: Path) -> None:
    for ctx in ("fast", "long"):
        plan = plan_for({"CTX": ctx, "PREFIX_CACHE": "1"}, cwd=tmp_path)
        assert _warned(plan.warnings, "Bug B", "V1 runner", f"CTX={ctx}")
    quiet = [
        plan_for({"PREFIX_CACHE": "0"}, cwd=tmp_path),
        plan_for({"PREFIX_CACHE": "1", "CUDAGRAPH_MODE": "PIECEWISE"}, cwd=tmp_path),
        plan_for({"PREFIX_CACHE": "1", "SPEC": "off"}, cwd=tmp_path),
    ]
    assert not any(_warned(p.warnings, "V1 runner") for p in quiet)


def test_spec_attn_zero(tmp_path: Path) -> None:
    assert plan_for({"SPEC_ATTN": "0"}, cwd=tmp_path).env["VLLM_SPEC_DECODE_ATTN"] == "0"
    stock = plan_for({"SPEC_ATTN": "0"}, caps=STOCK, cwd=tmp_path)
    assert "VLLM_SPEC_DECODE_ATTN" not in stock.env  # stock already behaves as "off"


# ---- the launcher's warnings (each a gotcha) -------------------------------------------------


def test_warn_max_seqs_above_12_at_huge(tmp_path: Path) -> None:
    assert _warned(plan_for({"CTX": "huge", "MAX_SEQS": "16"}, cwd=tmp_path).warnings,
                   "MAX_SEQS=16", "gotcha 35")
    assert not _warned(plan_for({"CTX": "huge", "MAX_SEQS": "12"}, cwd=tmp_path).warnings,
                       "gotcha 35")


def test_warn_kv_mem_above_default_loudly_on_wsl2(tmp_path: Path) -> None:
    knobs = {"SPEC": "dflash2", "KV_MEM": "6871947673"}
    bare = plan_for(knobs, cwd=tmp_path).warnings
    wsl = plan_for(knobs, facts=PlatformFacts(wsl2=True), cwd=tmp_path).warnings
    assert _warned(bare, "KV_MEM=6871947673", "above the profile default 5583457484")
    assert not _warned(bare, "WSL2")
    assert _warned(wsl, "THIS IS WSL2", "gotchas 35, 53")
    assert not _warned(plan_for({"SPEC": "dflash2", "KV_MEM": "5583457484"},
                                cwd=tmp_path).warnings, "above the profile default")


def test_warn_kv_mem_pinned_with_foreign_gpu_memory(tmp_path: Path) -> None:
    # The pool is lowered by what others hold (tests/unit/test_memory_rules.py has the
    # refusal when it then cannot hold one request); an unpinned pool is vLLM's to size.
    busy = PlatformFacts(foreign_gpu_mib=800)
    pinned = plan_for({"SPEC": "dflash2"}, facts=busy, cwd=tmp_path)
    assert _warned(pinned.warnings, "800 MiB in use", "gotcha 31")
    assert not _warned(plan_for({}, facts=busy, cwd=tmp_path).warnings, "gotcha 31")


def test_warn_int8_all_layers_above_095(tmp_path: Path) -> None:
    hot = plan_for({"INT8_LAYERS": "."}, cli={"PROFILE": "batch"}, cwd=tmp_path)
    assert _warned(hot.warnings, "INT8_LAYERS=.", "gotcha 16")
    assert hot.env["VLLM_MARLIN_INT8_INCLUDE_RE"] == "."
    cool = plan_for({"INT8_LAYERS": ".", "GPU_UTIL": "0.95"}, cli={"PROFILE": "batch"},
                    cwd=tmp_path)
    assert not _warned(cool.warnings, "gotcha 16")


def test_warn_batched_tokens_above_2048(tmp_path: Path) -> None:
    plan = plan_for({"EXTRA_ARGS": "--max-num-batched-tokens 4096"}, cwd=tmp_path)
    assert _warned(plan.warnings, "4096", "gotchas 7, 43")
    assert _warned(plan.warnings, "EXTRA_ARGS overrides", "--max-num-batched-tokens")
    inline = plan_for({"EXTRA_ARGS": "--max-num-batched-tokens=8192"}, cwd=tmp_path)
    assert _warned(inline.warnings, "8192", "gotchas 7, 43")
    assert not _warned(plan_for({"EXTRA_ARGS": "--max-num-batched-tokens 2048"},
                                cwd=tmp_path).warnings, "gotchas 7, 43")


def test_warn_unauthenticated_off_loopback(tmp_path: Path) -> None:
    assert _warned(plan_for({"HOST": "0.0.0.0"}, cwd=tmp_path).warnings, "no API key")
    keyed = PlatformFacts(api_key_env=True)
    assert not _warned(plan_for({"HOST": "0.0.0.0"}, facts=keyed, cwd=tmp_path).warnings,
                       "no API key")
    assert not _warned(plan_for({"HOST": "0.0.0.0", "API_KEY_FILE": "/k"},
                                cwd=tmp_path).warnings, "no API key")
    assert not _warned(plan_for({}, cwd=tmp_path).warnings, "no API key")


def test_warn_knobs_without_effect(tmp_path: Path) -> None:
    assert _warned(plan_for({"DFLASH_TOKENS": "15"}, cwd=tmp_path).warnings,
                   "DFLASH_TOKENS", "no effect")
    assert _warned(plan_for({"SPEC": "dflash2"}, cli={"PROFILE": "batch"}, cwd=tmp_path).warnings,
                   "SPEC", "no effect")
    assert _warned(plan_for({"KV": "int4pth"}, cwd=tmp_path).warnings, "KV", "no effect")


# ---- capability gating ----------------------------------------------------------------------


def test_stock_build_drops_default_patch_values_with_warnings(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "15"}, caps=STOCK, cwd=tmp_path)
    for name in ("VLLM_SPEC_DECODE_ATTN", "VLLM_SPEC_DECODE_ATTN_QMAX",
                 "VLLM_DFLASH2_LOOKUP", "VLLM_V2_CUDAGRAPH_MEM_MIB"):
        assert name not in plan.env
    for feature in ("spec-decode-attn", "dflash2-lookup", "v2-cudagraph-mem-estimate"):
        assert _warned(plan.warnings, f"'{feature}'", "left out")
    # Without the lookup there is no adaptive block to protect: async stays on.
    assert "--async-scheduling" in plan.vllm_args


def test_stock_build_turns_batch_int8_off_rather_than_quantizing_everything(
    tmp_path: Path,
) -> None:
    plan = plan_for({}, cli={"PROFILE": "batch"}, caps=STOCK, cwd=tmp_path)
    assert "VLLM_MARLIN_INPUT_DTYPE" not in plan.env
    assert "VLLM_MARLIN_INT8_INCLUDE_RE" not in plan.env
    assert _warned(plan.warnings, "int8 activations are OFF")
    every = plan_for({"INT8_LAYERS": ".", "GPU_UTIL": "0.95"}, cli={"PROFILE": "batch"},
                     caps=STOCK, cwd=tmp_path)
    assert every.env == {**every.env, "VLLM_MARLIN_INPUT_DTYPE": "int8"}
    assert "VLLM_MARLIN_INT8_INCLUDE_RE" not in every.env


@pytest.mark.parametrize(
    ("env", "cli", "knob", "capability"),
    [
        ({"SPEC_ATTN": "1"}, None, "SPEC_ATTN", "spec-decode-attn"),
        ({"SPEC": "dflash2", "LOOKUP": "1"}, None, "LOOKUP", "dflash2-lookup"),
        ({"SPEC": "dflash2", "LOOKUP_ADAPTIVE": "1"}, None, "LOOKUP_ADAPTIVE", "dflash2-lookup"),
        ({"CTX": "huge"}, None, "CTX", "kvarn"),
        ({"KV": "kvarn"}, {"PROFILE": "batch"}, "KV", "kvarn"),
        ({"INT8_LAYERS": "mlp"}, {"PROFILE": "batch"}, "INT8_LAYERS", "int8-layer-select"),
        ({"INT8_ACT": "int8"}, None, "INT8_ACT", "int8-layer-select"),
        ({"VISION": "1", "VISION_OFFLOAD": "1"}, None, "VISION_OFFLOAD",
         "vision-tower-cpu-offload"),
    ],
)
def test_explicit_knob_needing_a_missing_patch_is_an_error(
    env: dict[str, str], cli: dict[str, str | None] | None, knob: str, capability: str,
    tmp_path: Path,
) -> None:
    with pytest.raises(Qwen3090Error) as err:
        plan_for(env, cli=cli, caps=STOCK, cwd=tmp_path)
    # The message names the knob with the value the user gave, not the flag it turns into.
    assert err.value.message.startswith(f"{knob}={env[knob]} ")
    assert capability in err.value.message
    assert err.value.fix
    plan_for(env, cli=cli, caps=FULL, cwd=tmp_path)  # the same knobs plan on a patched build


def test_model_path_with_dflash_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Qwen3090Error) as err:
        plan_for({"MODEL": "/srv/DFlash-models/target"}, cwd=tmp_path)
    assert "MODEL=" in err.value.message and "gotcha 14" in err.value.message


def test_memory_estimate_follows_gotcha_25(tmp_path: Path) -> None:
    plan = plan_for({"SPEC": "dflash2", "DFLASH_TOKENS": "7"}, cwd=tmp_path)
    m = plan.memory
    assert m.kv_bytes_per_token == 65536
    assert m.fixed_bytes_per_request == 102 * (1 << 20) * 9
    assert m.request_bytes_at_max_len == 65536 * 65536 + 102 * (1 << 20) * 9
    assert m.pool_bytes == 5583457484
    assert m.full_length_requests == round(5583457484 / m.request_bytes_at_max_len, 2)
    mtp = plan_for({}, cwd=tmp_path).memory
    assert mtp.fixed_bytes_per_request == 102 * (1 << 20) * 6  # k = 4
    assert mtp.pool_bytes is None
