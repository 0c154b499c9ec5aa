"""The engine: a model directory served by libtrellisforge's continuous-batching engine.

`Engine` is the contract later work relies on: `logits`, `generate`, `stream`, `stats`, plus the
lower-level `add` / `step` / `cancel` that the server's loop thread drives. Calls on one engine are
serialized by a lock (the library's engine is single-threaded; cffi releases the GIL)."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from ._ffi import TrellisError, check, ffi, lib

FINISH_REASONS = {0: None, 1: "stop", 2: "length", 3: "cancelled"}
BACKENDS = {"cpu": 0, "cuda": 1}
KV_DTYPES = {"f32": 1, "f16": 2, "fp8": 3}
KV_DTYPE_NAMES = {v: k for k, v in KV_DTYPES.items()}
PAGE_TOKENS = 16  # positions a KV page holds, unless an engine is asked for other pages
TIMELINE_PARTS = ("embed", "attention", "norm", "ffn", "head", "other")


@dataclasses.dataclass(frozen=True)
class Sampling:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_logprobs: int = 0
    seed: int | None = None
    # Each sampled token waits for Engine.set_token_mask (grammar-constrained sampling).
    constrained: bool = False
    # OpenAI's logit_bias: (token id, value in [-100, 100]) pairs added to the logits before the
    # penalties; such a sequence is sampled on the host (tf_engine_set_logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()

    def to_c(self):
        params = ffi.new("tf_sampling_params *")
        params.temperature = self.temperature
        params.top_p = self.top_p
        params.top_k = self.top_k
        params.min_p = self.min_p
        params.presence_penalty = self.presence_penalty
        params.frequency_penalty = self.frequency_penalty
        params.repetition_penalty = self.repetition_penalty
        params.top_logprobs = self.top_logprobs
        params.seed = (self.seed or 0) & 0xFFFFFFFFFFFFFFFF
        params.has_seed = 0 if self.seed is None else 1
        params.max_tokens = self.max_tokens
        params.constrained = 1 if self.constrained else 0
        return params


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """One sampled token of one sequence."""
    sequence_id: int
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    finish_reason: str | None  # None while the sequence goes on
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class Engine:
    def __init__(self, model_dir: str | os.PathLike, backend: str = "cpu", max_seqs: int = 16,
                 kv_pages: int = 0, page_tokens: int = PAGE_TOKENS, ctx: int = 0, rows_max: int = 256, tp_world: int = 1,
                 tp_master: str | None = None, prefix_cache: bool = False, kv_dtype: str = "f16"):
        """tp_world > 1 without tp_master: the ranks are threads of this process (cpu). With
        tp_master "host:port": this engine is rank 0 of tp_world processes and waits there for the
        workers (`run_tp_worker`). prefix_cache: a prompt maps the KV pages of an earlier prompt's
        identical full pages instead of computing them (for models with recurrent state, with the
        state kept after some of them; stats()["prefix_cache"] says whether it runs). kv_dtype:
        what the KV cache stores, "f16" (the default), "f32" (the exact reference's numbers) or
        "fp8" (e4m3, GPUs of sm_89 and later; the cpu emulates it). kv_pages: the pool of
        page_tokens-position pages every sequence shares (0: max_seqs contexts of ctx, or with ctx 0
        of the model's capped at 8192); ctx 0: the model's context capped at the pool. A sequence
        that outgrows a spent pool preempts the youngest, which later goes on with the same tokens
        (stats()["preemptions"])."""
        params = _params(backend, max_seqs, kv_pages, page_tokens, ctx, rows_max, tp_world, prefix_cache, kv_dtype)
        self.model_dir = pathlib.Path(model_dir)
        handle = ffi.new("tf_engine **")
        if tp_master:
            host, port = split_address(tp_master)
            check(lib.tf_engine_create_tp_master(os.fsencode(os.fspath(model_dir)), params, host.encode(), port, handle))
        else:
            check(lib.tf_engine_create(os.fsencode(os.fspath(model_dir)), params, handle))
        self._adopt(handle[0], max_seqs, _eos_token_ids(self.model_dir))

    @classmethod
    def synthetic(cls, config: dict | str, bits: int = 3, seed: int = 0, backend: str = "cpu", max_seqs: int = 16,
                  kv_pages: int = 0, page_tokens: int = PAGE_TOKENS, ctx: int = 0, rows_max: int = 256, prefix_cache: bool = False,
                  kv_dtype: str = "f16") -> "Engine":
        """An engine over random EXL3 weights made in memory: `config` is a config.json dict or a
        shape name of `synthesize` ("glm-4.5-air", "tiny-4l", ...). For full-size benchmarks with no
        checkpoint on disk; the same seed gives the same weights, so the same logits."""
        if isinstance(config, str):
            from .synthesize import shape_config
            config = shape_config(config)
        params = _params(backend, max_seqs, kv_pages, page_tokens, ctx, rows_max, 1, prefix_cache, kv_dtype)
        text = json.dumps(config).encode()
        handle = ffi.new("tf_engine **")
        check(lib.tf_engine_create_synthetic(text, len(text), params, bits, seed & 0xFFFFFFFFFFFFFFFF, handle))
        engine = cls.__new__(cls)
        engine.model_dir = None
        engine._adopt(handle[0], max_seqs, _id_list(config.get("eos_token_id")))
        return engine

    def _adopt(self, handle, max_seqs: int, eos_token_ids: list[int]) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self._records = ffi.new("tf_step_record[]", max(max_seqs, 64))
        self.eos_token_ids = eos_token_ids
        stats = self.stats()
        self.vocab_size = stats["vocab_size"]
        self.context_tokens_max = stats["context_tokens_max"]

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                check(lib.tf_engine_destroy(self._handle))
                self._handle = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            lib.tf_engine_destroy(self._handle)
            self._handle = None

    def _live(self):
        if self._handle is None:
            raise ValueError("engine is closed")
        return self._handle

    # ---- low level: what the server's loop thread drives ----

    def add(self, token_ids: Sequence[int], sampling: Sampling, stop_token_ids: Sequence[int] | None = None) -> int:
        tokens = np.ascontiguousarray(token_ids, dtype=np.uint32)
        stops = np.ascontiguousarray(self.eos_token_ids if stop_token_ids is None else list(stop_token_ids), dtype=np.uint32)
        sequence_id = ffi.new("uint64_t *")
        if sampling.logit_bias:
            bias_tokens = np.array([t for t, _ in sampling.logit_bias], dtype=np.int64)
            if bias_tokens.min() < 0 or bias_tokens.max() >= 2 ** 32:
                raise ValueError("logit bias token ids must be in [0, 2**32)")
            bias_tokens = bias_tokens.astype(np.uint32)
            bias_values = np.array([v for _, v in sampling.logit_bias], dtype=np.float32)
        with self._lock:
            check(lib.tf_engine_add_sequence(
                self._live(), ffi.cast("uint32_t *", tokens.ctypes.data), tokens.size, sampling.to_c(),
                ffi.cast("uint32_t *", stops.ctypes.data), stops.size, sequence_id))
            if sampling.logit_bias:
                # In the same lock as the add: no step samples the sequence before its bias is set.
                status = lib.tf_engine_set_logit_bias(self._live(), sequence_id[0], ffi.cast("uint32_t *", bias_tokens.ctypes.data),
                                                      ffi.cast("float *", bias_values.ctypes.data), bias_tokens.size)
                if status != 0:
                    error = TrellisError(status, ffi.string(lib.tf_last_error()).decode("utf-8", "replace"))
                    check(lib.tf_engine_cancel(self._live(), sequence_id[0]))
                    raise error
        return int(sequence_id[0])

    def step(self) -> list[TokenEvent]:
        count = ffi.new("size_t *")
        with self._lock:
            check(lib.tf_engine_step(self._live(), self._records, len(self._records), count))
            records = [self._records[i] for i in range(count[0])]
            return [
                TokenEvent(
                    sequence_id=int(r.sequence_id), token=int(r.token), logprob=float(r.logprob),
                    top=tuple((int(r.top_tokens[j]), float(r.top_logprobs[j])) for j in range(r.top_count)),
                    finish_reason=FINISH_REASONS.get(r.finish, "stop"),
                    cached_tokens=int(r.cached_tokens),
                )
                for r in records
            ]

    def set_token_mask(self, sequence_id: int, mask: np.ndarray | None) -> None:
        """The tokens a constrained sequence's next sampled token may be: a bitmask of
        ceil(vocab / 32) 32-bit words (bit t % 32 of word t // 32 allows token t), or None for any
        token. The sampled token spends it; see tf_engine_set_token_mask."""
        if mask is None:
            with self._lock:
                check(lib.tf_engine_set_token_mask(self._live(), sequence_id, ffi.NULL, 0))
            return
        words = np.ascontiguousarray(mask).view(np.uint32)
        with self._lock:
            check(lib.tf_engine_set_token_mask(self._live(), sequence_id, ffi.cast("uint32_t *", words.ctypes.data), words.size))

    def cancel(self, sequence_id: int) -> None:
        with self._lock:
            check(lib.tf_engine_cancel(self._live(), sequence_id))

    def stats(self) -> dict:
        out = ffi.new("tf_engine_stats *")
        with self._lock:
            check(lib.tf_engine_stats_get(self._live(), out))
        return {name: getattr(out, name) for name in (
            "pages_total", "pages_free", "pages_reserved", "sequences_live", "sequences_waiting",
            "sequences_max", "context_tokens_max", "vocab_size", "graph_replays",
            "prompt_rows", "prompt_layers", "gpu_sampled", "kv_pairs", "state_bytes_per_sequence",
            "state_bytes_total", "prefix_cache", "pages_cached", "prefix_hit_tokens", "prefix_miss_tokens",
            "kv_bytes_per_token", "preemptions", "shared_side_layers")} | {"kv_dtype": KV_DTYPE_NAMES[out.kv_dtype], "programmatic_launch": bool(out.programmatic_launch)}

    def time_next_step(self) -> None:
        """Times the next `step`'s forward launch by launch (the cuda backend: one GPU, or rank 0 of a GPU group); read it
        with `timeline` after that step."""
        with self._lock:
            check(lib.tf_engine_time_next_step(self._live()))

    def timeline(self) -> list[dict]:
        """The last timed step's launches in order: kernel name, layer (-1 outside the layers),
        part, microseconds up to the next launch's start, and the weight or cache bytes it reads
        where stated (0 where not)."""
        count = ffi.new("size_t *")
        with self._lock:
            check(lib.tf_engine_timeline(self._live(), ffi.NULL, 0, count))
            entries = ffi.new("tf_timeline_entry[]", max(count[0], 1))
            check(lib.tf_engine_timeline(self._live(), entries, count[0], count))
        return [
            {"name": ffi.string(e.name).decode(), "layer": int(e.layer), "part": TIMELINE_PARTS[e.part],
             "micros": float(e.micros), "reads": int(e.reads)}
            for e in entries[0:count[0]]
        ]

    # ---- high level ----

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """float32 (len(token_ids), vocab): logits at every position of one fresh sequence."""
        return self.logits_batch([token_ids])[0]

    def logits_batch(self, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Logits of several fresh sequences run together in the same batches."""
        lengths = np.array([len(p) for p in prompts], dtype=np.uintp)
        tokens = np.ascontiguousarray(np.concatenate([np.asarray(p, dtype=np.uint32) for p in prompts]))
        out = np.empty((int(lengths.sum()), self.vocab_size), dtype=np.float32)
        with self._lock:
            check(lib.tf_engine_prompt_logits(
                self._live(), ffi.cast("uint32_t *", tokens.ctypes.data), ffi.cast("size_t *", lengths.ctypes.data),
                len(prompts), ffi.cast("float *", out.ctypes.data), out.size))
        return np.split(out, np.cumsum(lengths)[:-1].astype(np.int64))

    def stream(self, token_ids: Sequence[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, min_p: float = 0.0, seed: int | None = None,
               stop_token_ids: Sequence[int] | None = None, **sampling) -> Iterator[TokenEvent]:
        """Tokens of one sequence as they are sampled; stepping runs other live sequences too.
        Closing the iterator early cancels the sequence."""
        params = Sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          min_p=min_p, seed=seed, **sampling)
        sequence_id = self.add(token_ids, params, stop_token_ids)
        finished = False
        try:
            while not finished:
                for event in self.step():
                    if event.sequence_id == sequence_id:
                        finished = event.finish_reason is not None
                        yield event
        finally:
            if not finished:
                try:
                    self.cancel(sequence_id)
                except Exception:  # already finished between the last step and the close
                    pass

    def generate(self, token_ids: Sequence[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, seed: int | None = None,
                 stop_token_ids: Sequence[int] | None = None, **sampling) -> list[int]:
        return [e.token for e in self.stream(token_ids, max_tokens, temperature, top_p, top_k, min_p, seed,
                                             stop_token_ids, **sampling)]


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"tensor-parallel master must be HOST:PORT, not {address!r}")
    return host, int(port)


def run_tp_worker(model_dir: str | os.PathLike, rank: int, master: str) -> None:
    """Rank `rank` (>= 1) of a tensor-parallel group: serves the master's forwards until it shuts
    down; raises TrellisError when the link fails."""
    host, port = split_address(master)
    check(lib.tf_tp_worker_run(os.fsencode(os.fspath(model_dir)), rank, host.encode(), port))


def _params(backend: str, max_seqs: int, kv_pages: int, page_tokens: int, ctx: int, rows_max: int, tp_world: int,
            prefix_cache: bool = False, kv_dtype: str = "f16"):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, not {backend!r}")
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {list(KV_DTYPES)}, not {kv_dtype!r}")
    params = ffi.new("tf_engine_params *")
    params.backend = BACKENDS[backend]
    params.sequences_max = max_seqs
    params.kv_pages = kv_pages
    params.page_tokens = page_tokens
    params.context_tokens_max = ctx
    params.rows_max = rows_max
    params.tp_world = tp_world
    params.prefix_cache = int(prefix_cache)
    params.kv_dtype = KV_DTYPES[kv_dtype]
    return params


def _eos_token_ids(model_dir: pathlib.Path) -> list[int]:
    """EOS ids from generation_config.json, else config.json or its text_config (GLM-5.3-Flash
    nests the text model's fields there) (GLM.md §2.5: a list; stop on any)."""
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.is_file():
            fields = json.loads(path.read_text())
            value = fields.get("eos_token_id")
            if value is None and isinstance(fields.get("text_config"), dict):
                value = fields["text_config"].get("eos_token_id")
            if value is not None:
                return _id_list(value)
    return []


def _id_list(value) -> list[int]:
    """A config's token id field: absent, one id, or a list of ids."""
    return [] if value is None else [int(v) for v in (value if isinstance(value, list) else [value])]
