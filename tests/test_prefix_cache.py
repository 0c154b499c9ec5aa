"""Prefix caching (zig/src/engine/prefix_cache.zig) on the CPU: a prompt that starts with an earlier
prompt's full KV pages maps them instead of computing them, and nothing it produces changes: the
same tokens and log-probabilities, bit for bit, as an engine without the cache, for GQA (the 3.0 bpw
fixture), MLA and MLA + DSA (random checkpoints), greedy and sampled, through eviction, cancels and
in-process tensor parallelism; pages all come back. A model with recurrent state (GLM-5.3-Flash's
KDA layers) restores the state kept after a cached page (zig/src/engine/state_snapshots.zig), in
one process and across tensor-parallel processes."""
from __future__ import annotations

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir
from mla_models import write_variant

import trellisforge
from trellisforge import Sampling

PAGE = 8
SYSTEM = [int(t) for t in np.random.default_rng(5).integers(3, 280, 3 * PAGE + 5)]  # 3 full pages + 5


def requests() -> list[list[int]]:
    """Chat-like turns: a shared system prompt, then each its own question; the last repeats the
    first exactly (its whole prompt but the last token is cached)."""
    rng = np.random.default_rng(11)
    turns = [SYSTEM + [int(t) for t in rng.integers(3, 280, n)] for n in (4, 13, 9)]
    return turns + [list(turns[0])]


def run(engine, prompts, sampling: Sampling, together: bool = False):
    """Each prompt's tokens, log-probabilities and cached-token count: one after another, or all
    queued at once (continuous batching)."""
    out = {}

    def drain(ids):
        while any(i not in out or out[i][3] is None for i in ids):
            for event in engine.step():
                tokens, logprobs, cached, _ = out.get(event.sequence_id, ([], [], 0, None))
                out[event.sequence_id] = (tokens + [event.token], logprobs + [event.logprob], event.cached_tokens, event.finish_reason)

    ids = []
    for prompt in prompts:
        ids.append(engine.add(prompt, sampling, stop_token_ids=[]))
        if not together:
            drain(ids[-1:])
    drain(ids)
    return [(out[i][0], np.array(out[i][1], dtype=np.float32).view(np.uint32).tolist(), out[i][2]) for i in ids]


def all_pages_back(engine) -> bool:
    s = engine.stats()
    return s["pages_free"] == s["pages_total"] and s["pages_reserved"] == 0 and s["sequences_live"] == 0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    return {
        "gqa": checkpoint_dir("3.0"),
        "mla": write_variant(root / "mla", "glm4_moe_lite", "plain"),
        "dsa": write_variant(root / "dsa", "glm_moe_dsa", "plain"),
    }


@pytest.mark.parametrize("kind", ["gqa", "mla", "dsa"])
@pytest.mark.parametrize("sampling", [Sampling(max_tokens=6), Sampling(max_tokens=6, temperature=0.8, top_p=0.9, seed=3)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "fp8"])
def test_cached_prefixes_change_no_bit(models, kind, sampling, kv_dtype):
    prompts = requests()
    plain = trellisforge.Engine(models[kind], max_seqs=4, page_tokens=PAGE, kv_dtype=kv_dtype)
    cached = trellisforge.Engine(models[kind], max_seqs=4, page_tokens=PAGE, prefix_cache=True, kv_dtype=kv_dtype)
    assert cached.stats()["prefix_cache"] == 1 and plain.stats()["prefix_cache"] == 0
    want = run(plain, prompts, sampling)
    got = run(cached, prompts, sampling)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    # The first prompt computes everything; the others find the system prompt's 3 full pages; the
    # repeat finds all of its own full pages but keeps its last token to compute.
    full = lambda p: (len(p) - 1) // PAGE * PAGE  # noqa: E731
    assert [g[2] for g in got] == [0, 3 * PAGE, 3 * PAGE, full(prompts[3])]
    stats = cached.stats()
    assert stats["prefix_hit_tokens"] == sum(g[2] for g in got)
    assert stats["prefix_miss_tokens"] == sum(len(p) for p in prompts) - stats["prefix_hit_tokens"]
    assert stats["pages_cached"] > 0
    assert all_pages_back(cached) and all_pages_back(plain)
    plain.close()
    cached.close()


