/* TrellisForge C ABI. Every call returns a tf_status; on anything but TF_OK, tf_last_error()
 * gives this thread's message for it. No call aborts the process on bad input. The exporting
 * side is zig/src/c_api.zig; python/trellisforge/_ffi.py reads this header for cffi, so keep it
 * free of preprocessor logic below the include guard. */
#ifndef TRELLISFORGE_H
#define TRELLISFORGE_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TF_OK = 0,
    TF_ERR_INVALID_ARGUMENT = 1, /* a null pointer, a wrong size, a value out of range */
    TF_ERR_IO = 2,               /* a file could not be opened or mapped */
    TF_ERR_FORMAT = 3,           /* a file is malformed: safetensors header, index, config.json */
    TF_ERR_NOT_FOUND = 4,        /* a tensor or layer that is not in the checkpoint */
    TF_ERR_UNSUPPORTED = 5,      /* valid input this build does not handle */
    TF_ERR_OUT_OF_MEMORY = 6,
    TF_ERR_CUDA = 7,             /* CUDA unavailable or a driver call failed */
    TF_ERR_INTERNAL = 8
} tf_status;

typedef struct tf_checkpoint tf_checkpoint;

typedef enum {
    TF_DTYPE_BOOL = 0, TF_DTYPE_U8 = 1, TF_DTYPE_I8 = 2, TF_DTYPE_I16 = 3, TF_DTYPE_U16 = 4,
    TF_DTYPE_F16 = 5, TF_DTYPE_BF16 = 6, TF_DTYPE_I32 = 7, TF_DTYPE_U32 = 8, TF_DTYPE_F32 = 9,
    TF_DTYPE_I64 = 10, TF_DTYPE_U64 = 11, TF_DTYPE_F64 = 12
} tf_dtype;

typedef struct {
    const char *name;      /* not NUL-terminated; valid while the checkpoint is open */
    size_t name_len;
    int32_t dtype;         /* tf_dtype */
    uint32_t rank;
    uint64_t shape[8];
} tf_tensor_info;

typedef struct {
    uint64_t in_features_padded;  /* k_p, a multiple of 128 */
    uint64_t out_features_padded; /* n_p, a multiple of 128 */
    uint32_t bits_x2;             /* 2 x bits per weight: 2..16, or 3/5/7 for 1.5/2.5/3.5 */
    int32_t codebook;             /* 0 = 3INST, 1 = MCG, 2 = MUL1 */
    int32_t has_bias;
    int32_t reserved;
} tf_exl3_info;

typedef struct {
    int32_t present;              /* config.json has a quantization_config */
    double bits;
    double head_bits;             /* 0 when absent */
    int32_t codebook;             /* -1 when absent, else as tf_exl3_info.codebook */
    int32_t reserved;
} tf_quantization_info;

const char *tf_version(void);
const char *tf_last_error(void);

/* CUDA: TF_OK when a GPU with our kernels is usable; otherwise TF_ERR_CUDA and the reason. */
tf_status tf_cuda_available(void);
/* The number of CUDA devices of this machine; an error with the reason when CUDA is unusable. */
tf_status tf_cuda_device_count(uint32_t *out);

/* The GPU sampler (temperature, top-k, top-p, min-p) over given logits rows, for tests against a
 * reference. A job names a row and its filters; u in [0, 1) is the uniform draw. */
typedef struct {
    uint32_t row;
    float temperature;
    float top_p;
    int32_t top_k;
    float min_p;
    uint32_t reserved;
    double u;
} tf_sample_job;

typedef struct {
    uint32_t token;
    float logprob;               /* log-softmax of the raw logits at token */
} tf_sample_choice;

tf_status tf_cuda_sample(const float *logits, size_t rows, size_t vocab, const tf_sample_job *jobs, size_t count,
                         tf_sample_choice *out);

