"""Where the GLM fixture models live: the 3.0 bpw checkpoint and its exact reference are copied into
tests/fixtures; the 4.0 bpw and unquantized ones are read from ../shared (skipped without it)."""
from __future__ import annotations

import json
import pathlib

from conftest import FIXTURES, SHARED, shared_or_skip

from trellisforge import safetensors_io


def checkpoint_dir(variant: str) -> pathlib.Path:
    """variant: "3.0", "4.0" (EXL3 bpw) or "hf" (unquantized)."""
    local = FIXTURES / f"exl3_{variant}bpw"
    if local.is_dir():
        return local
    shared = shared_or_skip()
    return shared / ("hf" if variant == "hf" else f"exl3_{variant}bpw")


def reference_file(variant: str, name: str) -> pathlib.Path:
    """The exact answer for a checkpoint (transformers fp32 on its dequantized weights): the copy in
    tests/fixtures when there is one, else ../shared."""
    if variant == "hf":
        return shared_or_skip() / "hf_ref" / name
    local = FIXTURES / "dequant_ref" / f"{variant}bpw" / name
    return local if local.is_file() else shared_or_skip() / "dequant_ref" / f"{variant}bpw" / name


def reference_logits(variant: str) -> dict:
    name = "hf_fp32_logits.safetensors" if variant == "hf" else "dequant_fp32_logits.safetensors"
    return safetensors_io.load(reference_file(variant, name))


def reference_greedy(variant: str) -> dict:
    name = "hf_fp32_greedy.json" if variant == "hf" else "dequant_fp32_greedy.json"
    return json.loads(reference_file(variant, name).read_text())


def prompts() -> dict[str, list[int]]:
    path = FIXTURES / "prompts.json"
    if not path.is_file():
        path = shared_or_skip() / "prompts.json"
    return json.loads(path.read_text())


def shared_peer_file(name: str) -> pathlib.Path:
    return shared_or_skip() / "peer" / name


def model_config(variant: str) -> dict:
    return json.loads((checkpoint_dir(variant) / "config.json").read_text())
