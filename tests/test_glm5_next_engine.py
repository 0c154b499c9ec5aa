"""GLM-5.3-Flash (`glm5_next`: KDA linear attention, NoPE MLA with the pooled DSA indexer, mHC
hyper-connections, clamped SwiGLU) on the engine's CPU backend: logits at every prompt position
against the exact answer (transformers fp32 on the dequantized fixture weights) and the float64
reference, greedy decoding, the recurrent state's batch invariance, chunk boundaries and slot reuse
bit for bit, its accounting, tensor parallelism, the variants the fixture does not carry, and
checkpoints that lie.

The pooled indexer's ties: pools tied exactly at the (index_topk / index_kpool)-th score are the
implementation's choice. The engine takes the earlier pools, as the float64 reference does;
transformers' torch.topk may take others, so dequant_ref is compared before the first tied query
and the float64 reference at every position."""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
from conftest import SHARED, relative_l2, within
from glm5_next_models import VARIANTS, prompt, write_variant

import trellisforge
from trellisforge import TrellisError, safetensors_io
from trellisforge.reference import glm5_next as reference_model

# f32 engine vs fp32 transformers / the float64 reference: measured 4.0e-6 .. 5.3e-6 at the worst
# position of each fixture prompt (long: vs the reference; vs dequant_ref before its first tie,
# position 146). For scale, on `chat` one Sinkhorn step fewer moves the exact answer 3.6e-5 and
# hc_eps = 0 8.1e-6; the swiglu clamp never binds on this fixture (a variant below makes it bind).
TOL = 1e-5


def fixture_or_skip() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("TF_SHARED_GLM5_NEXT", SHARED.parent / "glm5_next"))
    if not path.is_dir():
        pytest.skip(f"{path} is absent: the GLM-5.3-Flash fixture is read from ../shared (36 MB, too large to copy into tests/)")
    return path


def worst(logits: np.ndarray, expected: np.ndarray, positions=None) -> float:
    positions = range(len(expected)) if positions is None else positions
    return max(relative_l2(logits[t], expected[t]) for t in positions)


@pytest.fixture(scope="module")
def fixture():
    root = fixture_or_skip()
    engine = trellisforge.Engine(root / "exl3_3.0bpw", max_seqs=4, kv_dtype="f32")
    yield root, engine
    engine.close()


def prompts(root) -> dict[str, list[int]]:
    return json.loads((root / "prompts.json").read_text())


def test_prompt_logits_match_the_exact_answer(fixture):
    root, engine = fixture
    expected = safetensors_io.load(root / "dequant_ref" / "3.0bpw" / "dequant_fp32_logits.safetensors")
    model = reference_model.Model(root / "exl3_3.0bpw")
    for name, tokens in prompts(root).items():
        logits = engine.logits(tokens)
        exact, _ = model.forward(tokens)
        within(worst(logits, exact), TOL, f"glm5_next {name}: every position vs the float64 reference (earlier-pool ties)")
        tie = model.first_near_tie(0.0)
        positions = range(len(tokens) if tie is None else tie)
        within(worst(logits, expected[name], positions), TOL, f"glm5_next {name}: {len(positions)} positions vs dequant_ref")


