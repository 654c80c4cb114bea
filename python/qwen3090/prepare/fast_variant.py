"""Step ``fast-variant``: the ``-fast`` checkpoint, built locally from the W4A16 base.

The base AutoRound checkpoint keeps its lm_head and its MTP head in bf16; at the 27B's shapes
that is 2.54 GB of lm_head and 0.85 GB of MTP linears on a 24 GB card, which is what left the
plain checkpoint 1.56 GiB of KV pool (gotcha 41). This step requantizes those weights in the
base's own format (GPTQ-packed ints, its bits and group size, :mod:`.gptq_pack`) and marks them
quantized in ``quantization_config.extra_config``, which vLLM 0.28.0's INC (AutoRound) loader
reads per layer, suffix-matched for ``lm_head``.

What stays bf16, and why: the embeddings. vLLM 0.28.0 builds ``embed_tokens`` of Qwen3.5 (and
its MTP head) without a quantization config, so a quantized embedding cannot be loaded; the
MTP head shares the target's embedding and lm_head after loading anyway.

The output is a directory beside the base: the shards holding a requantized tensor are
rewritten (every other tensor copied as is), ``config.json`` and the index are rewritten, and
every other file is a relative symlink into the base, which is never written to. A shard is
written to a temporary name and renamed; the sha256 of each finished one is kept in a progress
file, so a killed run resumes with the next shard.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3090.errors import Qwen3090Error
from qwen3090.modelcheck import INDEX_NAME, SINGLE_NAME, safetensors_header
from qwen3090.patchtool import sha256_file
from qwen3090.prepare.gptq_pack import PackFormat, packable, packed_bytes, quantize_linear
from qwen3090.prepare.record import MANIFEST_NAME

STEP = "fast-variant"
PROGRESS_NAME = ".qwen3090-fast-variant-progress.json"
AUTO_ROUND_METHODS = ("auto-round", "intel/auto-round")
LM_HEAD = re.compile(r"(?:.*\.)?lm_head\.weight")
# The dense MTP head's linear layers (Qwen3.5 / Qwen3-Next naming): the fusion fc and the
# attention and MLP projections of each MTP layer. Norms, embeddings and MoE experts stay.
MTP_LINEAR = re.compile(
    r"(?:.*\.)?mtp\.(?:fc|layers\.\d+\.(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj))"
    r"\.weight"
)
_FLOAT_DTYPES = {"BF16": 2, "F16": 2, "F32": 4}
_SCALE_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


@dataclass
class Target:
    """One weight to requantize."""

    name: str
    shard: str
    shape: tuple[int, int]
    dtype: str
    group: str
    """"lm_head" or "mtp", for the report."""

    @property
    def module(self) -> str:
        return self.name.removesuffix(".weight")


@dataclass
class Plan:
    base: Path
    out: Path
    fmt: PackFormat
    config: dict[str, Any]
    weight_map: dict[str, str]
    """tensor name -> shard file name, over the whole base."""
    targets: list[Target] = field(default_factory=list)

    @property
    def shards(self) -> list[str]:
        return sorted({t.shard for t in self.targets})


def _fail(what: str, fix: str) -> Qwen3090Error:
    return Qwen3090Error(what, fix=fix)


def default_out(base: Path) -> Path:
    """``<base>-fast`` beside the base: the dir name the pinned ``fast`` target uses."""
    return base.parent / f"{base.name}-fast"


def _weight_map(base: Path) -> dict[str, str]:
    index = base / INDEX_NAME
    if index.exists():
        data = json.loads(index.read_text(encoding="utf-8"))
        return {str(k): str(v) for k, v in data["weight_map"].items()}
    header, why = safetensors_header(base / SINGLE_NAME)
    if header is None:
        raise _fail(f"{base}/{SINGLE_NAME} {why}", f"run `qwen3090 check model {base}`")
    return {k: SINGLE_NAME for k in header if k != "__metadata__"}


def _headers(base: Path, shards: Iterable[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for shard in shards:
        header, why = safetensors_header(base / shard)
        if header is None:
            raise _fail(f"{base}/{shard} {why}", f"run `qwen3090 check model {base}`")
        out[shard] = header
    return out


def read_format(base: Path, config: dict[str, Any], weight_map: dict[str, str]) -> PackFormat:
    """The base's quantization as :class:`PackFormat`: bits, group size and symmetry from
    ``quantization_config``, the scales' dtype and whether layers carry ``g_idx`` from the
    first packed layer in the weights. Refuses a format vLLM's INC loader would not read the
    requantized layers in."""
    fix = ("`qwen3090 prepare fast-variant` requantizes in the base's own format; it needs a "
           "W4A16 AutoRound (auto_round:auto_gptq, symmetric int) checkpoint such as the pinned "
           "`base` target (`qwen3090 fetch base`)")
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        raise _fail(f"{base}/config.json has no quantization_config: the model is not quantized",
                    fix)
    method = qc.get("quant_method")
    if method not in AUTO_ROUND_METHODS:
        raise _fail(f"{base}/config.json: quantization_config.quant_method is {method!r}, not "
                    f"one of {AUTO_ROUND_METHODS}", fix)
    packing = qc.get("packing_format", "auto_round:auto_gptq")
    if "gptq" not in str(packing) or qc.get("data_type", "int") != "int" or not qc.get("sym"):
        raise _fail(f"{base}/config.json: quantization_config has packing_format={packing!r}, "
                    f"data_type={qc.get('data_type')!r}, sym={qc.get('sym')!r}; only "
                    "GPTQ-packed symmetric int is written", fix)
    bits, group = qc.get("bits"), qc.get("group_size")
    if bits not in (4, 8) or not isinstance(group, int) or group < 1:
        raise _fail(f"{base}/config.json: quantization_config has bits={bits!r}, "
                    f"group_size={group!r}; vLLM's GPTQ kernels take 4 or 8 bits in groups", fix)
    scales = next((name for name in weight_map if name.endswith(".scales")), None)
    if scales is None:
        raise _fail(f"{base}: no packed layer (no '*.scales' tensor) in the weights", fix)
    header = _headers(base, [weight_map[scales]])[weight_map[scales]]
    scale_dtype = _SCALE_DTYPES.get(str(header[scales]["dtype"]))
    if scale_dtype is None:
        raise _fail(f"{base}: {scales} has dtype {header[scales]['dtype']}", fix)
    g_idx = scales.removesuffix(".scales") + ".g_idx"
    return PackFormat(bits=int(bits), group_size=group, scale_dtype=scale_dtype,
                      with_g_idx=g_idx in weight_map)


def plan(base: Path, out: Path, mtp: bool = True) -> Plan:
    """What the step will do for ``base``; refuses a base it cannot make a variant of."""
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    weight_map = _weight_map(base)
    fmt = read_format(base, config, weight_map)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if config.get("tie_word_embeddings") or text.get("tie_word_embeddings"):
        raise _fail(f"{base}/config.json: tie_word_embeddings is true, so the lm_head is the "
                    "embedding, which vLLM 0.28.0 loads only unquantized",
                    "nothing to requantize: serve the base as it is")
    result = Plan(base=base, out=out, fmt=fmt, config=config, weight_map=weight_map)
    candidates = {n: s for n, s in weight_map.items()
                  if LM_HEAD.fullmatch(n) or (mtp and MTP_LINEAR.fullmatch(n))}
    headers = _headers(base, sorted(set(candidates.values())))
    for name, shard in sorted(candidates.items()):
        info = headers[shard][name]
        shape = tuple(int(d) for d in info["shape"])
        why = packable(shape, fmt)
        if str(info["dtype"]) not in _FLOAT_DTYPES or why is not None:
            raise _fail(f"{base}: {name} ({info['dtype']}, shape {list(shape)}) cannot be "
                        f"requantized: {why or 'not a float tensor'}",
                        "this checkpoint's layout is not the Qwen3.5 one the step knows; "
                        "report it with the tensor's name and shape")
        result.targets.append(Target(
            name=name, shard=shard, shape=(shape[0], shape[1]), dtype=str(info["dtype"]),
            group="lm_head" if LM_HEAD.fullmatch(name) else "mtp"))
    if not any(t.group == "lm_head" for t in result.targets):
        already = any(LM_HEAD.fullmatch(n.replace(".qweight", ".weight")) for n in weight_map)
        raise _fail(f"{base}: no bf16 lm_head.weight in the weights"
                    + (" (its lm_head is already packed)" if already else ""),
                    "pass the base checkpoint, not a variant made from it")
    if out.resolve() == base.resolve():
        raise _fail(f"--out {out} is the base itself", "pass a new directory to --out "
                    "(default: <base>-fast beside the base)")
    return result


def inputs_of(p: Plan, base_fingerprint: str) -> dict[str, Any]:
    return {
        # Relative to the variant, as its links are: moving both dirs together keeps it valid.
        "base": os.path.relpath(p.base.resolve(), p.out.resolve()),
        "base_fingerprint": base_fingerprint,
        "format": vars(p.fmt),
        "targets": [t.name for t in p.targets],
    }


def _load_progress(out: Path) -> dict[str, Any]:
    try:
        data = json.loads((out / PROGRESS_NAME).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_progress(out: Path, data: dict[str, Any]) -> None:
    tmp = out / f"{PROGRESS_NAME}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, out / PROGRESS_NAME)


def write_shard(p: Plan, shard: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Rewrite one base shard into the output: its targets packed, all else copied.
    Returns per-target facts for the report."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    targets = {t.name: t for t in p.targets if t.shard == shard}
    tensors: dict[str, torch.Tensor] = {}
    facts: dict[str, Any] = {}
    with safe_open(str(p.base / shard), framework="pt") as f:
        metadata = f.metadata() or {"format": "pt"}
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            if name not in targets:
                tensors[name] = f.get_tensor(name)
                continue
            t = targets[name]
            t0 = time.monotonic()
            last = [t0]

            def progress(done: int, total: int, name: str = name, last: list[float] = last) -> None:
                now = time.monotonic()
                if now - last[0] >= 10 or done == total:
                    last[0] = now
                    log(f"fast-variant: {name}: {done}/{total} rows")

            packed, rel_err = quantize_linear(f.get_tensor(name), p.fmt, progress)
            for suffix, value in packed.items():
                tensors[f"{t.module}.{suffix}"] = value
            facts[name] = {
                "shape": list(t.shape),
                "bytes_before": t.shape[0] * t.shape[1] * _FLOAT_DTYPES[t.dtype],
                "bytes_after": sum(v.numel() * v.element_size() for v in packed.values()),
                "relative_error": round(rel_err, 6),
                "seconds": round(time.monotonic() - t0, 1),
            }
    tmp = p.out / f".{shard}.tmp"
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, p.out / shard)
    return facts


def _link_rest(p: Plan, own: set[str]) -> list[str]:
    """Relative symlinks in the output for every base entry the step does not write."""
    linked: list[str] = []
    for entry in sorted(p.base.iterdir()):
        if entry.name in own or entry.name.startswith("."):
            continue
        link = p.out / entry.name
        target = os.path.relpath(entry, p.out)
        if link.is_symlink() and os.readlink(link) == target:
            linked.append(entry.name)
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            raise _fail(f"{link} exists and is a directory, not a link into {p.base}",
                        f"remove it, or pass another --out to `qwen3090 prepare {STEP}`")
        link.symlink_to(target)
        linked.append(entry.name)
    return linked


def _new_config(p: Plan) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(json.dumps(p.config))
    qc = config["quantization_config"]
    extra = dict(qc.get("extra_config") or {})
    for t in p.targets:
        # vLLM matches "lm_head" as a suffix of the layer prefix (language_model.lm_head too);
        # MTP modules by their checkpoint names, as AutoRound lists its skipped layers.
        key = "lm_head" if t.group == "lm_head" else t.module
        extra[key] = {"bits": p.fmt.bits, "group_size": p.fmt.group_size, "sym": True,
                      "data_type": "int"}
    qc["extra_config"] = extra
    return config


def _new_index(p: Plan, out_headers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    weight_map = {n: s for n, s in p.weight_map.items() if s not in out_headers}
    for shard, header in out_headers.items():
        weight_map.update({n: shard for n in header if n != "__metadata__"})
    all_headers = {**_headers(p.base, sorted(set(weight_map.values()) - set(out_headers))),
                   **out_headers}
    total = sum(int(info["data_offsets"][1]) - int(info["data_offsets"][0])
                for header in all_headers.values()
                for name, info in header.items() if name != "__metadata__")
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def build(p: Plan, inputs: dict[str, Any], log: Callable[[str], None]) -> tuple[
        dict[str, str], dict[str, Any]]:
    """Write the variant; returns (output name -> sha256, report)."""
    p.out.mkdir(parents=True, exist_ok=True)
    key = json.dumps(inputs, sort_keys=True)
    progress = _load_progress(p.out)
    if progress.get("inputs") != key:
        progress = {"inputs": key, "shards": {}}
    outputs: dict[str, str] = {}
    facts: dict[str, Any] = {}
    for i, shard in enumerate(p.shards, 1):
        done = progress["shards"].get(shard)
        path = p.out / shard
        if (isinstance(done, dict) and path.is_file() and not path.is_symlink()
                and sha256_file(path) == done.get("sha256")):
            log(f"fast-variant: shard {i}/{len(p.shards)} {shard}: done in an earlier run")
        else:
            if path.is_symlink():
                path.unlink()
            log(f"fast-variant: shard {i}/{len(p.shards)} {shard}: requantizing "
                + ", ".join(t.name for t in p.targets if t.shard == shard))
            done = {"facts": write_shard(p, shard, log), "sha256": sha256_file(path)}
            progress["shards"][shard] = done
            _save_progress(p.out, progress)
        outputs[shard] = done["sha256"]
        facts.update(done["facts"])
    out_headers = _headers(p.out, p.shards)
    own = {*p.shards, "config.json", MANIFEST_NAME}
    if SINGLE_NAME not in p.shards:
        own.add(INDEX_NAME)
        _write_json(p.out / INDEX_NAME, _new_index(p, out_headers))
        outputs[INDEX_NAME] = sha256_file(p.out / INDEX_NAME)
    _write_json(p.out / "config.json", _new_config(p))
    outputs["config.json"] = sha256_file(p.out / "config.json")
    linked = _link_rest(p, own)
    report: dict[str, Any] = {"format": vars(p.fmt), "tensors": facts, "linked": len(linked)}
    for group in ("lm_head", "mtp"):
        chosen = [facts[t.name] for t in p.targets if t.group == group]
        report[f"{group}_bytes_before"] = sum(f["bytes_before"] for f in chosen)
        report[f"{group}_bytes_after"] = sum(f["bytes_after"] for f in chosen)
    return outputs, report


def shape_savings(vocab: int, hidden: int, mtp_shapes: list[tuple[int, int]],
                  fmt: PackFormat) -> dict[str, int]:
    """Bytes of the bf16 lm_head and MTP linears and of their packed form, from shapes only
    (the 27B's figures without its weights)."""
    return {
        "lm_head_bytes_before": vocab * hidden * 2,
        "lm_head_bytes_after": packed_bytes(vocab, hidden, fmt),
        "mtp_bytes_before": sum(o * i * 2 for o, i in mtp_shapes),
        "mtp_bytes_after": sum(packed_bytes(o, i, fmt) for o, i in mtp_shapes),
    }


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
