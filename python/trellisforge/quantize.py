"""Quantize an HF GLM checkpoint to EXL3 (shared/EXL3.md §11), in the layout the peer writes:

    python -m trellisforge.quantize IN_DIR OUT_DIR --bits 3 [--head-bits 6] [--codebook mul1|mcg|3inst]

This is the Hessian-free variant (EXL3.md §11.8, ExLlamaV3's own fallback without calibration data):
random signs and both 128-point Hadamards, input-channel scales, a small global scale search, then
the Viterbi encoder on every 16x16 tile (zig/src/exl3/encode.zig, bit-identical to ExLlamaV3's).
No LDLQ or calibration Hessians yet; the README says so."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import sys

import numpy as np
from tqdm import tqdm

from . import safetensors_io, version
from ._ffi import check, ffi, lib
from .reference.exl3 import hadamard_128, tile_perm
from .st_writer import OutputDirectory, ShardWriter

SUPPORTED = ("Glm4MoeForCausalLM",)
CODEBOOKS = {"3inst": 0, "mcg": 1, "mul1": 2}
CODEBOOK_RMS = {"3inst": 1.24371088, "mcg": 1.24371088, "mul1": 1.0}
MARKERS = {"mul1": -2082680531, "mcg": -877912083}
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "chat_template.jinja")
SCALE_CANDIDATES = (0.9, 1.0, 1.1)
SCALE_SAMPLE_TILES = 4


class QuantizeError(ValueError):
    """The input cannot be quantized; the message says why."""


@dataclasses.dataclass
class Plan:
    """Which tensors become EXL3 (prefix -> bits) and which are copied."""
    linears: dict[str, int]
    copied: list[str]


def load_checkpoint(directory: pathlib.Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise QuantizeError(f"{directory} holds neither model.safetensors nor model.safetensors.index.json")
    tensors, dtypes = {}, {}
    for name in files:
        header, _ = safetensors_io.read_header(directory / name)
        tensors.update(safetensors_io.load(directory / name))
        dtypes.update({k: v["dtype"] for k, v in header.items() if k != "__metadata__"})
    return tensors, dtypes


def plan(config: dict, tensors: dict[str, np.ndarray], bits: int, head_bits: int) -> Plan:
    architecture = (config.get("architectures") or ["?"])[0]
    if architecture not in SUPPORTED:
        raise QuantizeError(f"unsupported architecture '{architecture}' (the quantizer handles {', '.join(SUPPORTED)})")
    c = config
    layers = c["num_hidden_layers"]
    linears: dict[str, int] = {}
    expected = ["model.embed_tokens.weight", "model.norm.weight"]
    for layer in range(layers):
        p = f"model.layers.{layer}"
        expected += [f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            linears[f"{p}.self_attn.{name}"] = bits
        if c.get("use_qk_norm"):
            expected += [f"{p}.self_attn.q_norm.weight", f"{p}.self_attn.k_norm.weight"]
        mlps = [f"{p}.mlp"] if layer < c.get("first_k_dense_replace", 1) else \
            [f"{p}.mlp.experts.{e}" for e in range(c["n_routed_experts"])] + ([f"{p}.mlp.shared_experts"] if c.get("n_shared_experts", 1) else [])
        if layer >= c.get("first_k_dense_replace", 1):
            expected += [f"{p}.mlp.gate.weight", f"{p}.mlp.gate.e_score_correction_bias"]
        for mlp in mlps:
            for name in ("gate_proj", "up_proj", "down_proj"):
                linears[f"{mlp}.{name}"] = bits
    if "lm_head.weight" in tensors:
        if head_bits < 16:
            linears["lm_head"] = head_bits
        else:
            expected.append("lm_head.weight")
    elif not c.get("tie_word_embeddings", False):
        raise QuantizeError("missing tensor 'lm_head.weight' (and tie_word_embeddings is false)")
    missing = [n for n in expected if n not in tensors] + [f"{p}.weight" for p in linears if f"{p}.weight" not in tensors]
    if missing:
        raise QuantizeError(f"missing tensor '{missing[0]}'" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    for prefix in linears:
        shape = tensors[f"{prefix}.weight"].shape
        if len(shape) != 2 or shape[0] % 16 or shape[1] % 16:
            raise QuantizeError(f"'{prefix}.weight' has shape {tuple(shape)}; EXL3 needs both dimensions to be multiples of 16")
    consumed = set(expected) | {f"{p}.weight" for p in linears} | {f"{p}.bias" for p in linears}
    # The MTP layer (index num_hidden_layers) is not converted, as ExLlamaV3 does not (EXL3.md §12.2).
    mtp = lambda n: n.startswith("model.layers.") and int(n.split(".")[2]) >= layers  # noqa: E731
    copied = [n for n in tensors if n in consumed and n not in {f"{p}.weight" for p in linears} and not any(n == f"{p}.bias" for p in linears)]
    unexpected = [n for n in tensors if n not in consumed and not mtp(n)]
    if unexpected:
        raise QuantizeError(f"unexpected tensor '{unexpected[0]}' for {architecture}")
    return Plan(linears=linears, copied=sorted(copied))


def encode_tiles(values: np.ndarray, bits: int, codebook: str, backend: str | None = None) -> np.ndarray:
    """The Viterbi encoder (EXL3.md §11.5) on (tiles, 256) values. backend "cpu", "cuda", or None:
    the GPU when one is usable (TRELLISFORGE_ENCODER=cpu forces the CPU); both give the same bits."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    states = np.empty(values.shape, dtype=np.uint16)
    if backend is None:
        backend = "cuda" if os.environ.get("TRELLISFORGE_ENCODER", "auto") != "cpu" and _gpu_usable() else "cpu"
    encode = lib.tf_exl3_encode_tiles_cuda if backend == "cuda" else lib.tf_exl3_encode_tiles
    check(encode(ffi.cast("float *", values.ctypes.data), values.shape[0], bits, CODEBOOKS[codebook],
                 ffi.cast("uint16_t *", states.ctypes.data)))
    return states


