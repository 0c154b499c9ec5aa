"""A small GPU workload touching every kernel of glm_forward.cu and exl3_experts.cu (batched
prefill on the prompt kernels, then continuous-batching decode on the GEMV replayed from CUDA
graphs), for compute-sanitizer on the device:

    compute-sanitizer --tool memcheck python3 scripts/gpu_sanitizer_workload.py"""
import sys; sys.path.insert(0, "tests")
import trellisforge as t
from glm_fixtures import checkpoint_dir, prompts
p = prompts()
e = t.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=4)
e.logits_batch([p["short"], p["chat"]])
s = t.Sampling(max_tokens=4, temperature=0.8, seed=3)
for name in ("short", "chat"): e.add(p[name], s, stop_token_ids=[])
while e.stats()["sequences_live"] or e.stats()["sequences_waiting"]: e.step()
print("workload done", e.stats()["graph_replays"])
