"""Prefix caching on the GPU: the prompts of tests/test_prefix_cache.py through the CUDA engine with
and without the cache, tokens and log-probabilities bit for bit (the GPU reads mapped pages through
the same tables, and its chunk invariance is what makes them equal), for GQA (every cache dtype), MLA
and MLA + DSA (the ../shared fixtures: the GPU's MLA kernels take the real models' latent shape; f32
and f16 latents)."""
from __future__ import annotations

import pytest
from conftest import SHARED
from glm_fixtures import checkpoint_dir
from test_prefix_cache import PAGE, all_pages_back, requests, run

import trellisforge
from trellisforge import Sampling

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")


def model_dir(kind: str):
    if kind == "gqa":
        return checkpoint_dir("3.0")
    root = SHARED.parent / ("glm4_moe_lite" if kind == "mla" else "glm_moe_dsa")
    if not root.is_dir():
        pytest.skip(f"{root} is absent: the MLA fixtures are read from ../shared")
    return root / "exl3_3.0bpw"


@pytest.mark.parametrize(("kind", "kv_dtype"), [("gqa", "f32"), ("gqa", "f16"), ("gqa", "fp8"), ("mla", "f32"), ("mla", "f16"),
                                                ("dsa", "f16")])
def test_cached_prefixes_change_no_bit_on_the_gpu(kind, kv_dtype):
    prompts = requests()
    sampling = Sampling(max_tokens=6, temperature=0.8, top_p=0.9, seed=3)
    directory = model_dir(kind)
    with trellisforge.Engine(directory, backend="cuda", max_seqs=4, page_tokens=PAGE, kv_dtype=kv_dtype) as plain, \
         trellisforge.Engine(directory, backend="cuda", max_seqs=4, page_tokens=PAGE, prefix_cache=True, kv_dtype=kv_dtype) as cached:
        want = run(plain, prompts, sampling)
        got = run(cached, prompts, sampling)
        assert [g[:2] for g in got] == [w[:2] for w in want]
        assert [g[2] for g in got][1:3] == [3 * PAGE, 3 * PAGE]
        assert all_pages_back(cached)


@pytest.mark.parametrize("rows_max", [6, 256])
def test_a_recurrent_model_restores_its_state_on_the_gpu(tmp_path, rows_max):
    """GLM-5.3-Flash's classes at the CUDA kernels' shapes: the KDA state kept after cached pages
    (device copies between state slots) gives the tokens and log-probabilities of the uncached
    engine, bit for bit, with chunks of 6 rows (a snapshot at every page crossed) and of 256 (a
    snapshot where each prompt's last full page ends)."""
    from test_cuda_glm5_next import gpu_variant
    directory = gpu_variant(tmp_path / "next", "base", moe_intermediate_size=256)
    prompts = requests()
    sampling = Sampling(max_tokens=6, temperature=0.8, top_p=0.9, seed=3)
    with trellisforge.Engine(directory, backend="cuda", max_seqs=4, page_tokens=PAGE, rows_max=rows_max, kv_dtype="f16") as plain, \
         trellisforge.Engine(directory, backend="cuda", max_seqs=4, page_tokens=PAGE, rows_max=rows_max, prefix_cache=True,
                             kv_dtype="f16") as cached:
        want = run(plain, prompts, sampling)
        got = run(cached, prompts, sampling)
        assert [g[:2] for g in got] == [w[:2] for w in want]
        hits = [g[2] for g in got]
        assert hits == ([0, 3 * PAGE, 3 * PAGE, 3 * PAGE] if rows_max == 6 else [0, 0, 0, 4 * PAGE]), hits
        assert all_pages_back(cached)