def test_greedy_decoding_matches_the_exact_answer(fixture):
    """32 greedy tokens per prompt equal transformers'; where no pool selection ties, the logprob of
    each equals the one in transformers' step logits (generated rows carry the KDA state on)."""
    root, engine = fixture
    greedy = json.loads((root / "dequant_ref" / "3.0bpw" / "dequant_fp32_greedy.json").read_text())
    steps = safetensors_io.load(root / "dequant_ref" / "3.0bpw" / "dequant_fp32_logits.safetensors")
    for name, tokens in prompts(root).items():
        events = list(engine.stream(tokens, max_tokens=32, stop_token_ids=[]))
        assert [e.token for e in events] == greedy[name], name
        if name == "long":
            continue  # its pool selection ties (above) move the step logits, not the tokens
        expected = steps[f"{name}__greedy_step_logits"].astype(np.float64)
        shifted = expected - expected.max(1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        exact = log_softmax[np.arange(32), greedy[name]]
        assert np.max(np.abs(np.array([e.logprob for e in events]) - exact)) < 1e-4, name


def test_batch_invariance_chunk_boundaries_and_slot_reuse_bit_for_bit(fixture):
    """The KDA state is per sequence: the same prompt alone, batched with others, cut into chunks of
    1, 7 and 64 rows, or in a slot a cancelled sequence held mid-prompt (its pages all returned)
    gives the same bits."""
    root, engine = fixture
    p = prompts(root)
    alone = engine.logits(p["long"])
    batched = engine.logits_batch([p["short"], p["long"], p["chat"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))
    for rows_max in (1, 64):
        with trellisforge.Engine(root / "exl3_3.0bpw", max_seqs=1, rows_max=rows_max, page_tokens=16, kv_dtype="f32") as other:
            assert np.array_equal(alone.view(np.uint32), other.logits(p["long"]).view(np.uint32)), rows_max
    with trellisforge.Engine(root / "exl3_3.0bpw", max_seqs=1, rows_max=7, page_tokens=5, kv_dtype="f32") as chunked:
        assert np.array_equal(alone.view(np.uint32), chunked.logits(p["long"]).view(np.uint32))
        sequence = chunked.add(p["chat"], trellisforge.Sampling(max_tokens=4))
        chunked.step()  # 7 rows of the chat prompt into the only slot's state, then cancelled
        chunked.cancel(sequence)
        stats = chunked.stats()
        assert stats["sequences_live"] == 0 and stats["pages_free"] == stats["pages_total"]
        assert np.array_equal(alone.view(np.uint32), chunked.logits(p["long"]).view(np.uint32))


def test_decode_rows_equal_prompt_rows(fixture):
    """A generated row continues the state its prompt left: a decode step's logits equal the
    prompt logits of the extended sequence."""
    root, engine = fixture
    tokens = prompts(root)["chat"]
    events = list(engine.stream(tokens, max_tokens=6, stop_token_ids=[], top_logprobs=3))
    extended = engine.logits(tokens + [e.token for e in events[:-1]])
    for i, event in enumerate(events):
        row = extended[len(tokens) - 1 + i].astype(np.float64)
        log_softmax = row - row.max() - np.log(np.exp(row - row.max()).sum())
        assert event.logprob == pytest.approx(log_softmax[event.token], abs=2e-6)


def test_the_recurrent_state_is_accounted(fixture):
    root, engine = fixture
    c = json.loads((root / "exl3_3.0bpw" / "config.json").read_text())["text_config"]
    kda_layers = c["layer_types"].count("linear_attention")
    heads, dim, taps = c["linear_num_heads"], c["linear_head_dim"], c["linear_conv_kernel_dim"]
    per_sequence = 4 * kda_layers * (heads * dim * dim + (taps - 1) * 3 * heads * dim)
    stats = engine.stats()
    assert stats["state_bytes_per_sequence"] == per_sequence
    assert stats["state_bytes_total"] == per_sequence * stats["sequences_max"]


def test_tensor_parallel_equals_one_rank(fixture):
    """Two ranks split KDA's heads (q/k/v, convolution channels, gates, state), MLA's heads and the
    experts; the hyper-connections and the pooled indexer run whole on each."""
    root, engine = fixture
    tokens = prompts(root)["long"]
    with trellisforge.Engine(root / "exl3_3.0bpw", max_seqs=2, tp_world=2, kv_dtype="f32") as two:
        within(worst(two.logits(tokens), engine.logits(tokens)), TOL, "glm5_next TP=2 vs TP=1")
        assert two.generate(tokens, max_tokens=8, stop_token_ids=[]) == engine.generate(tokens, max_tokens=8, stop_token_ids=[])


def test_two_processes_on_loopback_equal_two_threads_bit_for_bit(fixture):
    """Across processes each step's plan carries every row's sequence slot, so each rank's part of
    the recurrent state is the one of that sequence; the bits are those of two ranks in one process
    (on GPUs: tests/test_cuda_tensor_parallel.py)."""
    from server_process import free_port
    from test_tensor_parallel import start_worker
    root, engine = fixture
    directory = root / "exl3_3.0bpw"
    p = prompts(root)
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master)
    try:
        with trellisforge.Engine(directory, max_seqs=2, tp_world=2, tp_master=master, kv_dtype="f32") as over_tcp, \
                trellisforge.Engine(directory, max_seqs=2, tp_world=2, kv_dtype="f32") as threads:
            for name in ("chat", "long"):
                assert np.array_equal(over_tcp.logits(p[name]).view(np.uint32), threads.logits(p[name]).view(np.uint32)), name
            assert over_tcp.generate(p["chat"], 8, stop_token_ids=[]) == engine.generate(p["chat"], 8, stop_token_ids=[])
        assert worker.wait(timeout=30) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "hf_modules"])
