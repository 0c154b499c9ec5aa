"""The CUDA forward against the CPU forward (the reference) through the same engine: logits at
every position, greedy continuations, batch invariance bit for bit on the GPU, and KV pages.
Skips, with the library's reason, where no GPU is usable."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, model_config, prompts, reference_greedy, reference_logits

import trellisforge

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
# Both are f32; they differ in summation order (warp trees, fused multiply-adds), ~1e-6.
TOL_GPU_VS_CPU = 1e-4


@pytest.fixture(scope="module", params=["3.0", "4.0"])
def engines(request):
    directory = checkpoint_dir(request.param)
    gpu = trellisforge.Engine(directory, backend="cuda", max_seqs=8, kv_dtype="f32")
    cpu = trellisforge.Engine(directory, backend="cpu", max_seqs=8, kv_dtype="f32")
    yield request.param, gpu, cpu
    stats = gpu.stats()
    assert stats["pages_free"] == stats["pages_total"]


def test_gpu_logits_match_cpu_and_the_exact_reference(engines):
    variant, gpu, cpu = engines
    reference = reference_logits(variant)
    for name, tokens in prompts().items():
        on_gpu = gpu.logits(tokens)
        on_cpu = cpu.logits(tokens)
        within(max(relative_l2(on_gpu[t], on_cpu[t]) for t in range(len(tokens))), TOL_GPU_VS_CPU, f"{variant} {name}: GPU vs CPU")
        within(max(relative_l2(on_gpu[t], reference[name][t]) for t in range(len(tokens))), TOL_GPU_VS_CPU, f"{variant} {name}: GPU vs exact")


def test_gpu_greedy_equals_the_exact_reference(engines):
    variant, gpu, _ = engines
    expected = reference_greedy(variant)
    for name, tokens in prompts().items():
        assert gpu.generate(tokens, 32, stop_token_ids=[]) == expected[name], name


def test_gpu_batch_invariance_bit_for_bit(engines):
    _, gpu, _ = engines
    p = prompts()
    alone = gpu.logits(p["short"])
    batched = gpu.logits_batch([p["long"], p["short"], p["chat"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))
    small_steps = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=7, page_tokens=5, kv_dtype="f32")
    big = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=512, kv_dtype="f32")
    assert np.array_equal(small_steps.logits(p["long"]).view(np.uint32), big.logits(p["long"]).view(np.uint32))


def test_gpu_decode_with_continuous_batching(engines):
    _, gpu, cpu = engines
    p = prompts()
    sampling = trellisforge.Sampling(max_tokens=10, temperature=0.9, seed=11)
    ids = [gpu.add(p[name], sampling, stop_token_ids=[]) for name in ("chat", "short", "random")]
    tokens = {i: [] for i in ids}
    while gpu.stats()["sequences_live"] or gpu.stats()["sequences_waiting"]:
        for event in gpu.step():
            tokens[event.sequence_id].append(event.token)
    alone = gpu.generate(p["short"], 10, temperature=0.9, seed=11, stop_token_ids=[])
    assert tokens[ids[1]] == alone
    assert all(len(t) == 10 for t in tokens.values())


def test_recorded_graphs_replay_the_same_bits(monkeypatch):
    """Forwards of few rows are recorded as CUDA graphs and replayed; they must give the bits of
    the same launches issued one by one (TF_CUDA_GRAPHS=0), step after step."""
    p = prompts()
    replayed = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=4, kv_dtype="f32")
    monkeypatch.setenv("TF_CUDA_GRAPHS", "0")
    direct = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=4, kv_dtype="f32")
    for name, tokens in p.items():
        for _ in range(2):  # the second pass replays the recording made by the first
            assert np.array_equal(replayed.logits(tokens).view(np.uint32), direct.logits(tokens).view(np.uint32)), name
    for name in ("chat", "random"):
        assert replayed.generate(p[name], 24, stop_token_ids=[]) == direct.generate(p[name], 24, stop_token_ids=[]), name
    assert replayed.stats()["graph_replays"] > 24
    assert direct.stats()["graph_replays"] == 0


@pytest.mark.parametrize("variant", ["3.0", "4.0"])
def test_grouped_and_item_paths_give_the_same_bits(variant, monkeypatch):
    """With 4 items per layer or more, a linear sorts its items by layer and lets one decoded tile
    serve up to 16 of them; otherwise it runs item by item. A 40-token prompt in chunks of 3 rows
    (item path everywhere) and in one chunk (grouped path) must give the same bits everywhere.
    The prompt kernels are off (TF_CUDA_PROMPT=0) so that the experts take the GEMV too. A test per
    variant, so that the 3.0 fixture's is reported on its own where the 4.0 one is absent."""
    monkeypatch.setenv("TF_CUDA_PROMPT", "0")
    tokens = [int(t) for t in np.random.default_rng(9).integers(0, 2048, 40)]
    items = trellisforge.Engine(checkpoint_dir(variant), backend="cuda", max_seqs=2, rows_max=3, kv_dtype="f32")
    grouped = trellisforge.Engine(checkpoint_dir(variant), backend="cuda", max_seqs=2, rows_max=64, kv_dtype="f32")
    assert np.array_equal(items.logits(tokens).view(np.uint32), grouped.logits(tokens).view(np.uint32)), variant


