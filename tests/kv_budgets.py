"""The stated error budgets of the KV cache's dtypes against the exact answer (tests/test_kv_dtype.py
says how they were measured); the GPU tests hold the GPU's caches to the same."""
# f16: relative L2 of a position's logits; one position per prompt may pass it (a discrete choice,
# a router's top-k, flipping on a near-tie).
F16_TOL = 1e-3
# fp8: the median position's relative L2 (measured 2-6%; the worst positions reach 20%).
FP8_MEDIAN_TOL = 0.08
