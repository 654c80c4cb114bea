"""The resolver against vLLM 0.28.0 itself: the stock tables and every plan's arguments.

These import the installed vLLM (the CPU build of 0.28.0 here; its argument parser and
``envs`` are the same Python as the CUDA wheel's) but start no server.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwen3090.capabilities import (
    EXTERNAL_ENV,
    NEEDS,
    STOCK_COMPILATION_KEYS,
    STOCK_ENV,
    STOCK_FLAGS,
    STOCK_SPEC_KEYS,
    STOCK_SPEC_METHODS,
)
from qwen3090.errors import Qwen3090Error
from qwen3090.knobs import load_settings
from qwen3090.plan import PlatformFacts, ServePlan, resolve
from tests.support.planning import FULL, STOCK

pytestmark = pytest.mark.e2e_cpu


@pytest.fixture(scope="module")
def vllm_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser: argparse.ArgumentParser = make_arg_parser(
        FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    )
    return parser


def _parses(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace | None:
    try:
        return parser.parse_args(args)
    except SystemExit:
        return None


def test_stock_env_table_matches_vllm_envs(pristine_cpu_tree: Path) -> None:
    # The pristine wheel's tree, not the installed vLLM: python/dev.sh patches that one, and
    # the series registers the patch-only variables this test proves stock lacks.
    from tests.support.patchtrees import run_in_tree

    done = run_in_tree(
        pristine_cpu_tree,
        "import json, vllm.envs as e; print(json.dumps(sorted(e.environment_variables)))",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    registered = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert registered >= STOCK_ENV
    assert not (registered & EXTERNAL_ENV)
    # What the table calls patch-only really is absent from stock 0.28.0.
    patch_env = {n.name for n in NEEDS.values() if n.kind == "env"}
    assert not (registered & patch_env)


def test_stock_flag_table_matches_the_parser(vllm_parser: argparse.ArgumentParser) -> None:
    for flag, values in STOCK_FLAGS.items():
        if flag == "--model":
            assert _parses(vllm_parser, ["--model", "m"]) is not None
            continue
        action = next(
            (a for a in vllm_parser._actions if flag in a.option_strings), None
        )
        assert action is not None, f"{flag} is not a vLLM 0.28.0 flag"
        for value in sorted(values or ()):
            assert _parses(vllm_parser, ["m", flag, value]) is not None, (flag, value)


# Parses ``--kv-cache-dtype VALUE`` with the tree's own serve parser; prints ok or refused.
_PARSE_KV_DTYPE = """
import sys
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
try:
    parser.parse_args(["m", "--kv-cache-dtype", sys.argv[1]])
    print("ok")
except SystemExit:
    print("refused")