def test_sequences_sharing_a_prefix_in_one_batch_and_a_cancel_mid_prompt(models):
    """The first turn fills the cache; then three sequences that share it run together, one is
    cancelled while its prompt is still being computed; the others equal an uncached engine's."""
    prompts = requests()
    sampling = Sampling(max_tokens=5)
    plain = trellisforge.Engine(models["gqa"], max_seqs=4, page_tokens=PAGE, rows_max=6, kv_dtype="f32")
    cached = trellisforge.Engine(models["gqa"], max_seqs=4, page_tokens=PAGE, rows_max=6, prefix_cache=True, kv_dtype="f32")
    want = run(plain, prompts[:1], sampling) + run(plain, prompts[1:3], sampling, together=True)
    first = run(cached, prompts[:1], sampling)
    ids = [cached.add(p, sampling, stop_token_ids=[]) for p in prompts[1:4]]
    cached.step()  # 6 rows: the first chunk of the first of them
    cached.cancel(ids[2])
    out = {i: [] for i in ids[:2]}
    while cached.stats()["sequences_live"]:
        for event in cached.step():
            assert event.sequence_id != ids[2]
            out[event.sequence_id].append((event.token, np.float32(event.logprob).view(np.uint32)))
    assert (first[0][0], first[0][1]) == (want[0][0], want[0][1])
    for i, w in zip(ids[:2], want[1:3]):
        assert [t for t, _ in out[i]] == w[0] and [int(lp) for _, lp in out[i]] == w[1]
    assert all_pages_back(cached)


def test_eviction_under_a_small_pool_keeps_the_answers(models):
    """A pool of 12 pages: later prompts take the cached pages back (least recently released
    first); every answer equals the uncached engine's, and a prompt whose prefix was evicted
    computes it again."""
    rng = np.random.default_rng(2)
    prompts = [[int(t) for t in rng.integers(3, 280, 4 * PAGE + 3)] for _ in range(3)] + [requests()[0]]
    prompts.append(list(prompts[0]))
    sampling = Sampling(max_tokens=4)
    plain = trellisforge.Engine(models["mla"], max_seqs=2, page_tokens=PAGE, kv_pages=12, ctx=6 * PAGE, kv_dtype="f32")
    cached = trellisforge.Engine(models["mla"], max_seqs=2, page_tokens=PAGE, kv_pages=12, ctx=6 * PAGE, prefix_cache=True, kv_dtype="f32")
    want = run(plain, prompts, sampling)
    got = run(cached, prompts, sampling)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    # 12 pages hold two prompts' 4 full pages and a running one's 5: the repeat of the first prompt
    # comes after three others evicted it.
    assert got[4][2] == 0
    assert all_pages_back(cached)
    assert cached.stats()["pages_cached"] <= 12


def test_in_process_tensor_parallel_with_the_cache_equals_it_without(models):
    prompts = requests()
    sampling = Sampling(max_tokens=4)
    plain = trellisforge.Engine(models["gqa"], max_seqs=4, page_tokens=PAGE, tp_world=2, kv_dtype="f32")
    cached = trellisforge.Engine(models["gqa"], max_seqs=4, page_tokens=PAGE, tp_world=2, prefix_cache=True, kv_dtype="f32")
    want = run(plain, prompts, sampling)
    got = run(cached, prompts, sampling)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert got[1][2] == 3 * PAGE


@pytest.fixture(scope="module")
def recurrent(tmp_path_factory):
    """GLM-5.3-Flash's classes on a small random checkpoint: KDA layers with their state."""
    from glm5_next_models import write_variant as write_next
    return write_next(tmp_path_factory.mktemp("next") / "next", "base")


