"""Knob collection: YAML as the NixOS module renders it, empty values, types."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen3090.errors import Qwen3090Error
from qwen3090.knobs import load_settings

pytestmark = pytest.mark.unit


def test_yaml_as_the_module_renders_it(tmp_path: Path) -> None:
    config = tmp_path / "qwen3090.yaml"
    config.write_text(
        "profile: batch\nhost: 0.0.0.0\nport: 18030\nmodel: /var/lib/qwen3090/models/m\n"
        "PREFIX_CACHE: true\nKV_MEM: ''\nINT8_LAYERS: gate_up\nGPU_UTIL: 0.95\n"
        "EXTRA_ARGS: [--seed, '3']\nDRAFT: null\n"
    )
    s = load_settings(config=config, environ={})
    assert (s.profile, s.host, s.port, s.model) == (
        "batch", "0.0.0.0", 18030, "/var/lib/qwen3090/models/m")
    assert s.prefix_cache is True and s.kv_mem == "" and s.int8_layers == "gate_up"
    assert s.gpu_util == 0.95 and s.extra_args == ("--seed", "3")
    assert s.draft is None and not s.given("DRAFT")
    assert s.source("PORT") == f"the settings file {config}"
    assert s.source("SPEC") == "a profile default"


def test_empty_environment_values_mean_unset_except_where_empty_is_a_value() -> None:
    s = load_settings(environ={"SPEC": "", "CTX": " ", "KV_MEM": "", "INT8_ACT": "",
                               "EXTRA_ARGS": ""})
    assert s.spec is None and s.ctx is None
    assert s.kv_mem == "" and s.int8_act == "" and s.extra_args == ()


def test_profile_and_device_are_not_read_from_the_environment() -> None:
    s = load_settings(environ={"PROFILE": "batch", "DEVICE": "cpu"})
    assert s.profile is None and s.device is None


@pytest.mark.parametrize(
    ("env", "knob"),
    [
        ({"GPU_UTIL": "1.5"}, "GPU_UTIL"),
        ({"PORT": "0"}, "PORT"),
        ({"PREFIX_CACHE": "perhaps"}, "PREFIX_CACHE"),
        ({"INT8_LAYERS": "(mlp"}, "INT8_LAYERS"),
        ({"EXTRA_ARGS": "--seed 'unclosed"}, "EXTRA_ARGS"),
        ({"HOST": "a b"}, "HOST"),
    ],
)
def test_bad_values_name_the_knob_and_the_source(env: dict[str, str], knob: str) -> None:
    with pytest.raises(Qwen3090Error) as err:
        load_settings(environ=env)
    assert err.value.message.startswith(f"{knob}=")
    assert "from the environment" in err.value.message
    assert err.value.fix


def test_yaml_must_be_a_mapping_of_known_knobs(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("- SPEC\n")
    with pytest.raises(Qwen3090Error, match="mapping"):
        load_settings(config=config, environ={})
    config.write_text("spec: mtp\nSPEC: off\n")
    with pytest.raises(Qwen3090Error, match="twice"):
        load_settings(config=config, environ={})
    config.write_text("dflash_token: 7\n")
    with pytest.raises(Qwen3090Error) as err:
        load_settings(config=config, environ={})
    assert err.value.fix == "did you mean DFLASH_TOKENS?"


def test_yaml_bare_off_is_the_word_off(tmp_path: Path) -> None:
    config = tmp_path / "off.yaml"
    config.write_text("SPEC: off\nTOOLS: off\n")
    s = load_settings(config=config, environ={})
    assert s.spec == "off" and s.tools is False