"""


def test_the_kvarn_cache_dtype_comes_from_the_series(
    pristine_cpu_tree: Path, patched_cpu_tree: Path
) -> None:
    # Stock 0.28.0 refuses it (so the planner may only emit it where a patch provides it);
    # the series' kvarn-cache-spec.patch adds it to the parser. The installed vLLM is patched
    # (python/dev.sh), so each side runs in its own tree.
    from tests.support.patchtrees import run_in_tree

    value = NEEDS["--kv-cache-dtype=kvarn_k4v2_g128"].name.split("=")[1]
    seen = {}
    for name, tree in (("pristine", pristine_cpu_tree), ("patched", patched_cpu_tree)):
        done = run_in_tree(tree, _PARSE_KV_DTYPE, args=(value,))
        assert done.returncode == 0, done.stderr[-2000:]
        seen[name] = done.stdout.strip().splitlines()[-1]
    assert seen == {"pristine": "refused", "patched": "ok"}


def test_stock_json_keys_match_vllm_configs() -> None:
    from vllm.config.compilation import CompilationConfig
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    assert set(get_args(SpeculativeMethod)) | {"mtp"} >= STOCK_SPEC_METHODS
    spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    assert spec_fields >= STOCK_SPEC_KEYS
    comp_fields = {f.name for f in dataclasses.fields(CompilationConfig)}
    assert comp_fields >= STOCK_COMPILATION_KEYS


def _check_plan_parses(parser: argparse.ArgumentParser, plan: ServePlan, caps_full: bool) -> None:
    from vllm.config.speculative import SpeculativeConfig
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args

    args = list(plan.vllm_args)
    ns = _parses(parser, args)
    if ns is None:
        # Only a value a patch provides may be unknown to the stock parser.
        assert caps_full and "kvarn_k4v2_g128" in args, args
        return
    validate_parsed_serve_args(ns)
    assert ns.model_tag == plan.model
    if ns.speculative_config is not None:
        spec: dict[str, Any] = ns.speculative_config
        assert set(spec) <= {f.name for f in dataclasses.fields(SpeculativeConfig)}
        assert spec["method"] in STOCK_SPEC_METHODS
    for name in plan.env:
        assert name in STOCK_ENV | EXTERNAL_ENV or caps_full, name


KNOB_VALUES: dict[str, list[str]] = {
    "SPEC": ["mtp", "dflash2", "off", "eagle"],
    "CTX": ["fast", "long", "huge", "tiny"],
    "DFLASH_TOKENS": ["1", "3", "7", "8", "15", "20", "0", "x"],
    "DRAFT_TOKENS": ["1", "3", "4", "6", "0"],
    "KV_MEM": ["", "4000000000", "5583457484", "6871947673", "lots", "-1"],
    "MAX_SEQS": ["1", "2", "8", "16", "64", "0"],
    "MAX_LEN": ["4096", "65536", "262144", "0"],
    "DFLASH_MAX_LEN": ["8192", "131072"],
    "CG": ["8", "64", "128"],
    "GPU_UTIL": ["0.5", "0.93", "0.95", "0.972", "1.5"],
    "PREFIX_CACHE": ["0", "1", "maybe"],
    "LOOKUP": ["0", "1"],
    "LOOKUP_ADAPTIVE": ["0", "1"],
    "ASYNC_SCHED": ["0", "1"],
    "SPEC_ATTN": ["0", "1"],
    "TOOLS": ["0", "1"],
    "TOOL_PARSER": ["qwen3_coder", "hermes"],
    "DRAFT_SAMPLE": ["probabilistic", "greedy", "random"],
    "CUDAGRAPH_MODE": ["NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE", "SOMETIMES"],
    "KV": ["fp8", "int4pth", "kvarn", "int2"],
    "INT8_ACT": ["", "int8", "fp8", "int3"],
    "INT8_LAYERS": ["", "mlp", "gate_up", ".", "("],
    "VISION": ["0", "1"],
    "VISION_OFFLOAD": ["0", "1"],
    "MODEL": ["models/m", "/srv/dflash/m"],
    "DRAFT": ["models/d"],
    "PORT": ["18020", "18101", "70000"],
    "HOST": ["127.0.0.1", "0.0.0.0"],
    "API_SERVERS": ["1", "2"],
    "EXTRA_ARGS": ["", "--seed 3", "--tensor-parallel-size 1", "--max-num-batched-tokens 4096"],
}

knob_sets = st.dictionaries(
    st.sampled_from(sorted(KNOB_VALUES)), st.just(""), max_size=10
).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.sampled_from(KNOB_VALUES[k]) for k in keys})
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    knobs=knob_sets,
    profile=st.sampled_from(["single-user", "batch"]),
    device=st.sampled_from(["cuda", "cpu"]),
    full=st.booleans(),
    wsl2=st.booleans(),
)
def test_every_plan_parses_or_is_a_clean_error(
    vllm_parser: argparse.ArgumentParser,
    tmp_path_factory: pytest.TempPathFactory,
    knobs: dict[str, str],
    profile: str,
    device: str,
    full: bool,
    wsl2: bool,
) -> None:
    cwd = Path(tmp_path_factory.getbasetemp())
    try:
        settings_ = load_settings(environ=knobs, cli={"PROFILE": profile, "DEVICE": device})
        plan = resolve(settings_, FULL if full else STOCK, PlatformFacts(wsl2=wsl2, cwd=cwd))
    except Qwen3090Error as err:
        assert err.message and err.fix  # a clean error says what and how to fix
        return
    _check_plan_parses(vllm_parser, plan, full)
    json.dumps(plan.to_dict())