def test_rows_next_to_a_chunk_boundary_equal_the_rows_computed_alone():
    """Rows 1023, 1024 and 1025 of a 1030-row prompt prefilled in chunks of 1024 rows (a chunk
    boundary between them: the experts on the prompt kernels in groups of up to 64 rows, the other
    linears on the grouped GEMV) equal the same rows computed one row per forward (groups of one
    row, the item GEMV), bit for bit: tile settings depend on the shape alone."""
    tokens = [int(t) for t in np.random.default_rng(10).integers(0, 2048, 1030)]
    batched = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=1, rows_max=1024, ctx=1040, kv_dtype="f32").logits(tokens)
    alone = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=1, rows_max=1, ctx=1040, kv_dtype="f32").logits(tokens[:1026])
    for position in (1023, 1024, 1025):
        assert np.array_equal(batched[position].view(np.uint32), alone[position].view(np.uint32)), position


def test_prompt_rows_take_the_prompt_kernels_and_generated_rows_the_gemv(monkeypatch):
    """Both MoE layers of the fixtures (layer 0 is dense) are on the prompt path; a prompt's rows
    go through it and the rows generated after it do not. TF_CUDA_PROMPT=0 turns it off."""
    for variant in ("3.0", "4.0"):
        engine = trellisforge.Engine(checkpoint_dir(variant), backend="cuda", max_seqs=2, kv_dtype="f32")
        assert engine.stats()["prompt_layers"] == 2
        tokens = prompts()["chat"]
        engine.generate(tokens, 6, stop_token_ids=[])
        assert engine.stats()["prompt_rows"] == len(tokens)
    monkeypatch.setenv("TF_CUDA_PROMPT", "0")
    off = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    off.logits(prompts()["short"])
    assert off.stats()["prompt_layers"] == 0 and off.stats()["prompt_rows"] == 0


@pytest.mark.parametrize("variant", ["3.0", "4.0"])
def test_prompt_kernels_match_the_cpu_at_1_40_200_and_1030_rows(variant, monkeypatch):
    """Prompts of 1, 40, 200 and 1030 rows in one chunk: the experts on the tensor-core prompt
    kernels (fp16 high/low inputs, fp32 accumulation) against the CPU forward (itself within 1e-4
    of the float64 reference), and against the same GPU forward on the GEMV."""
    directory = checkpoint_dir(variant)
    fused = trellisforge.Engine(directory, backend="cuda", max_seqs=1, rows_max=1030, ctx=1040, kv_dtype="f32")
    cpu = trellisforge.Engine(directory, backend="cpu", max_seqs=1, rows_max=1030, ctx=1040, kv_dtype="f32")
    monkeypatch.setenv("TF_CUDA_PROMPT", "0")
    gemv = trellisforge.Engine(directory, backend="cuda", max_seqs=1, rows_max=1030, ctx=1040, kv_dtype="f32")
    rng = np.random.default_rng(12)
    for rows in (1, 40, 200, 1030):
        tokens = [int(t) for t in rng.integers(0, 2048, rows)]
        on_fused = fused.logits(tokens)
        on_cpu = cpu.logits(tokens)
        on_gemv = gemv.logits(tokens)
        within(max(relative_l2(on_fused[t], on_cpu[t]) for t in range(rows)), TOL_GPU_VS_CPU, f"{variant} {rows} rows: prompt kernels vs CPU")
        within(max(relative_l2(on_fused[t], on_gemv[t]) for t in range(rows)), TOL_GPU_VS_CPU, f"{variant} {rows} rows: prompt kernels vs GEMV")
    assert fused.stats()["prompt_rows"] == 1 + 40 + 200 + 1030