/* A safetensors file, or a directory with model.safetensors or shards and an index. */
tf_status tf_checkpoint_open(const char *path, tf_checkpoint **out);
tf_status tf_checkpoint_close(tf_checkpoint *checkpoint);
tf_status tf_checkpoint_tensor_count(const tf_checkpoint *checkpoint, size_t *out);
tf_status tf_checkpoint_tensor_info(const tf_checkpoint *checkpoint, size_t index, tf_tensor_info *out);
tf_status tf_checkpoint_quantization(const tf_checkpoint *checkpoint, tf_quantization_info *out);

/* The EXL3 linear whose tensors are <prefix>.trellis, .suh, .svh, [.bias], [.mul1 | .mcg]. */
tf_status tf_exl3_info_get(const tf_checkpoint *checkpoint, const char *prefix, tf_exl3_info *out);
/* Wq, the trellis decode before the Hadamards: (k_p, n_p) fp16 bits, bit-exact to the format. */
tf_status tf_exl3_decode_trellis(const tf_checkpoint *checkpoint, const char *prefix,
                                 uint16_t *out, size_t out_len);
/* The same decode on the GPU (tf_exl3_decode kernel): TF_ERR_CUDA when CUDA is unavailable. */
tf_status tf_exl3_decode_trellis_cuda(const tf_checkpoint *checkpoint, const char *prefix,
                                      uint16_t *out, size_t out_len);
/* W = diag(suh) H Wq H diag(svh): (in_features, out_features) float32, y = x @ W orientation.
 * in_features <= k_p and out_features <= n_p: the padding to drop. */
tf_status tf_exl3_dequantize(const tf_checkpoint *checkpoint, const char *prefix,
                             size_t in_features, size_t out_features, float *out, size_t out_len);
/* y = x @ W + bias for rows x in_features float32 inputs; y is rows x out_features. */
tf_status tf_exl3_linear(const tf_checkpoint *checkpoint, const char *prefix,
                         const float *x, size_t rows, size_t in_features,
                         float *y, size_t out_features);

/* ---- Quantization (EXL3.md §11.5, §11.6) ---- */
/* The Viterbi encoder, bit-identical to ExLlamaV3 1.6: values (tiles, 256) float32 in trellis
 * order -> states (tiles, 256) uint16. bits 1..8; codebook 0 = 3INST, 1 = MCG, 2 = MUL1. */
tf_status tf_exl3_encode_tiles(const float *values, size_t tiles, uint32_t bits, int32_t codebook, uint16_t *states);
/* The same encoder on the GPU, bit for bit; TF_ERR_CUDA when CUDA is unavailable. */
tf_status tf_exl3_encode_tiles_cuda(const float *values, size_t tiles, uint32_t bits, int32_t codebook, uint16_t *states);
/* States -> the stored int16 words (tiles, 16 * bits). */
tf_status tf_exl3_pack_states(const uint16_t *states, size_t tiles, uint32_t bits, uint16_t *words);

/* ---- Engine: sequences, paged KV cache, continuous batching, sampling. An engine is not
 * thread-safe: callers serialize the calls on one engine. ---- */
typedef struct tf_engine tf_engine;

typedef struct {
    int32_t backend;             /* 0 = cpu, 1 = cuda */
    uint32_t sequences_max;      /* live + waiting sequences, 1..256 */
    uint32_t kv_pages;           /* 0: sequences_max contexts of context_tokens_max (that 0: of the
                                    model's, capped at 8192); shared: one sequence may take it all */
    uint32_t page_tokens;        /* positions per KV page */
    uint32_t context_tokens_max; /* 0: the model's max_position_embeddings, capped at the pool's tokens */
    uint32_t rows_max;           /* tokens per step: prompt chunks + decode rows */
    uint32_t tp_world;           /* tensor-parallel ranks inside this process (cpu); 0 or 1 = none */
    uint32_t prefix_cache;       /* 1: a prompt maps the KV pages of an earlier prompt's identical full
                                    pages instead of computing them (recurrent models: with the state
                                    kept after some of them; stats say whether it runs) */
    uint32_t kv_dtype;           /* what the KV cache stores: 0 = f16 (the default), 1 = f32 (exact),
                                    2 = f16, 3 = fp8 e4m3 with a power-of-two scale per position and head
                                    (GPUs of sm_89 and later; the cpu emulates it). The DSA indexer's
                                    keys and the KDA state stay f32. */
} tf_engine_params;