@pytest.mark.parametrize("sampling", [Sampling(max_tokens=6), Sampling(max_tokens=6, temperature=0.8, top_p=0.9, seed=3)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_a_recurrent_model_restores_its_state_and_changes_no_bit(recurrent, sampling, kv_dtype):
    """Chunks of 6 rows end on every page boundary they cross, and the state after each such page
    is kept (4 snapshots, one per sequence slot, least recently used taken first): the shared
    system prompt's 3 full pages come with the state after them. The repeat of the first prompt
    finds its 4 full pages, but the state after the fourth was taken for the second prompt's, so
    it resumes after the third. Every token and log-probability equals the uncached engine's; the
    snapshots double the state's memory, as stats() says."""
    prompts = requests()
    plain = trellisforge.Engine(recurrent, max_seqs=4, page_tokens=PAGE, rows_max=6, kv_dtype=kv_dtype)
    cached = trellisforge.Engine(recurrent, max_seqs=4, page_tokens=PAGE, rows_max=6, prefix_cache=True, kv_dtype=kv_dtype)
    stats = cached.stats()
    assert stats["prefix_cache"] == 1 and stats["state_bytes_per_sequence"] > 0
    assert stats["state_bytes_total"] == 2 * plain.stats()["state_bytes_total"]
    want = run(plain, prompts, sampling)
    got = run(cached, prompts, sampling)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[2] for g in got] == [0, 3 * PAGE, 3 * PAGE, 3 * PAGE]
    assert cached.stats()["prefix_hit_tokens"] == sum(g[2] for g in got)
    assert all_pages_back(cached)


def test_a_recurrent_chat_turn_resumes_from_the_last_turns_prompt(recurrent):
    """One chunk per prompt (the default rows): the chunk is cut at the prompt's last page boundary,
    where the state is kept, so the next turn (the first turn, its answer, a new question) starts
    there. A cancel mid-prompt and a slot that held another sequence change nothing."""
    rng = np.random.default_rng(4)
    first = [int(t) for t in rng.integers(3, 280, 4 * PAGE + 3)]
    sampling = Sampling(max_tokens=5)
    plain = trellisforge.Engine(recurrent, max_seqs=2, page_tokens=PAGE, kv_dtype="f32")
    cached = trellisforge.Engine(recurrent, max_seqs=2, page_tokens=PAGE, prefix_cache=True, kv_dtype="f32")
    answer = run(cached, [first], sampling)[0]
    assert answer[:2] == run(plain, [first], sampling)[0][:2] and answer[2] == 0
    stray = cached.add([int(t) for t in rng.integers(3, 280, 3 * PAGE)], sampling, stop_token_ids=[])
    cached.cancel(stray)
    turn = first + answer[0] + [int(t) for t in rng.integers(3, 280, 7)]
    want, got = run(plain, [turn], sampling)[0], run(cached, [turn], sampling)[0]
    assert got[:2] == want[:2]
    assert got[2] == 4 * PAGE  # the first turn's full pages; its answer was not a prompt's
    assert all_pages_back(cached)


def test_recurrent_snapshots_are_reused_least_recently_used_first(recurrent):
    """One sequence slot, so one snapshot: a second prompt's state takes it, and the first prompt,
    asked again, finds its pages still cached but no state after them, so computes it all; the
    answers equal the uncached engine's."""
    rng = np.random.default_rng(9)
    a, b = ([int(t) for t in rng.integers(3, 280, 3 * PAGE + 2)] for _ in range(2))
    sampling = Sampling(max_tokens=3)
    plain = trellisforge.Engine(recurrent, max_seqs=1, page_tokens=PAGE, kv_dtype="f32")
    cached = trellisforge.Engine(recurrent, max_seqs=1, page_tokens=PAGE, prefix_cache=True, kv_dtype="f32")
    prompts = [a, list(a), b, list(a)]
    want, got = run(plain, prompts, sampling), run(cached, prompts, sampling)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[2] for g in got] == [0, 3 * PAGE, 0, 0]
    assert cached.stats()["pages_cached"] > 0 and all_pages_back(cached)


def test_a_worker_process_makes_rank_0s_state_copies(tmp_path):
    """Two processes over TCP: rank 0's snapshots and restores travel in the next step plan and
    the worker makes them before its forward; the bits are those of the uncached threads."""
    from server_process import free_port
    from test_cuda_glm5_next import gpu_variant
    from test_tensor_parallel import start_worker
    directory = gpu_variant(tmp_path / "next", "base", moe_intermediate_size=256)
    prompts = requests()
    sampling = Sampling(max_tokens=4, temperature=0.8, top_p=0.9, seed=5)
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master)
    try:
        with trellisforge.Engine(directory, max_seqs=4, page_tokens=PAGE, rows_max=6, tp_world=2, kv_dtype="f32") as threads, \
             trellisforge.Engine(directory, max_seqs=4, page_tokens=PAGE, rows_max=6, tp_world=2, tp_master=master,
                                 prefix_cache=True, kv_dtype="f32") as over_tcp:
            want, got = run(threads, prompts, sampling), run(over_tcp, prompts, sampling)
            assert [g[:2] for g in got] == [w[:2] for w in want]
            assert [g[2] for g in got] == [0, 3 * PAGE, 3 * PAGE, 3 * PAGE]
            assert all_pages_back(over_tcp)
        assert worker.wait(timeout=60) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()


def test_in_process_tensor_parallel_restores_every_ranks_state(tmp_path):
    """Each rank's KDA heads keep their own part of the state: every rank copies its snapshot."""
    from test_cuda_glm5_next import gpu_variant
    directory = gpu_variant(tmp_path / "next", "base", moe_intermediate_size=256)  # KDA width 256: 128 a rank
    prompts = requests()
    sampling = Sampling(max_tokens=4)
    plain = trellisforge.Engine(directory, max_seqs=4, page_tokens=PAGE, rows_max=6, tp_world=2, kv_dtype="f32")
    cached = trellisforge.Engine(directory, max_seqs=4, page_tokens=PAGE, rows_max=6, tp_world=2, prefix_cache=True, kv_dtype="f32")
    want, got = run(plain, prompts, sampling), run(cached, prompts, sampling)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert got[1][2] == 3 * PAGE


def test_a_prefix_cache_flag_other_than_0_or_1_is_refused(models):
    from trellisforge import TrellisError
    from trellisforge._ffi import check, ffi, lib
    from trellisforge.engine import _params
    params = _params("cpu", 2, 0, PAGE, 0, 256, 1)
    params.prefix_cache = 2
    handle = ffi.new("tf_engine **")
    with pytest.raises(TrellisError, match="prefix_cache must be 0 or 1"):
        check(lib.tf_engine_create(str(models["gqa"]).encode(), params, handle))