def test_generated_rows_keep_their_bits_when_prompt_rows_share_the_step():
    """A sequence's generated rows take the GEMV even in steps whose other rows are a prompt on
    the prompt kernels: its tokens and log-probabilities equal those of the sequence run alone, bit
    for bit, while a second prompt is prefilled beside it."""
    p = prompts()
    sampling = trellisforge.Sampling(max_tokens=12, temperature=0.9, seed=5)

    def run(with_second_prompt: bool):
        engine = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
        first = engine.add(p["chat"], sampling, stop_token_ids=[])
        events, steps = [], 0
        while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
            steps += 1
            if with_second_prompt and steps == 4:
                engine.add(p["long"], trellisforge.Sampling(max_tokens=2), stop_token_ids=[])
            events += [(e.token, e.logprob) for e in engine.step() if e.sequence_id == first]
        expected_rows = len(p["chat"]) + (len(p["long"]) if with_second_prompt else 0)
        assert engine.stats()["prompt_rows"] == expected_rows
        return events

    alone = run(False)
    assert len(alone) == 12
    assert run(True) == alone


def assert_same_bits(a, b, p):
    """Two engines of one checkpoint on two paths: every prompt's logits (prompt kernels) and the
    log-probabilities of 12 sampled tokens after it (GEMV) are the same bits."""
    for name, tokens in p.items():
        assert np.array_equal(a.logits(tokens).view(np.uint32), b.logits(tokens).view(np.uint32)), name
        run = [[(e.token, e.logprob) for e in engine.stream(tokens, 12, temperature=0.8, seed=4, stop_token_ids=[])]
               for engine in (a, b)]
        assert run[0] == run[1] and len(run[0]) == 12, name


def test_programmatic_launches_give_the_bits_of_launches_in_order(monkeypatch):
    """On sm_90 and later a kernel may be scheduled before the one ahead of it ends (programmatic
    dependent launch) and waits for it before touching memory (grid_dependency.cuh; the PTX check
    is tests/test_kernel_grid_dependency.py). Prompt logits, generated tokens and their
    log-probabilities, replayed graphs and direct launches: the bits of strict order
    (TF_CUDA_PDL=0)."""
    p = prompts()
    overlapped = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=3, kv_dtype="f32")
    monkeypatch.setenv("TF_CUDA_PDL", "0")
    ordered = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=3, kv_dtype="f32")
    assert not ordered.stats()["programmatic_launch"]
    if not overlapped.stats()["programmatic_launch"]:
        pytest.skip("this GPU or driver launches in order only (before sm_90, or no cuLaunchKernelEx)")
    assert_same_bits(overlapped, ordered, p)
    monkeypatch.setenv("TF_CUDA_GRAPHS", "0")
    monkeypatch.delenv("TF_CUDA_PDL")
    direct = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=3, kv_dtype="f32")
    assert direct.stats()["programmatic_launch"]
    assert_same_bits(direct, ordered, p)
    assert direct.stats()["graph_replays"] == 0 and overlapped.stats()["graph_replays"] > 0


def test_the_shared_expert_merged_or_apart_gives_the_same_bits(monkeypatch):
    """The shared expert rides in the routed experts' launches (the last slot of each row, weight
    1) unless TF_CUDA_SHARED_MERGE=0 keeps it on its own: prompt logits (prompt kernels) and the
    log-probabilities of generated tokens (GEMV) are the same bits either way (apart, its launches
    take the merged table's k splits: moe_cuda.mergedShared)."""
    p = prompts()
    merged = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    monkeypatch.setenv("TF_CUDA_SHARED_MERGE", "0")
    apart = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    assert_same_bits(merged, apart, p)


def test_the_shared_expert_on_a_second_stream_gives_the_same_bits(monkeypatch):
    """A decode step runs each MoE layer's shared expert on a second stream beside the router and
    the routed experts (shared_side_cuda.zig; merged into the routed launches for prompt steps)
    unless TF_CUDA_SHARED_SIDE=0 keeps it in the main stream's launches: prompt logits, generated
    tokens and their log-probabilities are the same bits either way, from replayed graphs (the fork
    and join as graph edges) and from direct launches, merged or apart."""
    p = prompts()
    config = model_config("3.0")
    moe_layers = config["num_hidden_layers"] - config["first_k_dense_replace"]
    side = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    assert side.stats()["shared_side_layers"] == moe_layers
    monkeypatch.setenv("TF_CUDA_SHARED_SIDE", "0")
    serial = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    assert serial.stats()["shared_side_layers"] == 0
    assert_same_bits(side, serial, p)
    assert side.stats()["graph_replays"] > 0
    monkeypatch.delenv("TF_CUDA_SHARED_SIDE")
    monkeypatch.setenv("TF_CUDA_GRAPHS", "0")
    direct = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    assert_same_bits(direct, serial, p)
    monkeypatch.setenv("TF_CUDA_SHARED_MERGE", "0")
    apart = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    assert apart.stats()["shared_side_layers"] == moe_layers
    assert_same_bits(apart, serial, p)


