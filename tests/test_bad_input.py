"""Bad input gets a clear error (a TrellisError with the library's message), never a crash or a
leak of the process: truncated and lying safetensors files, broken shard indexes, configs, EXL3
layers missing pieces, and wrong arguments."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from exl3_files import random_layer, write

import trellisforge
from trellisforge import TrellisError


def raw_file(path, header: dict | bytes, data: bytes = b"", header_len: int | None = None) -> str:
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded) if header_len is None else header_len))
        f.write(encoded)
        f.write(data)
    return str(path)


def expect_error(path, *fragments: str, status: str = "format"):
    with pytest.raises(TrellisError) as caught:
        trellisforge.Checkpoint(path)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert caught.value.status_name == status
    return message


def tensor(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_truncated_file(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"\x05\x00\x00")
    expect_error(path, "too short")


def test_header_length_past_the_end(tmp_path):
    expect_error(raw_file(tmp_path / "t.safetensors", b"{}", header_len=1 << 40), "runs past the end")


def test_invalid_json(tmp_path):
    expect_error(raw_file(tmp_path / "t.safetensors", b'{"a": {"dtype": "F16",'), "not valid JSON")


def test_unknown_dtype(tmp_path):
    expect_error(raw_file(tmp_path / "t.safetensors", {"w": tensor("F8_E9", [2], 0, 2)}, b"\0\0"), "unknown dtype 'F8_E9'", "'w'")


def test_range_outside_the_file(tmp_path):
    expect_error(raw_file(tmp_path / "t.safetensors", {"w": tensor("F16", [8], 0, 16)}, b"\0" * 8), "outside", "'w'")


def test_overlapping_ranges(tmp_path):
    header = {"a": tensor("F32", [2], 0, 8), "b": tensor("F32", [2], 4, 12)}
    expect_error(raw_file(tmp_path / "t.safetensors", header, b"\0" * 12), "overlap")


def test_shape_and_bytes_disagree(tmp_path):
    expect_error(raw_file(tmp_path / "t.safetensors", {"w": tensor("F32", [3, 3], 0, 16)}, b"\0" * 16), "needs 36 bytes", "give 16")


def test_file_is_a_directory_without_weights(tmp_path):
    expect_error(tmp_path, "neither model.safetensors nor model.safetensors.index.json")


def test_missing_file(tmp_path):
    expect_error(tmp_path / "absent.safetensors", "cannot open", status="io")


def sharded(tmp_path, weight_map: dict) -> None:
    rng = np.random.default_rng(0)
    write(tmp_path / "model-00001-of-00002.safetensors", {"a": rng.standard_normal(4).astype(np.float32)})
    write(tmp_path / "model-00002-of-00002.safetensors", {"b": rng.standard_normal(4).astype(np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_checkpoint_opens(tmp_path):
    sharded(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    assert trellisforge.Checkpoint(tmp_path).tensor_names() == ["a", "b"]


def test_index_naming_a_missing_shard(tmp_path):
    sharded(tmp_path, {"a": "model-00001-of-00002.safetensors", "c": "model-00003-of-00003.safetensors"})
    expect_error(tmp_path, "model-00003-of-00003.safetensors", "does not exist")


def test_index_placing_a_tensor_in_the_wrong_shard(tmp_path):
    sharded(tmp_path, {"a": "model-00002-of-00002.safetensors"})
    expect_error(tmp_path, "'a'", "does not hold it")


def test_index_escaping_the_directory(tmp_path):
    sharded(tmp_path, {"a": "../model-00001-of-00002.safetensors"})
    expect_error(tmp_path, "not a file name in the checkpoint directory")


def test_index_that_is_not_json(tmp_path):
    sharded(tmp_path, {})
    (tmp_path / "model.safetensors.index.json").write_text("{weight_map")
    expect_error(tmp_path, "not valid JSON")


def checkpoint_dir(tmp_path, config: dict) -> str:
    write(tmp_path / "model.safetensors", {"a": np.zeros(4, dtype=np.float32)})
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_config_without_architectures(tmp_path):
    expect_error(checkpoint_dir(tmp_path, {"model_type": "glm4_moe"}), "config.json", "'architectures'")


def test_config_with_another_quantization(tmp_path):
    config = {"architectures": ["Glm4MoeForCausalLM"], "quantization_config": {"quant_method": "gptq", "bits": 4}}
    expect_error(checkpoint_dir(tmp_path, config), "quant_method 'gptq'", status="unsupported")


def test_config_with_bad_bits(tmp_path):
    config = {"architectures": ["X"], "quantization_config": {"quant_method": "exl3", "bits": "three"}}
    expect_error(checkpoint_dir(tmp_path, config), "'bits' is not a number")


def layer_error(tmp_path, tensors: dict, *fragments: str, status: str = "format") -> None:
    write(tmp_path / "l.safetensors", tensors)
    checkpoint = trellisforge.Checkpoint(tmp_path / "l.safetensors")
    with pytest.raises(TrellisError) as caught:
        checkpoint.dequantize("l")
    for fragment in fragments:
        assert fragment in str(caught.value), f"{fragment!r} not in {str(caught.value)!r}"
    assert caught.value.status_name == status


@pytest.mark.parametrize("missing", ["trellis", "suh", "svh"])
def test_exl3_layer_missing_a_tensor(tmp_path, missing):
    tensors = random_layer(np.random.default_rng(1), "l", 128, 128, 3, "mul1")
    del tensors[f"l.{missing}"]
    layer_error(tmp_path, tensors, f"missing tensor 'l.{missing}'", status="not found")


def test_exl3_layer_with_both_codebook_markers(tmp_path):
    tensors = random_layer(np.random.default_rng(1), "l", 128, 128, 3, "mul1")
    tensors["l.mcg"] = np.array(-877912083, dtype=np.int32)
    layer_error(tmp_path, tensors, "both codebook markers")


def test_exl3_trellis_last_dim_not_a_rate(tmp_path):
    tensors = random_layer(np.random.default_rng(1), "l", 128, 128, 4, "mul1")
    tensors["l.trellis"] = tensors["l.trellis"][:, :, :50].copy()
    layer_error(tmp_path, tensors, "last dimension 50")


def test_exl3_half_rate_needs_mul1(tmp_path):
    tensors = random_layer(np.random.default_rng(1), "l", 128, 128, 2.5, "mcg")
    layer_error(tmp_path, tensors, "requires the mul1 codebook")


def test_exl3_scales_of_the_wrong_size(tmp_path):
    tensors = random_layer(np.random.default_rng(1), "l", 128, 256, 4, "mul1")
    tensors["l.suh"] = tensors["l.suh"][:64].copy()
    layer_error(tmp_path, tensors, "l.suh", "(128)")


def test_exl3_scale_tensor_is_refused(tmp_path):
    tensors = random_layer(np.random.default_rng(1), "l", 128, 128, 4, "mul1")
    tensors["l.scale"] = np.ones(1, dtype=np.float16)
    layer_error(tmp_path, tensors, "'scale'")


def test_wrong_arguments(tmp_path):
    write(tmp_path / "l.safetensors", random_layer(np.random.default_rng(1), "l", 128, 128, 4, "mul1"))
    checkpoint = trellisforge.Checkpoint(tmp_path / "l.safetensors")
    with pytest.raises(TrellisError, match="do not fit"):
        checkpoint.linear("l", np.zeros((2, 129), dtype=np.float32))
    with pytest.raises(TrellisError, match="rows 0"):
        checkpoint.linear("l", np.zeros((0, 128), dtype=np.float32))
    with pytest.raises(TrellisError, match="missing tensor 'nope.trellis'"):
        checkpoint.linear("nope", np.zeros((1, 128), dtype=np.float32))
    checkpoint.close()
    with pytest.raises(ValueError, match="closed"):
        checkpoint.tensor_names()


def test_no_file_descriptors_leak_on_errors(tmp_path):
    """Opening bad files many times leaves no descriptor or mapping behind."""
    bad = raw_file(tmp_path / "bad.safetensors", {"w": tensor("F32", [3], 0, 8)}, b"\0" * 8)
    good = tmp_path / "good.safetensors"
    write(good, {"w": np.zeros(1024, dtype=np.float32)})
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(200):
        with pytest.raises(TrellisError):
            trellisforge.Checkpoint(bad)
        trellisforge.Checkpoint(good).close()
    assert len(os.listdir("/proc/self/fd")) == before
    maps = open("/proc/self/maps").read()
    assert str(good) not in maps and str(bad) not in maps


def test_cuda_reports_why_it_is_unavailable():
    available, reason = trellisforge.cuda_available()
    if not available:
        assert reason.startswith("CUDA unavailable: ")