typedef struct {
    float temperature;           /* 0 = greedy */
    float top_p;                 /* (0, 1] */
    int32_t top_k;               /* 0 = off */
    float min_p;                 /* [0, 1] */
    float presence_penalty;      /* [-2, 2], over generated tokens */
    float frequency_penalty;     /* [-2, 2], over generated tokens */
    float repetition_penalty;    /* (0, 10], 1 = off, over prompt and generated tokens */
    int32_t top_logprobs;        /* alternatives per token, 0..20 */
    uint64_t seed;
    int32_t has_seed;            /* 0: a fresh random seed */
    uint32_t max_tokens;         /* >= 1 */
    int32_t constrained;         /* 1: each sampled token first needs tf_engine_set_token_mask */
    int32_t reserved;            /* 0 */
} tf_sampling_params;

typedef enum { TF_FINISH_NONE = 0, TF_FINISH_STOP = 1, TF_FINISH_LENGTH = 2, TF_FINISH_CANCELLED = 3 } tf_finish;

typedef struct {
    uint64_t sequence_id;
    uint32_t token;
    int32_t finish;              /* tf_finish; not NONE on a sequence's last record */
    float logprob;               /* log-softmax of the model's logits */
    uint32_t top_count;
    uint32_t top_tokens[20];
    float top_logprobs[20];
    uint32_t cached_tokens;      /* prompt tokens of this sequence served from the prefix cache */
    uint32_t reserved;
} tf_step_record;

typedef struct {
    uint32_t pages_total;
    uint32_t pages_free;         /* free, or cached by the prefix cache with no sequence mapping them */
    uint32_t pages_reserved;
    uint32_t sequences_live;
    uint32_t sequences_waiting;
    uint32_t sequences_max;
    uint32_t context_tokens_max;
    uint32_t vocab_size;
    uint64_t graph_replays;      /* GPU forwards run by replaying a recorded CUDA graph */
    uint64_t prompt_rows;        /* prompt rows the GPU ran through its tensor-core prompt kernels */
    uint64_t prompt_layers;      /* MoE layers whose experts those kernels take (the rest: GEMV) */
    uint64_t gpu_sampled;        /* tokens sampled on the GPU (temperature, top-k/p, min-p rows) */
    uint64_t kv_pairs;           /* attention layers whose k and v projections run as one GPU launch */
    uint64_t state_bytes_per_sequence; /* recurrent (KDA) state a sequence holds, whatever its length */
    uint64_t state_bytes_total;  /* that state for every sequence slot and prefix-cache snapshot,
                                    allocated at creation */
    uint32_t prefix_cache;       /* 1: prefix caching runs */
    uint32_t pages_cached;       /* pages the prefix cache holds (the unreferenced ones count as free) */
    uint64_t prefix_hit_tokens;  /* prompt tokens served from the prefix cache */
    uint64_t prefix_miss_tokens; /* prompt tokens computed while prefix caching runs */
    uint32_t kv_dtype;           /* what the cache stores (1 f32, 2 f16, 3 fp8) */
    uint32_t kv_reserved;
    uint64_t kv_bytes_per_token; /* cache bytes one position takes across every layer and part */
    uint32_t programmatic_launch; /* 1: GPU kernels launch before their predecessor ends (sm_90+; TF_CUDA_PDL=0 off) */
    uint32_t shared_side_layers;  /* MoE layers whose shared expert a decode step runs on a second GPU stream (TF_CUDA_SHARED_SIDE=0 off) */
    uint64_t preemptions;        /* sequences sent back to wait when the shared page pool ran out
                                    (they compute their tokens again, then go on as before) */
} tf_engine_stats;

tf_status tf_engine_create(const char *model_dir, const tf_engine_params *params, tf_engine **out);
tf_status tf_engine_destroy(tf_engine *engine);
/* Rank 0 of tp_world processes (tensor parallelism): listens on host:port (IPv4) until the other
 * ranks have joined, then runs like tf_engine_create; each step drives every rank. */
