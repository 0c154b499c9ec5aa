"""GLM-5.3-Flash (`glm5_next`) on the CUDA backend, against the float64 reference, the CPU forward
and the exact answer: logits at every position, greedy continuations, the recurrent state's batch
invariance, chunk boundaries and slot reuse bit for bit, recorded graphs, the variants with their
clamps binding, and pages and slots returned. Skips, with the library's reason, where no GPU is
usable."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import within
from exl3_files import random_layer
from glm5_next_models import FORMS, VARIANTS, prompt, variant_config, write_model
from test_glm5_next_engine import fixture_or_skip, worst

import trellisforge
from trellisforge import safetensors_io
from trellisforge.reference import glm5_next as reference_model

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
# Both f32; they differ in summation order (warp trees, fused multiply-adds), and the KDA state
# carries that along the sequence.
TOL_GPU = 1e-4


@pytest.fixture(scope="module")
def engines():
    root = fixture_or_skip()
    gpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=8, kv_dtype="f32")
    cpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cpu", max_seqs=8, kv_dtype="f32")
    yield root, gpu, cpu
    stats = gpu.stats()
    assert stats["pages_free"] == stats["pages_total"] and stats["sequences_live"] == 0


def prompts(root) -> dict:
    return json.loads((root / "prompts.json").read_text())


def test_gpu_logits_match_the_reference_the_cpu_and_the_exact_answer(engines):
    root, gpu, cpu = engines
    expected = safetensors_io.load(root / "dequant_ref" / "3.0bpw" / "dequant_fp32_logits.safetensors")
    model = reference_model.Model(root / "exl3_3.0bpw")
    for name, tokens in prompts(root).items():
        on_gpu = gpu.logits(tokens)
        exact, _ = model.forward(tokens)
        within(worst(on_gpu, exact), TOL_GPU, f"glm5_next {name}: GPU vs the float64 reference (earlier-pool ties)")
        within(worst(on_gpu, cpu.logits(tokens)), TOL_GPU, f"glm5_next {name}: GPU vs CPU")
        tie = model.first_near_tie(0.0)
        positions = range(len(tokens) if tie is None else tie)
        within(worst(on_gpu, expected[name], positions), TOL_GPU, f"glm5_next {name}: GPU vs exact ({len(positions)} positions)")


def test_gpu_greedy_equals_the_exact_answer(engines):
    root, gpu, _ = engines
    greedy = json.loads((root / "dequant_ref" / "3.0bpw" / "dequant_fp32_greedy.json").read_text())
    for name, tokens in prompts(root).items():
        assert gpu.generate(tokens, 32, stop_token_ids=[]) == greedy[name], name


def test_gpu_batch_invariance_chunk_boundaries_and_slot_reuse_bit_for_bit(engines):
    root, gpu, _ = engines
    p = prompts(root)
    alone = gpu.logits(p["long"])
    batched = gpu.logits_batch([p["short"], p["long"], p["chat"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))
    with trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=1, rows_max=7, page_tokens=5, kv_dtype="f32") as small:
        assert np.array_equal(small.logits(p["long"]).view(np.uint32), alone.view(np.uint32))
        sequence = small.add(p["chat"], trellisforge.Sampling(max_tokens=4))
        small.step()  # 7 rows of chat into the only slot's state, then cancelled
        small.cancel(sequence)
        assert np.array_equal(small.logits(p["long"]).view(np.uint32), alone.view(np.uint32))


def test_graphs_keep_the_bits(engines, monkeypatch):
    """Decode steps replay recorded graphs (the runs and slots are device inputs); without graphs
    the sampled tokens' log-probabilities are the same bits."""
    root, gpu, _ = engines
    tokens = prompts(root)["chat"]
    recorded = [e.logprob for e in gpu.stream(tokens, max_tokens=12, stop_token_ids=[], temperature=0.8, seed=3)]
    assert gpu.stats()["graph_replays"] > 0
    monkeypatch.setenv("TF_CUDA_GRAPHS", "0")
    with trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=2, kv_dtype="f32") as plain:
        replayed = [e.logprob for e in plain.stream(tokens, max_tokens=12, stop_token_ids=[], temperature=0.8, seed=3)]
        assert plain.stats()["graph_replays"] == 0
    assert np.array_equal(np.array(recorded, dtype=np.float32).view(np.uint32), np.array(replayed, dtype=np.float32).view(np.uint32))