def test_variants_match_the_float64_reference(tmp_path, variant):
    """The configs and tensor forms the fixture does not carry (softplus gate, no tail, pools of 1
    and 2, a shared indexer layer, 2 streams, group-limited routing, transformers' default layer
    schedules, q/k/v and their convolutions apart) against the float64 reference; their
    swiglu_limit of 2 makes the clamps bind."""
    model_dir = write_variant(tmp_path / variant, variant, seed=3)
    model = reference_model.Model(model_dir)
    tokens = prompt(json.loads((model_dir / "config.json").read_text()))
    expected, _ = model.forward(tokens)
    # Exact ties (pools every head's ReLU zeroes) go to the earlier pool in both; a near one could
    # flip between f32 and float64.
    for layer in model.indexer_scores:
        margins = model.selection_margins(layer)
        assert not np.any((margins > 0) & (margins < 1e-6)), f"layer {layer}: a pool selection within 1e-6 of flipping"
    with trellisforge.Engine(model_dir, max_seqs=2, rows_max=16, kv_dtype="f32") as engine:
        within(worst(engine.logits(tokens), expected), TOL, f"glm5_next {variant}: worst of {len(tokens)} positions")


def test_fused_expert_tensors_get_a_clear_error(tmp_path):
    """transformers' module names with experts fused into gate_up_proj (as its save_pretrained may
    write them) are not read: the error names the expert tensor it looked for."""
    model_dir = write_variant(tmp_path / "hf_modules", "hf_modules", seed=3)
    with pytest.raises(TrellisError, match=r"missing tensor 'model\.layers\.1\.mlp\.experts\.0\.gate_proj"):
        trellisforge.Engine(model_dir, max_seqs=1, kv_dtype="f32")


def drop_tensor(name: str):
    def edit(model_dir):
        path = model_dir / "model.safetensors"
        header, _ = safetensors_io.read_header(path)
        tensors = safetensors_io.load(path)
        del tensors[name]
        safetensors_io.save(path, tensors, {k: v["dtype"] for k, v in header.items() if k in tensors})
    return edit


def reshape_tensor(name: str, shape):
    def edit(model_dir):
        path = model_dir / "model.safetensors"
        header, _ = safetensors_io.read_header(path)
        tensors = safetensors_io.load(path)
        tensors[name] = np.zeros(shape, dtype=tensors[name].dtype)
        safetensors_io.save(path, tensors, {k: v["dtype"] for k, v in header.items() if k in tensors})
    return edit


def set_text_config(**fields):
    def edit(model_dir):
        config = json.loads((model_dir / "config.json").read_text())
        config["text_config"].update(fields)
        (model_dir / "config.json").write_text(json.dumps(config))
    return edit


@pytest.mark.parametrize("edit,fragments", [
    (drop_tensor("model.language_model.layers.2.hc_ffn_fn"), ["model.language_model.layers.2.hc_ffn_fn"]),
    (drop_tensor("model.language_model.layers.0.self_attn.A_log"), ["self_attn.A_log"]),
    (reshape_tensor("model.language_model.layers.0.self_attn.conv1d.weight", (192, 1, 3)), ["conv1d.weight", "shape"]),
    (set_text_config(indexer_types=["full", "full", "full", "shared"]), ["layer 3 shares the indexer selection"]),
    (set_text_config(qk_rope_head_dim=64), ["NoPE"]),
    (set_text_config(index_topk=18), ["index_topk must be a multiple of index_kpool"]),
    (set_text_config(hc_mult=17), ["hc_mult"]),
    (set_text_config(layer_types=["linear_attention", "sliding_attention", "linear_attention", "deepseek_sparse_attention"]),
     ["layer_types"]),
])
def test_checkpoints_that_lie_get_clear_errors(tmp_path, edit, fragments):
    model_dir = write_variant(tmp_path / "model", "base", seed=3)
    edit(model_dir)
    with pytest.raises(TrellisError) as caught:
        trellisforge.Engine(model_dir, max_seqs=1, kv_dtype="f32")
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