_GPU_USABLE: bool | None = None


def _gpu_usable() -> bool:
    global _GPU_USABLE
    if _GPU_USABLE is None:
        from . import cuda_available
        _GPU_USABLE = cuda_available()[0]
    return _GPU_USABLE


def pack_states(states: np.ndarray, bits: int) -> np.ndarray:
    states = np.ascontiguousarray(states, dtype=np.uint16)
    words = np.empty((states.shape[0], 16 * bits), dtype=np.uint16)
    check(lib.tf_exl3_pack_states(ffi.cast("uint16_t *", states.ctypes.data), states.shape[0], bits,
                                  ffi.cast("uint16_t *", words.ctypes.data)))
    return words


def to_tiles(matrix: np.ndarray) -> np.ndarray:
    """(k_p, n_p) -> (tiles, 256): tile (tk, tn) row-major over tiles, each in trellis (PERM) order."""
    k, n = matrix.shape
    tiles = matrix.reshape(k // 16, 16, n // 16, 16).transpose(0, 2, 1, 3).reshape(-1, 256)
    return tiles[:, tile_perm()]


def quantize_linear(weight_hf: np.ndarray, bias: np.ndarray | None, bits: int, codebook: str,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One linear, HF layout (out, in) -> the EXL3 tensors of EXL3.md §2 (keys without the prefix)."""
    w = np.asarray(weight_hf, dtype=np.float64).T
    k, n = w.shape
    k_p, n_p = -(-k // 128) * 128, -(-n // 128) * 128
    padded = np.zeros((k_p, n_p))
    padded[:k, :n] = w
    # Output side: random signs, no output scales (EXL3.md §11.3 out_scales "never").
    sv = np.where(rng.standard_normal(n_p) < 0, -1.0, 1.0)
    sv[n:] = 0.0
    rotated = hadamard_right(padded * sv[None, :])
    # Input side: random signs times the row RMS, so rows of the target have the codebook's RMS.
    row_rms = np.sqrt(np.mean(rotated ** 2, axis=1))
    row_rms[row_rms < 1e-30] = 0.1
    su_sign = np.where(rng.standard_normal(k_p) < 0, -1.0, 1.0)
    su = su_sign * row_rms / CODEBOOK_RMS[codebook]
    scale = _global_scale(rotated, su, bits, codebook)
    suh = (su / scale).astype(np.float16)
    svh = sv.astype(np.float16)
    # The target uses the stored fp16 scales, so reconstruction with them returns W.
    inverse_v = np.divide(1.0, svh.astype(np.float64), out=np.zeros(n_p), where=svh != 0)
    target = hadamard_left(hadamard_right((padded / suh.astype(np.float64)[:, None]) * inverse_v[None, :]))
    states = encode_tiles(to_tiles(target), bits, codebook)
    out = {"trellis": pack_states(states, bits).reshape(k_p // 16, n_p // 16, 16 * bits).view(np.int16),
           "suh": suh, "svh": svh}
    if codebook in MARKERS:
        out[codebook] = np.array(MARKERS[codebook], dtype=np.int32)
    if bias is not None:
        padded_bias = np.zeros(n_p, dtype=np.float16)
        padded_bias[:n] = np.asarray(bias, dtype=np.float64).astype(np.float16)
        out["bias"] = padded_bias
    return out


def hadamard_left(matrix: np.ndarray) -> np.ndarray:
    """Hk · M, block-diagonal over 128-row chunks, without forming Hk."""
    k, n = matrix.shape
    return (hadamard_128() @ matrix.reshape(k // 128, 128, n)).reshape(k, n)


def hadamard_right(matrix: np.ndarray) -> np.ndarray:
    """M · Hn, block-diagonal over 128-column chunks."""
    k, n = matrix.shape
    return (matrix.reshape(k, n // 128, 128) @ hadamard_128()).reshape(k, n)


def _global_scale(rotated: np.ndarray, su: np.ndarray, bits: int, codebook: str) -> float:
    """The g of EXL3.md §11.3 step 4, searched over a few candidates on a sample of tiles."""
    target = hadamard_left(rotated / su[:, None])
    tiles = to_tiles(target)
    sample = tiles[np.linspace(0, len(tiles) - 1, min(SCALE_SAMPLE_TILES, len(tiles))).astype(int)]
    from .reference.exl3 import decode_states
    best, best_error = 1.0, np.inf
    for g in SCALE_CANDIDATES:
        states = encode_tiles(sample * g, bits, codebook)
        decoded = decode_states(states.astype(np.int64), codebook).astype(np.float64) / g
        error = float(np.mean((decoded - sample) ** 2))
        if error < best_error:
            best, best_error = g, error
    return best


def quantize(in_dir: str | os.PathLike, out_dir: str | os.PathLike, bits: int = 3, head_bits: int = 6,
             codebook: str = "mul1", seed: int = 0, overwrite: bool = False, progress: bool = True) -> pathlib.Path:
    in_dir, out_dir = pathlib.Path(in_dir), pathlib.Path(out_dir)
    if codebook not in CODEBOOKS:
        raise QuantizeError(f"codebook must be one of {', '.join(CODEBOOKS)}, not '{codebook}'")
    if not 1 <= bits <= 8 or not (1 <= head_bits <= 8 or head_bits == 16):
        raise QuantizeError("bits must be 1..8 and head bits 1..8 or 16")
    config_path = in_dir / "config.json"
    if not config_path.is_file():
        raise QuantizeError(f"{in_dir} has no config.json")
    config = json.loads(config_path.read_text())
    if "quantization_config" in config:
        raise QuantizeError(f"{in_dir} is already quantized ({config['quantization_config'].get('quant_method')})")
    tensors, dtypes = load_checkpoint(in_dir)
    layout = plan(config, tensors, bits, head_bits)

    with OutputDirectory(out_dir, overwrite=overwrite) as partial:  # fails now, not after the work
        quantized = _quantize_linears(tensors, dtypes, layout, codebook, seed, progress)
        _write(partial, in_dir, config, tensors, dtypes, layout, quantized, bits, head_bits, codebook)
    return out_dir


def _quantize_linears(tensors, dtypes, layout: Plan, codebook: str, seed: int, progress: bool) -> dict:
    quantized: dict[str, dict[str, np.ndarray]] = {}
    by_layer: dict[str, list[str]] = {}
    for prefix in layout.linears:
        by_layer.setdefault(prefix.split(".mlp")[0].split(".self_attn")[0], []).append(prefix)
    for group, prefixes in by_layer.items():
        # One generator per linear, seeded from its name: the output does not depend on order.
        for prefix in tqdm(prefixes, desc=group, disable=not progress, leave=False):
            rng = np.random.default_rng([seed, *prefix.encode()])
            weight = tensors[f"{prefix}.weight"]
            if dtypes[f"{prefix}.weight"] == "BF16":
                weight = safetensors_io.bf16_to_float32(weight)
            bias = tensors.get(f"{prefix}.bias")
            if bias is not None and dtypes[f"{prefix}.bias"] == "BF16":
                bias = safetensors_io.bf16_to_float32(bias)
            quantized[prefix] = quantize_linear(weight, bias, layout.linears[prefix], codebook, rng)

    return quantized


def _write(partial, in_dir, config, tensors, dtypes, layout: Plan, quantized, bits: int, head_bits: int, codebook: str) -> None:
    entries, arrays = [], {}
    for name in layout.copied:
        entries.append((name, dtypes[name], tuple(tensors[name].shape)))
        arrays[name] = tensors[name]
    for prefix, parts in quantized.items():
        for part, array in parts.items():
            label = {np.dtype(np.int16): "I16", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}[array.dtype]
            entries.append((f"{prefix}.{part}", label, tuple(array.shape)))
            arrays[f"{prefix}.{part}"] = array
    entries.sort()
    mean_bits = sum(b * tensors[f"{p}.weight"].size for p, b in layout.linears.items() if p != "lm_head") / \
        max(1, sum(tensors[f"{p}.weight"].size for p in layout.linears if p != "lm_head"))
    quantization_config = {"quant_method": "exl3", "version": f"trellisforge-{version()}", "bits": round(mean_bits, 2),
                           "head_bits": head_bits, "calibration": {"rows": 0, "cols": 0}, "out_scales": "never",
                           "codebook": codebook}
    writer = ShardWriter(partial / "model.safetensors", entries, metadata={"format": "pt"})
    try:
        for name, _, _ in entries:
            writer.write(name, arrays[name])
        writer.close()
    except BaseException:
        writer.abort()
        raise
    (partial / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}, indent=2))
    storage = {p: {"quant_format": "exl3", "bits_per_weight": b,
                   "stored_tensors": {f"{p}.{part}": {"shape": list(a.shape), "dtype": str(a.dtype)} for part, a in quantized[p].items()}}
               for p, b in layout.linears.items()}
    (partial / "quantization_config.json").write_text(json.dumps({**quantization_config, "tensor_storage": storage}, indent=1))
    for name in COPIED_FILES:
        if (in_dir / name).is_file():
            shutil.copyfile(in_dir / name, partial / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trellisforge.quantize", description=__doc__.split("\n\n")[0])
    parser.add_argument("in_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--head-bits", type=int, default=6)
    parser.add_argument("--codebook", default="mul1", choices=sorted(CODEBOOKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    try:
        quantize(args.in_dir, args.out_dir, args.bits, args.head_bits, args.codebook, args.seed, args.overwrite)
    except (QuantizeError, FileExistsError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