def test_k_and_v_in_one_launch_or_two_give_the_same_bits(monkeypatch):
    """Each attention layer's k and v projections (EXL3 of one shape) run as one GEMV launch over
    both unless TF_CUDA_KV_PAIR=0 launches them apart: prompt logits, the log-probabilities of
    generated tokens, and a step of generated rows beside a prompt are the same bits either way."""
    p = prompts()
    paired = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=3, kv_dtype="f32")
    monkeypatch.setenv("TF_CUDA_KV_PAIR", "0")
    apart = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=3, kv_dtype="f32")
    assert paired.stats()["kv_pairs"] == model_config("3.0")["num_hidden_layers"]
    assert apart.stats()["kv_pairs"] == 0
    assert_same_bits(paired, apart, p)
    # A step of generated rows beside prompt rows: the pair's GEMV for the one, the prompt kernels
    # linear by linear for the other.
    def mixed(engine):
        sampling = trellisforge.Sampling(max_tokens=6, temperature=0.9, seed=5)
        first = engine.add(p["chat"], sampling, stop_token_ids=[])
        events, steps = [], 0
        while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
            steps += 1
            if steps == 3:
                engine.add(p["long"], trellisforge.Sampling(max_tokens=2), stop_token_ids=[])
            events += [(e.sequence_id == first, e.token, e.logprob) for e in engine.step()]
        return events

    assert mixed(paired) == mixed(apart)


def test_q_k_and_v_in_one_launch_keep_the_bits(monkeypatch):
    """A decode step of up to three rows runs q, k and v (EXL3 of one input, rate and codebook) as
    one GEMV launch, tf_exl3_parts_linear, each with its own launch's k split (k and v their
    pair's, or their own with TF_CUDA_KV_PAIR=0); TF_CUDA_PARTS=0 runs them apart. Sampled tokens'
    log-probabilities of one stream and of three at once are the same bits every way."""
    p = prompts()

    def three_streams(engine):
        ids = [engine.add(tokens, trellisforge.Sampling(max_tokens=6, temperature=0.9, seed=i), stop_token_ids=[])
               for i, tokens in enumerate(list(p.values())[:3])]
        events = []
        while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
            events += [(e.sequence_id - ids[0], e.token, e.logprob) for e in engine.step()]
        return events

    def attention_launches(engine):
        engine.add(p["chat"], trellisforge.Sampling(max_tokens=4), stop_token_ids=[])
        names, step = set(), 0
        while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
            if step == 2:
                engine.time_next_step()
            engine.step()
            if step == 2:
                names = {e["name"] for e in engine.timeline() if e["part"] == "attention"}
            step += 1
        return names

    engines = {}
    for parts, pair in (("1", "1"), ("1", "0"), ("0", "1")):
        monkeypatch.setenv("TF_CUDA_PARTS", parts)
        monkeypatch.setenv("TF_CUDA_KV_PAIR", pair)
        engines[parts, pair] = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=3, kv_dtype="f32")
    together, unpaired, apart = engines.values()
    assert "tf_exl3_parts_linear" in attention_launches(together) and "tf_exl3_parts_linear" in attention_launches(unpaired)
    assert "tf_exl3_parts_linear" not in attention_launches(apart)
    assert_same_bits(together, apart, p)
    assert_same_bits(unpaired, apart, p)
    want = three_streams(apart)
    assert len(want) == 18 and three_streams(together) == want and three_streams(unpaired) == want


