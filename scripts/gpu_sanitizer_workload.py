"""A small GPU workload touching every kernel of glm_forward.cu and exl3_experts.cu (batched
prefill on the prompt kernels and the prompt attention, then continuous-batching decode on the
GEMV and the split attention replayed from CUDA graphs, then a prompt on tf_attention, whole and
spread), for compute-sanitizer on the device:

    compute-sanitizer --tool memcheck python3 scripts/gpu_sanitizer_workload.py"""
import sys; sys.path.insert(0, "tests")
import trellisforge as t
from glm_fixtures import checkpoint_dir, prompts
p = prompts()
e = t.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=4)
e.logits_batch([p["short"], p["chat"]])
# Three streams, then two (the plain layers' 2-4 rows in one block), then one.
for name, tokens in (("short", 6), ("chat", 4), ("long", 2)):
    e.add(p[name], t.Sampling(max_tokens=tokens, temperature=0.8, seed=3), stop_token_ids=[])
while e.stats()["sequences_live"] or e.stats()["sequences_waiting"]: e.step()
import os
os.environ["TF_CUDA_PROMPT_ATTENTION"] = "0"
spread = t.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32)
os.environ["TF_CUDA_ATTENTION_SPREAD"] = "0"
whole = t.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32)
for engine in (spread, whole): engine.logits(p["long"])
print("workload done", e.stats()["graph_replays"])