tf_status tf_engine_create_tp_master(const char *model_dir, const tf_engine_params *params,
                                     const char *host, uint16_t port, tf_engine **out);
/* An engine over a model of config_json's shape (a config.json's text, config_len bytes) with
 * random EXL3 weights of `bits` (1..8) per weight made in memory: full-size benchmarks without
 * checkpoint files. The same seed gives the same weights. */
tf_status tf_engine_create_synthetic(const char *config_json, size_t config_len,
                                     const tf_engine_params *params, uint32_t bits, uint64_t seed,
                                     tf_engine **out);
/* A worker rank (>= 1): joins the master at host:port and serves its forwards; returns TF_OK when
 * the master shuts down, an error when the connection fails. Blocks. */
tf_status tf_tp_worker_run(const char *model_dir, uint32_t rank, const char *host, uint16_t port);
/* Queues a sequence; *id_out names it in step records and cancel. stop_tokens end it with STOP. */
tf_status tf_engine_add_sequence(tf_engine *engine, const uint32_t *tokens, size_t count,
                                 const tf_sampling_params *sampling, const uint32_t *stop_tokens,
                                 size_t stop_count, uint64_t *id_out);
/* One forward over all live sequences; fills up to capacity records, one per sampled token. */
tf_status tf_engine_step(tf_engine *engine, tf_step_record *records, size_t capacity, size_t *count_out);
/* What a constrained sequence's next sampled token may be (grammar-constrained sampling): only the
 * tokens whose bit is set in mask (bit t % 32 of word t / 32; words = ceil(vocab / 32)), after its
 * penalties; or, with mask NULL and words 0, anything (sampled as an unconstrained sequence would
 * be). The token spends it: a step that would sample a constrained sequence with no mask set since
 * its last token fails with TF_ERR_INVALID_ARGUMENT. Logprobs stay the model's. */
tf_status tf_engine_set_token_mask(tf_engine *engine, uint64_t sequence_id, const uint32_t *mask, size_t words);
/* OpenAI's logit_bias for every token the sequence samples from now on: values[i] (finite, in
 * [-100, 100]) added to the logit of tokens[i] (distinct, < vocab; at most 1024 entries) before its
 * penalties; count 0 clears it. Such a sequence is sampled on the host. Logprobs stay the model's. */
tf_status tf_engine_set_logit_bias(tf_engine *engine, uint64_t sequence_id, const uint32_t *tokens,
                                   const float *values, size_t count);
/* Ends a sequence now and returns its KV pages. */
tf_status tf_engine_cancel(tf_engine *engine, uint64_t sequence_id);
tf_status tf_engine_stats_get(const tf_engine *engine, tf_engine_stats *out);
/* One launch of a timed step: the kernel, where it ran (layer -1: outside the layers; part 0 embed,
 * 1 attention, 2 norm, 3 ffn, 4 head, 5 other), its time up to the next launch's start, and the
 * weight or cache bytes it reads where stated (0: not stated). */
typedef struct {
    char name[48];
    int32_t layer;
    uint32_t part;
    float micros;
    uint32_t reserved;
    uint64_t reads;
} tf_timeline_entry;
/* Times the next tf_engine_step's forward launch by launch (the cuda backend on one GPU; a step
 * that would replay a recording records one of its own with an event before each launch). */
tf_status tf_engine_time_next_step(tf_engine *engine);
/* The last timed step's launches: *count_out is their number; entries are written when capacity
 * holds them all (capacity 0: the count alone). */
tf_status tf_engine_timeline(tf_engine *engine, tf_timeline_entry *entries, size_t capacity, size_t *count_out);
/* Logits at every position of `prompts` fresh sequences run as one batch; tokens holds them back
 * to back, lengths their sizes; out is (sum of lengths, vocab) float32. */
tf_status tf_engine_prompt_logits(tf_engine *engine, const uint32_t *tokens, const size_t *lengths,
                                  size_t prompts, float *out, size_t out_len);

#ifdef __cplusplus
}
#endif
#endif
