"""Prefix caching on the GPU: the prompts of tests/test_prefix_cache.py through the CUDA engine with
and without the cache, tokens and log-probabilities bit for bit (the GPU reads mapped pages through
the same tables, and its chunk invariance is what makes them equal), GQA, MLA and MLA + DSA."""
from __future__ import annotations

import pytest
from test_prefix_cache import PAGE, all_pages_back, models, requests, run  # noqa: F401 (fixture)

import trellisforge
from trellisforge import Sampling

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")


@pytest.mark.parametrize("kind", ["gqa", "mla", "dsa"])
def test_cached_prefixes_change_no_bit_on_the_gpu(models, kind):  # noqa: F811
    prompts = requests()
    sampling = Sampling(max_tokens=6, temperature=0.8, top_p=0.9, seed=3)
    with trellisforge.Engine(models[kind], backend="cuda", max_seqs=4, page_tokens=PAGE) as plain, \
         trellisforge.Engine(models[kind], backend="cuda", max_seqs=4, page_tokens=PAGE, prefix_cache=True) as cached:
        want = run(plain, prompts, sampling)
        got = run(cached, prompts, sampling)
        assert [g[:2] for g in got] == [w[:2] for w in want]
        assert [g[2] for g in got][1:3] == [3 * PAGE, 3 * PAGE]
        assert all_pages_back(cached)