def test_attention_spread_over_splits_gives_the_bits_of_one_block_per_row(monkeypatch):
    """Steps of up to 32 rows run tf_attention a block per (row, KV head, split) and fold the splits
    after (flash-decoding); TF_CUDA_ATTENTION_SPREAD=0 runs one block per (row, KV head) folding
    the same splits itself. A 1500-token prompt in 32-row chunks on tf_attention (rows past 1024
    positions in all 32 splits) and the tokens generated after it are the same bits both ways, and match the CPU;
    the prompt on the tensor-core prompt attention (the default) matches the CPU too."""
    rng = np.random.default_rng(5)
    config = model_config("3.0")
    prompt = [int(t) for t in rng.integers(10, config["vocab_size"], 1500)]
    tiled = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32, kv_dtype="f32")
    monkeypatch.setenv("TF_CUDA_PROMPT_ATTENTION", "0")
    spread = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32, kv_dtype="f32")
    monkeypatch.setenv("TF_CUDA_ATTENTION_SPREAD", "0")
    whole = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32, kv_dtype="f32")
    cpu = trellisforge.Engine(checkpoint_dir("3.0"), backend="cpu", max_seqs=2, kv_dtype="f32")
    on_spread = spread.logits(prompt)
    assert np.array_equal(on_spread.view(np.uint32), whole.logits(prompt).view(np.uint32))
    on_cpu = cpu.logits(prompt)
    within(max(relative_l2(on_spread[t], on_cpu[t]) for t in range(len(prompt))), TOL_GPU_VS_CPU, "1500-token prompt, spread attention vs CPU")
    on_tiles = tiled.logits(prompt)
    within(max(relative_l2(on_tiles[t], on_cpu[t]) for t in range(len(prompt))), TOL_GPU_VS_CPU, "1500-token prompt, prompt attention vs CPU")
    run = [[(e.token, e.logprob) for e in engine.stream(prompt, 12, temperature=0.8, seed=4, stop_token_ids=[])]
           for engine in (spread, whole)]
    assert run[0] == run[1] and len(run[0]) == 12


def test_prompt_attention_rows_keep_their_bits_in_any_tile(monkeypatch):
    """tf_attention_prompt tiles up to 16 rows of one sequence; a row's bits do not depend on its
    tile: two prompts prefilled together in 64-row chunks equal each prompt alone in 7-row chunks."""
    rng = np.random.default_rng(6)
    config = model_config("3.0")
    a = [int(t) for t in rng.integers(10, config["vocab_size"], 300)]
    b = [int(t) for t in rng.integers(10, config["vocab_size"], 77)]
    big = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=64, kv_dtype="f32")
    small = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=7, kv_dtype="f32")
    together = big.logits_batch([a, b])
    for tokens, batched in zip((a, b), together):
        assert np.array_equal(small.logits(tokens).view(np.uint32), batched.view(np.uint32))


def _with_embedding(source, target, convert):
    """A copy of checkpoint `source` in `target` whose BF16 embed_tokens is `convert(values as
    f32)`, stored in the dtype of the array convert returns (F16 or F32)."""
    import shutil
    from trellisforge import safetensors_io
    shutil.copytree(source, target)
    path = target / "model.safetensors"
    header, _ = safetensors_io.read_header(path)
    tensors = safetensors_io.load(path)
    dtypes = {name: entry["dtype"] for name, entry in header.items() if name != "__metadata__" and entry["dtype"] == "BF16"}
    name = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    assert dtypes.pop(name) == "BF16"
    tensors[name] = convert(safetensors_io.bf16_to_float32(tensors[name]))
    safetensors_io.save(path, tensors, dtypes, header.get("__metadata__"))


def test_the_embedding_widens_on_the_gpu_as_on_the_host(tmp_path):
    """The GPU keeps the embedding table as the checkpoint stores it and widens a row to f32 as
    tokens come (tf_embed): the fixture's BF16 table, the same values as F32, an F16 rounding of
    them and that F16 as F32 give logits equal bit for bit in pairs, at prompt rows and
    generated rows."""
    p = {name: tokens for name, tokens in list(prompts().items())[:2]}
    source = checkpoint_dir("3.0")
    _with_embedding(source, tmp_path / "f32", lambda v: v)
    _with_embedding(source, tmp_path / "f16", lambda v: v.astype(np.float16))
    _with_embedding(source, tmp_path / "f16_as_f32", lambda v: v.astype(np.float16).astype(np.float32))
    engine = lambda d: trellisforge.Engine(d, backend="cuda", max_seqs=2, kv_dtype="f32")
    assert_same_bits(engine(source), engine(tmp_path / "f32"), p)
    assert_same_bits(engine(tmp_path / "f16"), engine(tmp_path / "f16_as_f32"), p)
