"""The plain EXL3 linears' prompt rows in each form of the prompt kernels (exl3_prompt.LinearForm:
wide, down's kernel, two tile columns a warp; narrow, one; for a weight split over k, the deep
launch in either form) give the same bits: every output is the same chain in the same order, so
the engine may pick the form by the chunk's rows. Checked on whole prompts (chunks of 256 and of
320 rows: whole and partial groups of 64) for class A's fixture, the latent-attention classes and
GLM-5.3-Flash at the GPU kernels' shapes, and the logits stay within the f32 tolerance of the CPU.
Likewise the MLPs' forms (exl3_prompt.MlpForm: groups of up to 64 items or, slim, 32)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, prompts
from mla_models import write_gpu_shaped
from test_cuda_glm5_next import gpu_variant

import trellisforge

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
FORMS = ("wide", "narrow")


def model_dir(tmp_path, kind: str):
    if kind == "glm4_moe":
        return checkpoint_dir("3.0")
    if kind == "glm5_next":
        return gpu_variant(tmp_path / kind, "base")
    return write_gpu_shaped(tmp_path / kind, kind, seed=2)


@pytest.mark.parametrize("kind", ["glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "glm5_next"])
def test_every_form_gives_the_same_bits(tmp_path, monkeypatch, kind):
    directory = model_dir(tmp_path, kind)
    rng = np.random.default_rng(3)
    tokens = prompts()["long"] if kind == "glm4_moe" else [int(t) for t in rng.integers(0, 300, 320)]
    cpu = trellisforge.Engine(directory, max_seqs=2, kv_dtype="f32").logits(tokens)
    results = {}
    for form in FORMS:
        monkeypatch.setenv("TF_CUDA_PROMPT_LINEAR", form)
        for rows_max in (256, 320):
            with trellisforge.Engine(directory, backend="cuda", max_seqs=2, rows_max=rows_max, kv_dtype="f32") as engine:
                results[form, rows_max] = engine.logits(tokens)
    reference = results["wide", 256]
    for key, logits in results.items():
        assert np.array_equal(logits.view(np.uint32), reference.view(np.uint32)), f"{kind}: {key} differs from wide at 256 rows"
    within(max(relative_l2(reference[t], cpu[t]) for t in range(len(tokens))), 1e-4, f"{kind}: GPU prompt vs CPU")


def prompt_kernels(directory, tokens, rows_max: int) -> tuple[np.ndarray, set[str]]:
    """The prompt's logits, and the names of the launches of its first chunk (a timed step)."""
    with trellisforge.Engine(directory, backend="cuda", max_seqs=2, rows_max=rows_max, kv_dtype="f32") as engine:
        logits = engine.logits(tokens)
        engine.add(tokens, trellisforge.Sampling(max_tokens=1), stop_token_ids=[])
        engine.time_next_step()
        done = any(e.finish_reason is not None for e in engine.step())
        names = {e["name"] for e in engine.timeline()}
        while not done:
            done = any(e.finish_reason is not None for e in engine.step())
    return logits, names


@pytest.mark.parametrize("kind", ["glm4_moe", "glm5_next"])
def test_every_mlp_form_gives_the_same_bits(tmp_path, monkeypatch, kind):
    """The MLPs' prompt items in groups of up to 64 (full) or 32 (slim, the `_32` kernels) give the
    same bits, at chunks whose experts hold a few items each and many; the timeline shows each
    form's kernels ran, and that the engine picks slim for the short chunk by itself."""
    directory = model_dir(tmp_path, kind)
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, 300, 300)]
    results = {}
    for form in ("full", "slim", None):
        if form is None:
            monkeypatch.delenv("TF_CUDA_PROMPT_EXPERTS", raising=False)
        else:
            monkeypatch.setenv("TF_CUDA_PROMPT_EXPERTS", form)
        for rows_max in (24, 256):
            results[form, rows_max], names = prompt_kernels(directory, tokens, rows_max)
            slim = any(n.startswith("tf_exl3_prompt_gu") and n.endswith("_32") for n in names)
            full = any(n.startswith("tf_exl3_prompt_gu") and not n.endswith("_32") for n in names)
            expected = form or ("slim" if rows_max == 24 else "full")
            assert (slim, full) == (expected == "slim", expected == "full"), f"{kind}: {form} at {rows_max} rows ran {sorted(names)}"
    reference = results["full", 256]
    for key, logits in results.items():
        assert np.array_equal(logits.view(np.uint32), reference.view(np.uint32)), f"{kind}: {key} differs from full at 256 rows"