def gpu_variant(path, variant: str, **fields):
    """The variant at the CUDA kernels' shapes (kv_lora_rank 512, index and KDA head dims 128,
    hidden 128) with its MLP and expert projections as random 4-bit EXL3 layers (the GPU runs
    EXL3 experts only); attention projections stay unquantized. `fields` override text_config."""
    config = variant_config(variant)
    t = config["text_config"]
    t.update({**dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, kv_lora_rank=512,
                     index_head_dim=128, linear_head_dim=128), **fields})
    t["linear_attn_config"] = {**t["linear_attn_config"], "head_dim": 128}
    write_model(path, config, FORMS.get(variant, "peer"), seed=3)
    file = path / "model.safetensors"
    header, _ = safetensors_io.read_header(file)
    tensors = safetensors_io.load(file)
    dtypes = {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
    rng = np.random.default_rng(5)
    for name in [n for n in tensors if ".mlp." in n and n.endswith("_proj.weight")]:
        out_features, in_features = tensors.pop(name).shape
        dtypes.pop(name, None)
        prefix = name[: -len(".weight")]
        layer = random_layer(rng, prefix, in_features, out_features, 4, "mul1", bias=False)
        layer[f"{prefix}.svh"] = (layer[f"{prefix}.svh"] * 0.4).astype(np.float16)
        tensors.update(layer)
    safetensors_io.save(file, tensors, {k: v for k, v in dtypes.items() if k in tensors})
    return path


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "hf_modules"])
def test_gpu_variants_match_the_float64_reference(tmp_path, variant):
    model_dir = gpu_variant(tmp_path / variant, variant)
    model = reference_model.Model(model_dir)
    tokens = prompt(json.loads((model_dir / "config.json").read_text()))
    expected, _ = model.forward(tokens)
    for layer in model.indexer_scores:
        margins = model.selection_margins(layer)
        assert not np.any((margins > 0) & (margins < 1e-5)), f"layer {layer}: a pool selection within 1e-5 of flipping"
    with trellisforge.Engine(model_dir, backend="cuda", max_seqs=2, rows_max=16, kv_dtype="f32") as engine:
        within(worst(engine.logits(tokens), expected), TOL_GPU, f"glm5_next {variant} on the GPU: worst of {len(tokens)} positions")


def test_hyper_sites_fused_or_apart_give_the_same_bits(tmp_path, monkeypatch):
    """A site's maps, collapse and norm in one launch (tf_hc_enter) and the MoE combine inside the
    leave (tf_hc_leave_combined) give the bits of the launches they replace (TF_CUDA_HC_FUSED=0):
    prompt logits over several chunks, and sampled tokens' log-probabilities through replayed
    graphs; the timeline shows which launches ran."""
    model_dir = gpu_variant(tmp_path / "base", "base")
    tokens = prompt(json.loads((model_dir / "config.json").read_text()))

    def run():
        with trellisforge.Engine(model_dir, backend="cuda", max_seqs=2, rows_max=16, kv_dtype="f32") as engine:
            logits = engine.logits(tokens)
            engine.add(tokens, trellisforge.Sampling(max_tokens=8, temperature=0.8, seed=3), stop_token_ids=[])
            logprobs, names, step = [], set(), 0
            while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
                timed = step == len(tokens) // 16 + 2  # a decode step
                if timed:
                    engine.time_next_step()
                logprobs += [e.logprob for e in engine.step()]
                if timed:
                    names = {e["name"] for e in engine.timeline()}
                step += 1
            assert engine.stats()["graph_replays"] > 0
        return logits, np.array(logprobs, dtype=np.float32), names

    fused_logits, fused_logprobs, fused_names = run()
    monkeypatch.setenv("TF_CUDA_HC_FUSED", "0")
    apart_logits, apart_logprobs, apart_names = run()
    assert {"tf_hc_enter", "tf_hc_leave_combined"} <= fused_names and not {"tf_hc_maps", "tf_moe_combine"} & fused_names
    assert {"tf_hc_maps", "tf_moe_combine"} <= apart_names and not {"tf_hc_enter", "tf_hc_leave_combined"} & apart_names
    assert len(fused_logprobs) == 8
    assert np.array_equal(fused_logits.view(np.uint32), apart_logits.view(np.uint32))
    assert np.array_equal(fused_logprobs.view(np.uint32), apart_logprobs.view(np.uint32))
