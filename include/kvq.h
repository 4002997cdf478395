/*
 * kvq.h - the one public header of libkvq.
 *
 * kvq keeps the key/value cache of LLM inference small and fast: it encodes K
 * and V vectors with compact codecs (integer, TurboQuant, non-uniform per
 * channel), scores queries and accumulates values directly on the encoded
 * bytes, and (in later layers of the library) pages, evicts and tiers them.
 *
 * Conventions
 * - Every function that can fail returns kvq_status: 0 is success, negative
 *   values are errors; kvq_strerror() names them and never returns NULL.
 *   Results come back through out-parameters.
 * - When a function returns an error, it has written nothing to its outputs
 *   and the handle is unchanged: everything it returns afterwards (stats
 *   included) is what it returned before. The exceptions are stated at
 *   their calls: what kvq_cache_save, kvq_cache_prefix_put and a Redis put
 *   or del may have written to the store, the peak of a failed
 *   kvq_cache_load or kvq_cache_prefix_get, what kvq_cache_prefix_put
 *   settles, the layers kvq_model_forward ran before it failed, and lost
 *   cold pages (they are gone whatever the call does). Work inside a call
 *   that the call can do without may fail without failing it: a buffer that
 *   cannot shrink stays larger (stored_bytes), a page that cannot move to
 *   the warm or cold tier stays where it is (demotion_failures), a
 *   compaction of the file store waits for a later put or del.
 *   tests/test_failalloc.c fails every allocation of every call that
 *   mutates a cache, a codec or a store in turn and checks all of this.
 * - Buffers are passed as (dst, dst_capacity, src, src_size); sizes are
 *   size_t. Capacities of float buffers count floats, of byte buffers bytes.
 * - Handles are opaque; every _free() accepts NULL.
 * - Thread safety: a kvq_codec is immutable once created, except by
 *   kvq_codec_fit() and kvq_codec_load_state(). All other calls on one codec
 *   may run from several threads at once. Nothing in the library uses global
 *   mutable state; CPU feature detection runs once (pthread_once) and is
 *   read-only after.
 * - Stored data is little-endian. docs/format.md has the byte layouts.
 */
#ifndef KVQ_H
#define KVQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVQ_VERSION_MAJOR 0
#define KVQ_VERSION_MINOR 1
#define KVQ_VERSION_PATCH 0
#define KVQ_VERSION_NUMBER (KVQ_VERSION_MAJOR * 10000 + KVQ_VERSION_MINOR * 100 + KVQ_VERSION_PATCH)

#if defined(_WIN32)
#define KVQ_API
#else
#define KVQ_API __attribute__((visibility("default")))
#endif

KVQ_API const char *kvq_version_string(void);

/* ---- errors --------------------------------------------------------------
 * One X-macro list: the enum and the strings cannot drift apart. */
#define KVQ_ERROR_LIST(X)                                                                          \
    X(KVQ_OK, 0, "ok")                                                                             \
    X(KVQ_ERR_INVALID_ARG, -1, "invalid argument (NULL pointer or zero count)")                    \
    X(KVQ_ERR_NOMEM, -2, "out of memory")                                                          \
    X(KVQ_ERR_UNKNOWN_CODEC, -3, "unknown codec name")                                             \
    X(KVQ_ERR_BAD_OPTION, -4, "unknown or invalid codec option")                                   \
    X(KVQ_ERR_HEAD_DIM, -5, "head_dim must be between 1 and 1024")                                 \
    X(KVQ_ERR_GROUP, -6, "group size does not divide head_dim")                                    \
    X(KVQ_ERR_DST_TOO_SMALL, -7, "destination buffer too small")                                   \
    X(KVQ_ERR_SRC_SIZE, -8, "source size is not a whole number of encoded vectors")                \
    X(KVQ_ERR_NONFINITE, -9, "input contains NaN or Inf")                                          \
    X(KVQ_ERR_NOT_FITTED, -10, "codec has no fitted tables: call kvq_codec_fit or load state")     \
    X(KVQ_ERR_CORRUPT, -11, "corrupt or malformed data")                                           \
    X(KVQ_ERR_VERSION, -12, "unsupported format version")                                          \
    X(KVQ_ERR_IO, -13, "I/O error")                                                                \
    X(KVQ_ERR_ISA, -14, "requested SIMD path is not supported by this CPU")                        \
    X(KVQ_ERR_UNSUPPORTED, -15, "operation not supported by this codec or configuration")          \
    X(KVQ_ERR_FULL, -16, "cache is full (max_tokens reached and no eviction possible)")            \
    X(KVQ_ERR_ORDER, -17, "token position goes backwards")                                         \
    X(KVQ_ERR_RANGE, -18, "index out of range")                                                    \
    X(KVQ_ERR_MISMATCH, -19, "state or data does not match this codec or cache")                   \
    X(KVQ_ERR_NOSPACE, -20, "no space left on the store")                                          \
    X(KVQ_ERR_CONN, -21, "store connection failed")

typedef enum {
#define KVQ__ENUM(name, value, msg) name = value,
    KVQ_ERROR_LIST(KVQ__ENUM)
#undef KVQ__ENUM
} kvq_status;

/* Never NULL; unknown codes give "unknown error". */
KVQ_API const char *kvq_strerror(kvq_status status);

/* ---- allocator -------------------------------------------------------------
 * Per handle. NULL (or a struct with NULL functions) means malloc/free.
 * alloc must return memory aligned to at least 64 bytes or NULL; kvq never
 * asks for 0 bytes. free is never called with NULL. Both are called only
 * from the thread that is inside a kvq function on that handle (never from
 * a cache's attention workers), so an allocator needs no locking of its own
 * as long as the caller serializes calls on the handles that share it. */
typedef struct kvq_allocator {
    void *(*alloc)(void *ctx, size_t size);
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} kvq_allocator;

/* ---- CPU paths -------------------------------------------------------------*/
typedef enum {
    KVQ_ISA_AUTO = 0,   /* the best path this CPU supports */
    KVQ_ISA_SCALAR = 1, /* the plain C reference */
    KVQ_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C */
    KVQ_ISA_AVX512 = 3, /* AVX-512 F/BW/VL/DQ (+ VNNI, VBMI kernels where the CPU has them) */
    KVQ_ISA_AVXVNNI = 4 /* AVX2 + FMA + F16C + AVX-VNNI (vpdpbusd on 256 bits: Intel Alder Lake
                           and later without AVX-512, Zen 5): the AVX2 path with int8/int4
                           attention kernels on vpdpbusd; auto picks it where AVX-512 is absent */
} kvq_isa;

KVQ_API kvq_isa kvq_cpu_best_isa(void);
KVQ_API int kvq_cpu_supports(kvq_isa isa);
KVQ_API const char *kvq_isa_name(kvq_isa isa);

/* ---- codecs ----------------------------------------------------------------
 * A codec encodes each vector of head_dim floats (1..1024) independently into
 * a fixed number of bytes. Codecs are named by a spec: a name and options
 * after colons, e.g. "int4:g=32", "tq3:nc=0:seed=7".
 *
 *   f32 f16 bf16          plain values (f16/bf16 round to nearest even; f16
 *                         saturates at +-65504 instead of overflowing to Inf)
 *   int8[:g=G]            symmetric per group: fp16 scale (absmax/127), int8s
 *   int4[:g=G] int2[:g=G] asymmetric per group: fp16 scale and minimum, codes
 *                         packed little-end first (value 2i in the low nibble
 *                         of byte i for int4; value 4i+k in bits 2k..2k+1)
 *   tq1..tq4[:nc=][:norm=][:seed=]
 *                         TurboQuant-MSE: random rotation, Lloyd-Max codebook
 *                         for one coordinate of a random unit vector in R^d,
 *                         packed b-bit indices and one stored scale
 *   tqp2..tqp4[:nc=][:norm=][:seed=]
 *                         TurboQuant-prod: tq(b-1) + 1-bit QJL sketch of the
 *                         residual and its norm (unbiased inner products)
 *   nuq1..nuq8            per-channel non-uniform levels fitted by 1-D
 *                         Lloyd-Max; needs kvq_codec_fit or load_state
 * Option values are decimal: digits only, no sign, space or leading zero
 * ("g=010", "seed=0x10", "g=+8" and "g=" are KVQ_ERR_BAD_OPTION).
 * Options: g=N group size (int codecs; default head_dim; must divide it),
 * nc=0|1 norm correction (default 1), norm=16|8 stored scale as fp16 or as an
 * 8-bit log2 code, seed=N rotation and sketch seed (default 0x6b7671). */
typedef struct kvq_codec kvq_codec;

typedef struct kvq_codec_params {
    const kvq_allocator *allocator; /* NULL = malloc/free */
    kvq_isa isa;                    /* KVQ_ISA_AUTO or a forced path */
    char *err_msg;                  /* optional: a detailed message on failure */
    size_t err_msg_size;
} kvq_codec_params;

/* params may be NULL (defaults). On error *out is NULL. */
KVQ_API kvq_status kvq_codec_create(kvq_codec **out, const char *spec, size_t head_dim,
                                    const kvq_codec_params *params);
KVQ_API void kvq_codec_free(kvq_codec *codec);

/* The canonical spec with every option spelled out, e.g. "int4:g=32". */
KVQ_API const char *kvq_codec_spec(const kvq_codec *codec);
KVQ_API size_t kvq_codec_head_dim(const kvq_codec *codec);
/* Bytes of one encoded vector (everything stored for it: scales, norms...). */
KVQ_API size_t kvq_codec_vector_bytes(const kvq_codec *codec);
/* vector_bytes * 8 / head_dim. Codec state (nuq tables) is not per vector
 * and is reported by kvq_codec_state_bytes. */
KVQ_API double kvq_codec_bits_per_value(const kvq_codec *codec);
KVQ_API size_t kvq_codec_state_bytes(const kvq_codec *codec);
KVQ_API kvq_isa kvq_codec_isa(const kvq_codec *codec);
/* 1 when the codec needs kvq_codec_fit (or load_state) before encoding. */
KVQ_API int kvq_codec_needs_fit(const kvq_codec *codec);
/* Capacity in bytes needed to encode n vectors. */
KVQ_API size_t kvq_codec_encode_bound(const kvq_codec *codec, size_t n_vectors);

/* src holds n_vectors * head_dim floats. The input is checked first: NaN/Inf
 * gives KVQ_ERR_NONFINITE and dst is not touched. */
KVQ_API kvq_status kvq_codec_encode(const kvq_codec *codec, void *dst, size_t dst_capacity,
                                    const float *src, size_t n_vectors);
/* src_size must be a multiple of vector_bytes; dst gets src_size/vector_bytes
 * * head_dim floats. */
KVQ_API kvq_status kvq_codec_decode(const kvq_codec *codec, float *dst, size_t dst_capacity,
                                    const void *src, size_t src_size);

/* Fused score: for n_q float queries (n_q * head_dim floats) and the
 * n_keys = keys_size / vector_bytes encoded keys, scores[i * n_keys + j] =
 * <q_i, key_j> computed on the encoded bytes (each key is decoded once for
 * all queries). The SIMD paths may quantize the query to int8 (int codecs)
 * or the query and codebook to int16 (tq4); their error against the scalar
 * path is bounded in tests/. */
KVQ_API kvq_status kvq_codec_score(const kvq_codec *codec, float *scores, size_t scores_capacity,
                                   const float *q, size_t n_q, const void *keys, size_t keys_size);

/* Fused accumulate: out[i * head_dim + c] += sum_j w[i * n_vals + j] * v_j[c]
 * for n_q weight rows over n_vals = vals_size / vector_bytes encoded values. */
KVQ_API kvq_status kvq_codec_accumulate(const kvq_codec *codec, float *out, size_t out_capacity,
                                        const float *w, size_t n_q, const void *vals,
                                        size_t vals_size);

/* Fit codec state from sample vectors (nuq: per-channel Lloyd-Max tables;
 * tq/tqp with norm=8: the range of the log2 norm code). Codecs without
 * state return KVQ_OK and do nothing. */
KVQ_API kvq_status kvq_codec_fit(kvq_codec *codec, const float *samples, size_t n_vectors);

/* Codec state as a self-checking blob (magic, version, spec, head_dim,
 * payload, CRC32C). save_state with dst NULL reports the size in *written. */
KVQ_API kvq_status kvq_codec_save_state(const kvq_codec *codec, void *dst, size_t dst_capacity,
                                        size_t *written);
KVQ_API kvq_status kvq_codec_load_state(kvq_codec *codec, const void *src, size_t src_size);
/* The same blob in a file (the calibration file). Saving writes a temporary
 * file, fsyncs it, renames it over path and fsyncs the directory, so the
 * new file survives a crash once the call returns (KVQ_ERR_IO when that last
 * sync fails: the file is then in place but may not survive a crash). */
KVQ_API kvq_status kvq_codec_save_file(const kvq_codec *codec, const char *path);
KVQ_API kvq_status kvq_codec_load_file(kvq_codec *codec, const char *path);


/* ---- the cache -------------------------------------------------------------
 * A kvq_cache stores the K and V vectors of every layer and KV head of one
 * sequence, encoded in pages of page_tokens tokens, and computes attention
 * directly over the encoded pages. Keys are stored after RoPE (the model
 * applies RoPE before appending) unless k_prerope is set, in which case the
 * cache stores pre-RoPE keys and rotates each decoded key page inside
 * attention at its token's position. Each token keeps its position, so
 * eviction never shifts the positions of the tokens that remain.
 *
 * Causality: appending n tokens and attending with their n queries gives
 * what n single-token append+attend steps give, except that the queries of
 * a chunk see that chunk's keys and values exactly (as an engine's prefill
 * does). An append stores lossy K/V in f16 staging (f32/f16 codecs store
 * directly); a later call encodes them: the next append, and the end of an
 * attend whose queries reach the newest token, encode every staged token
 * but the newest max(recent_window, 1) - 1. So a decode step's query sees
 * its own token and the recent_window - 1 before it exactly and everything
 * older as stored, and the bytes a token is stored as never depend on how
 * the sequence was chunked (a prefill + attend and token-by-token decoding
 * leave bit-identical pages). Channel-layout key pages are encoded once
 * full and settled.
 *
 * Eviction (policies below) runs at the end of an attend that reaches the
 * newest token, after the utility scores include that chunk's attention,
 * so a prefill longer than the budget is attended whole and compressed
 * afterwards (as kvpress does) and the budget holds after every
 * append+attend step. An append evicts only older tokens: those over the
 * budget when no attend ran since, or to keep max_tokens. The first `sinks`
 * tokens and the newest `protect_recent` are never evicted; when the budget
 * is smaller than both together the protected window shrinks to fit, then
 * the sinks. max_tokens bounds the tokens stored whenever a call returns.
 *
 * Thread safety: a cache is not safe for concurrent mutation; append, evict,
 * set_precision and attend (which updates utility scores and counters) on
 * one cache must be serialized by the caller. Read-only calls (get_kv,
 * stats, tokens) may run concurrently with each other. attend may itself use
 * n_threads worker threads over the KV heads of a layer: n_threads - 1
 * persistent workers started by kvq_cache_create and joined by
 * kvq_cache_free (no thread is created per call; they never call the
 * allocator or any callback). After an attend the workers poll for the
 * next one for up to 50 us before they sleep (a wake-up costs 10-50 us on
 * a busy machine, as much as a step over 1k tokens). */
typedef struct kvq_cache kvq_cache;

typedef enum {
    KVQ_POLICY_NONE = 0,    /* never evict; append past max_tokens fails */
    KVQ_POLICY_WINDOW = 1,  /* StreamingLLM: sinks + the most recent tokens */
    KVQ_POLICY_FIFO = 2,    /* evict in arrival order (oldest appended first) */
    KVQ_POLICY_UTILITY = 3  /* EMA of attention received (0.9 old + 0.1 new; new = 1.0) */
} kvq_policy;

typedef enum {
    KVQ_LAYOUT_TOKEN = 0,  /* each key vector encoded on its own */
    KVQ_LAYOUT_CHANNEL = 1 /* KIVI: per-channel scale/min over the tokens of a page */
} kvq_layout;

/* Per-layer / per-KV-head codec override. layer or head < 0 means "all";
 * otherwise they must be below n_layers / n_kv_heads, and codec must not be
 * NULL (kvq_cache_create: KVQ_ERR_INVALID_ARG, naming the override).
 * Key codecs may be given as "chan:int<b>" (b = 1..8) to use the channel
 * layout for that head only. state/state_size optionally carry a codec state
 * blob (kvq_codec_save_state: fitted nuq tables, a norm=8 range); such a
 * codec is private to the heads of this override. */
typedef struct kvq_codec_override {
    int layer;
    int kv_head;
    int is_value; /* 0: keys, 1: values */
    const char *codec;
    const void *state;
    size_t state_size;
} kvq_codec_override;

/* Limits of a kvq_cache_config. kvq_cache_create refuses a count outside
 * its range with KVQ_ERR_INVALID_ARG (head_dim: KVQ_ERR_HEAD_DIM) and a
 * message naming the field, and every size it computes from them is
 * checked for overflow. */
#define KVQ_MAX_LAYERS 4096        /* n_layers: 1..4096 */
#define KVQ_MAX_KV_HEADS 4096      /* n_kv_heads: 1..4096 */
#define KVQ_MAX_Q_HEADS 16384      /* n_q_heads: 1..16384, a multiple of n_kv_heads */
#define KVQ_MAX_HEAD_DIM 1024      /* head_dim: 1..1024 */
#define KVQ_MAX_TOKENS (1u << 30)  /* max_tokens: 1..2^30; budget_tokens, sinks,
                                      protect_recent, hot_tokens, warm_tokens: 0..2^30 */
#define KVQ_MAX_PAGE_TOKENS 4096   /* page_tokens: 1..4096 */
#define KVQ_MAX_THREADS 256        /* n_threads: 0..256 (0 = 1) */
#define KVQ_MAX_OVERRIDES (1u << 20) /* n_overrides: 0..2^20 (overrides not NULL when > 0) */
#define KVQ_MAX_COLD_TTL_MS ((uint64_t)1 << 40) /* cold_ttl_ms: 0..2^40 (about 35 years) */

typedef struct kvq_cache_config {
    size_t n_layers, n_kv_heads, n_q_heads, head_dim; /* limits above */
    size_t max_tokens;          /* per layer: the page pool holds at most this many */
    const char *k_codec;        /* default "f16" */
    const char *v_codec;        /* default "f16" */
    const kvq_codec_override *overrides;
    size_t n_overrides;
    size_t page_tokens;         /* default 16 */
    size_t recent_window;       /* newest R tokens kept in f16, encoded when they leave (0;
                                   at most max_tokens) */
    size_t sinks;               /* first tokens never evicted (4) */
    kvq_policy policy;          /* default KVQ_POLICY_NONE */
    size_t budget_tokens;       /* per layer, 0 = none (max_tokens bounds it: a larger
                                   budget acts as max_tokens, where kvq_cache_set_budget
                                   refuses one) */
    double budget_ratio;        /* > 0: budget = ceil(ratio * tokens appended when the first
                                   attend reaching the newest token ends: the prefill's
                                   length), at most max_tokens; in decode-only use give
                                   budget_tokens instead. Finite, >= 0 */
    size_t protect_recent;      /* most recent tokens never evicted (128) */
    kvq_layout k_layout;        /* default token */
    int k_prerope;              /* keys are given before RoPE; RoPE applied in attention */
    double rope_theta;          /* 10000; finite and > 0 with k_prerope */
    size_t rope_dims;           /* rotary dims (0 = head_dim); pairs (2i, 2i+1) */
    int k_center;               /* subtract a per-(layer, head) channel mean from keys */
    const float *k_center_values; /* [n_layers][n_kv_heads][head_dim], required with
                                     k_center (channel means from calibration data) */
    size_t n_threads;           /* attention worker threads (1) */
    const kvq_allocator *allocator;
    kvq_isa isa;
    char *err_msg;              /* optional detailed message on failure */
    size_t err_msg_size;
    /* residency tiers, per layer (0 = unlimited; all 0: every page stays hot).
     * Pages over the hot capacity move to the warm arena, optionally
     * re-encoded with warm_codec; over the warm capacity they go to the cold
     * store, or are dropped (evicted) without one. Pages holding sinks, the
     * protected recent window or not-yet-encoded tokens stay hot. Demotion
     * takes the pages with the lowest utility (utility policy) or the oldest
     * newest-token first; attention promotes visible cold pages (a miss) and,
     * with warm_promote, warm pages; otherwise it reads warm pages in place.
     *
     * Lost cold pages: a cold page whose record the store no longer has or
     * returns corrupt (a Redis restart without persistence, an expired TTL,
     * a removed or damaged segment file, a record that fails its checksum or
     * does not match the page, or with verify_tiers a block whose CRC32C
     * differs from the one taken at demotion) is lost. The attend that needs
     * it counts it in lost_pages and its tokens in lost_tokens, drops those
     * tokens as if evicted (tokens_evicted; attention renormalises over the
     * tokens that remain, and token_attn covers those) and goes on;
     * kvq_cache_last_error describes the last loss. With strict_tiers the
     * attend returns KVQ_ERR_CORRUPT instead and leaves the page and its
     * tokens as they are (counted once in lost_pages), so every later attend
     * that needs it fails the same way. Store failures that may pass
     * (KVQ_ERR_IO, KVQ_ERR_CONN, KVQ_ERR_NOMEM) are no loss: the attend fails
     * with the page still cold and a later one retries; a dropped connection
     * is retried once at once, so a Redis restart that is over by the next
     * call costs no failed call. get_kv and kvq_cache_save
     * cannot drop tokens: they return KVQ_ERR_CORRUPT for a lost page not yet
     * dropped. A page demoted again keeps its record instead of writing a
     * new one only while the store cannot have lost it since it was read
     * (no reconnect, no removed segment) and no TTL is set. */
    size_t hot_tokens, hot_bytes;
    size_t warm_tokens, warm_bytes;
    const char *warm_codec;     /* K and V codec of warm pages (NULL: as hot) */
    const kvq_allocator *warm_allocator; /* the warm arena (NULL: the cache's allocator) */
    /* NULL: demoted-from-warm pages are dropped. Otherwise the cache holds a
     * reference on the store until kvq_cache_free, which deletes the cache's
     * records through it (see kvq_store_close). Records are named
     * "kvq/<id>/l<layer>/p<page>/g<n>", id a random 128-bit number from the
     * OS (32 hex digits), so caches of several processes can share a store. */
    struct kvq_store *cold_store;
    int warm_promote;
    int verify_tiers;           /* checksum pages on demotion, verify on promotion */
    int strict_tiers;           /* a lost cold page fails attend with KVQ_ERR_CORRUPT */
    /* > 0: records written to the cold store expire this many milliseconds
     * after the page went cold (Redis SET ... PX), so a crashed process
     * leaves nothing behind for longer; a page needed after its record
     * expired is lost (above): choose it above the longest time a page may
     * stay cold. Each demotion writes a fresh record. The file store has no
     * expiry and ignores it (one process holds its directory locked). */
    uint64_t cold_ttl_ms;
    double link_gbps[2];        /* modeled bandwidth hot<->warm, warm<->cold (32 GB/s; 0: the
                                   default); finite, >= 0 */
    double link_latency_ms[2];  /* modeled launch overhead per transfer (0.015 ms); finite,
                                   >= 0 */
    /* Page blocks when allocator (and warm_allocator) is NULL: 0 (default)
     * from 2 MiB aligned regions advised for transparent huge pages, the
     * blocks of each size back to back (a decode step streams 3-15%
     * faster than over glibc's 4 KiB pages: docs/attend.md); memory is
     * committed as it is touched, so beyond the blocks in use the regions
     * hold at most one partly used huge page per block size (64 sizes;
     * more go to posix_memalign) and freed blocks (stats: arena_bytes);
     * freed blocks are reused; when no block of a size is left (a codec
     * switch) its regions but one go back to the OS, the rest at
     * kvq_cache_free.
     * -1: every block from posix_memalign. */
    int huge_pages;
} kvq_cache_config;

typedef struct kvq_tier_stats {
    uint64_t pages[3], tokens[3]; /* hot, warm, cold */
    uint64_t bytes[3];            /* arena bytes of hot/warm pages; record bytes in the store */
    uint64_t reads[3];            /* page reads by attention served from each tier (cold: misses) */
    uint64_t demotions, promotions, demotion_failures, dropped_pages;
    uint64_t lost_pages;          /* cold pages found lost (see "Lost cold pages" above) */
    uint64_t verify_mismatches;   /* verify_tiers: blocks whose CRC32C changed (cold: also lost) */
    uint64_t lost_tokens;         /* tokens of the lost pages, dropped (in tokens_evicted) */
    uint64_t bytes_hot_to_warm, bytes_warm_to_hot, bytes_to_cold, bytes_from_cold;
    double modeled_transfer_ms, measured_transfer_ms;
} kvq_tier_stats;

/* Fills every field with its default and zeros the shape: n_layers,
 * n_kv_heads, n_q_heads, head_dim and max_tokens are 0, which
 * kvq_cache_create refuses with KVQ_ERR_INVALID_ARG and a message naming
 * the field ("bad shape: max_tokens 0 is outside 1..2^30"). Set them, or
 * call kvq_model_cache_shape for a model, before kvq_cache_create. */
KVQ_API void kvq_cache_config_init(kvq_cache_config *cfg);
KVQ_API kvq_status kvq_cache_create(kvq_cache **out, const kvq_cache_config *cfg);
KVQ_API void kvq_cache_free(kvq_cache *cache);

/* Appends n_tokens tokens to one layer. k and v are [n_tokens][n_kv_heads]
 * [head_dim]; positions[n_tokens] strictly increase and continue after the
 * last appended position (NULL: the next positions in order). The new
 * tokens stay until their queries have attended (see "Eviction" above). All
 * or nothing: the pages, staging and table the chunk needs are allocated
 * before the append encodes the staged tokens it owes (see "Causality"), so
 * on error those stay staged and nothing is stored. */
KVQ_API kvq_status kvq_cache_append(kvq_cache *cache, size_t layer, const float *k,
                                    const float *v, const int32_t *positions, size_t n_tokens);

/* Attention for one layer: q is [n_queries][n_q_heads][head_dim] at
 * q_positions[n_queries] (a key at position p is visible to a query at
 * position qp when p <= qp); out is [n_queries][n_q_heads][head_dim] =
 * softmax(q.K^T/sqrt(head_dim)).V. When token_attn is not NULL it receives,
 * for each KV head and each token the queries saw, the attention that token
 * received summed over the query heads of its group and over the queries:
 * [n_kv_heads][n_tokens] (token_attn_capacity floats). The tokens the
 * queries saw are those stored when the call starts, in ascending position
 * order: call kvq_cache_tokens and kvq_cache_positions before the attend, not
 * after it, because the eviction an attend makes (utility or FIFO policy over
 * the budget) comes after the attention and removes tokens that token_attn
 * still covers. (The one exception: a cold page found lost during the call
 * is dropped before the attention, so its tokens are not covered; a
 * caller that needs exact positions then compares lost_tokens of
 * kvq_cache_tier_stats before and after.) Under the utility policy, attention received
 * updates the scores whether or not token_attn is given. On error no score,
 * counter or page changed: with tiers, every cold record is read and every
 * block allocated before a page moves, so no page came back from warm or
 * cold; only cold pages found lost on the way stay dropped (or, with
 * strict_tiers, counted; see "Lost cold pages"). Scratch is allocated per
 * call and freed before it returns (KVQ_ERR_NOMEM, nothing changed, when it
 * cannot be): with several queries over staged tokens (a prefill),
 * page_tokens * head_dim * 2 bytes per page holding staged tokens and per
 * attention thread, a tiled f16 copy of one KV head's staged keys at a time
 * for the chunk's queries to score. */
KVQ_API kvq_status kvq_cache_attend(kvq_cache *cache, size_t layer, const float *q,
                                    const int32_t *q_positions, size_t n_queries, float *out,
                                    size_t out_capacity, float *token_attn,
                                    size_t token_attn_capacity);

/* For engines that compute attention with their own kernels (FlashAttention,
 * ggml, a PyTorch module) and keep their K/V in the cache: feeds the
 * attention weights they computed for n_queries query tokens of one layer
 * into the cache, in place of a kvq_cache_attend. weights is
 * [n_heads][n_tokens], the layout of attend's token_attn: for each head and
 * each token stored in the layer (n_tokens = kvq_cache_tokens, in ascending
 * position order, the order of kvq_cache_positions), the softmax weight the
 * token received summed over the n_queries queries (0 where a query did not
 * see it). Rows are per KV head (n_heads = n_kv_heads; each row also summed
 * over the query heads of the group, exactly what token_attn holds) or per
 * query head (n_heads = n_q_heads; query head qh belongs to KV head
 * qh / (n_q_heads / n_kv_heads)).
 * Under the utility policy every stored token's score becomes
 * 0.9 score + 0.1 a / (n_q_heads * n_queries), a its weights summed over the
 * rows, as attend does; so observing the token_attn of an attend gives the
 * scores that attend gave. Then, as at the end of an attend whose queries
 * reach the newest token: a pending budget_ratio is fixed, the layer is
 * evicted to the budget (any policy), staged tokens are settled and tier
 * capacities enforced. Call it once per layer after the attention of the
 * tokens just appended. Errors (kvq_cache_last_error names the entry):
 * KVQ_ERR_INVALID_ARG (n_queries 0, n_heads neither count, weights NULL with
 * tokens stored), KVQ_ERR_RANGE (layer; a negative weight; a row summing to
 * more than its queries' probabilities can, n_queries or n_queries x the
 * group size, beyond a 1/32 margin for the engine's rounding: scores or
 * logits passed as weights), KVQ_ERR_MISMATCH (n_tokens is not the layer's
 * count), KVQ_ERR_NONFINITE, KVQ_ERR_NOMEM; on error nothing changed. */
KVQ_API kvq_status kvq_cache_observe_attention(kvq_cache *cache, size_t layer,
                                               const float *weights, size_t n_heads,
                                               size_t n_tokens, size_t n_queries);

/* Number of tokens stored in a layer, and their positions in ascending
 * order. */
KVQ_API kvq_status kvq_cache_tokens(const kvq_cache *cache, size_t layer, size_t *n_tokens);
KVQ_API kvq_status kvq_cache_positions(const kvq_cache *cache, size_t layer, int32_t *positions,
                                       size_t capacity);

/* Decodes the tokens of a layer with index first..first+count-1 in ascending
 * position order, for one KV head (kv_head >= 0) or all (kv_head = -1), to
 * float: k and v are [count][heads][head_dim] (either may be NULL). Keys come
 * back as stored (after RoPE unless k_prerope) with the centre added back.
 * Cold pages are read from the store (and stay cold) before anything is
 * written: on error k and v are untouched. */
KVQ_API kvq_status kvq_cache_get_kv(const kvq_cache *cache, size_t layer, int kv_head,
                                    size_t first, size_t count, float *k, float *v,
                                    size_t capacity);

/* Switches the K or V codec of a layer (and one KV head, or all with -1) at
 * run time: staged tokens are first encoded with the old codec (all of
 * them, the recent window included), then pages are decoded and re-encoded
 * with the new codec; new tokens use it. *added_nmse (optional) gets the
 * error the re-encode added: sum ||old decoded - new decoded||^2 / sum ||old
 * decoded||^2. All or nothing: the new blocks of every layer named (all
 * with layer -1) are allocated before any staged token is encoded or any
 * layer switched, so on error every layer keeps its codec and its staged
 * tokens, and *added_nmse is not written. */
KVQ_API kvq_status kvq_cache_set_precision(kvq_cache *cache, int layer, int kv_head,
                                           int is_value, const char *codec, double *added_nmse);

/* Sets how many attention threads the next attends use: 1 to the cache's
 * own count (cfg.n_threads, at most n_kv_heads), whose workers stay
 * started; the others wait for later batches. Output is bit-identical at
 * every count. Not to be called while an attend of this cache runs.
 * kvq_cache_get_config still reports the count the cache was created with.
 * A count outside 1..that count: KVQ_ERR_INVALID_ARG (with a message),
 * nothing changed. */
KVQ_API kvq_status kvq_cache_set_threads(kvq_cache *cache, size_t n_threads);

/* Sets the budget and evicts down to it now, new tokens included. A budget
 * outside 1..max_tokens is KVQ_ERR_INVALID_ARG under every policy (with a
 * message: kvq_cache_last_error) and changes nothing; under
 * KVQ_POLICY_NONE any other is KVQ_ERR_UNSUPPORTED. Eviction allocates
 * nothing: this never fails for lack of memory. */
KVQ_API kvq_status kvq_cache_set_budget(kvq_cache *cache, size_t budget_tokens);

typedef struct kvq_stats {
    uint64_t tokens;          /* stored now */
    uint64_t tokens_appended;
    uint64_t tokens_evicted;
    uint64_t payload_bytes;   /* K/V page bytes (codec scales and norms included) and the f16
                                 staging of tokens not yet encoded */
    uint64_t metadata_bytes;  /* page tables, per-slot positions/states/scores */
    uint64_t codec_meta_bytes; /* part of payload_bytes that is codec metadata (scales,
                                  minimums, norms, per-page channel scales) */
    uint64_t stored_bytes;    /* payload + metadata = what is allocated now */
    uint64_t peak_stored_bytes;
    uint64_t bytes_written;   /* encoded bytes produced */
    uint64_t bytes_read;      /* encoded bytes scanned by attention */
    uint64_t reencodes;       /* vectors re-encoded (set_precision, window flushes excluded) */
    uint64_t pages;           /* allocated pages */
    uint64_t free_slots;      /* free token slots in allocated pages */
    double bits_per_value;    /* payload_bytes * 8 / ((tokens - tokens_cold) * kv_heads *
                                 head_dim * 2): the tokens held in memory */
    double total_bits_per_value; /* stored_bytes (tables too) * 8 / the same */
    double fragmentation;     /* free slots in allocated pages / all slots in allocated pages */
    /* What a long sequence converges to: the payload bytes of one token in a
     * full, encoded page (codec bytes, channel-page headers over P tokens,
     * alignment), * 8 / (kv_heads * head_dim * 2), over the layers. */
    double asymptotic_bits_per_value;
    /* payload_bytes minus tokens at the asymptotic cost: the per-sequence
     * fixed cost (f16 staging of tokens not yet encoded, unfilled page
     * slots, holes left by eviction); never below 0. */
    uint64_t fixed_bytes;
    /* tokens of pages in the cold tier (in the store, not in payload_bytes) */
    uint64_t tokens_cold;
    /* the whole cache (any layer argument): bytes of the huge-page regions
     * of its default allocator (kvq_cache_config.huge_pages), blocks in use
     * and free; the parts never touched commit no memory. 0 with a user
     * allocator or huge_pages -1. */
    uint64_t arena_bytes;
} kvq_stats;

/* Snapshots: saves every page of the cache (all tiers) holding tokens at
 * positions < prefix_end (INT32_MAX: all) as page records named
 * "<name>/l<layer>/p<page>" in the store, then a checksummed manifest
 * "<name>/manifest" (written last: a save cut short leaves no manifest). Load
 * restores such a snapshot into an empty cache with the same configuration:
 * the encoded pages come back bit for bit, so attention gives identical
 * outputs. The manifest records every setting that decides what the stored
 * bytes mean: n_layers, n_kv_heads, n_q_heads, head_dim, page_tokens,
 * k_layout, k_prerope, rope_theta, rope_dims, k_center, warm_codec, each
 * head's key and value codec (canonical spec, and the SHA-256 of its fitted
 * state) and the centre values (bit for bit). Load compares them before it
 * reads a page: any difference gives KVQ_ERR_MISMATCH, and
 * kvq_cache_last_error names the first field that differs, e.g. "k_prerope
 * is 0 in the snapshot, 1 here", "l1.h0.v_codec is ...", "k_center_values
 * differ (layer 1, kv head 0, channel 3 ...)". Policy, budgets, windows,
 * sinks, threads and tier capacities may differ. A manifest of another
 * version gives KVQ_ERR_VERSION (versions 1 and 2 are not read: 1 recorded
 * no configuration, 2 no record digests). What a load reads is untrusted (a
 * store may be shared): the manifest names its snapshot, carries a random
 * id of the save and the SHA-256 of every page record, and each record
 * carries the save's id, so a record altered, missing, moved to another
 * key or written by another save of the name (two writers) fails the load
 * with KVQ_ERR_CORRUPT; so does a page whose slots the cache could not have
 * written (slot states other than free/encoded/pending, a pending token
 * without its staged K/V or older than an encoded one, a position twice or
 * past the layer's last one, counters that contradict the pages). Nothing
 * authenticates a manifest: a writer of the store can still replace a whole
 * snapshot by another consistent one. Save leaves the cache unchanged. It deletes an earlier
 * manifest of the name before it writes a page, so a save that fails leaves
 * no snapshot of that name (or, failing before that, the earlier one
 * whole), never an earlier manifest over a mix of pages; the page records
 * it wrote stay in the store. A load that fails leaves the cache as it was
 * (empty), except peak_stored_bytes, which may have grown by what the load
 * held before it failed. */
KVQ_API kvq_status kvq_cache_save(kvq_cache *cache, struct kvq_store *store, const char *name,
                                  int32_t prefix_end);
KVQ_API kvq_status kvq_cache_load(kvq_cache *cache, struct kvq_store *store, const char *name);

/* Prefix caching (as vLLM's): the full pages of a sequence whose tokens are
 * ids[0..n) are published under "kvqp/<hex>/l<layer>", hex the SHA-256 of
 * the configuration (the fields a snapshot records, centre values included)
 * followed by the token ids up to the end of the page; prefix_get loads into
 * an empty cache the longest run of leading pages found for every layer, at
 * most n - 1 tokens, and reports how many tokens it loaded, so the model only
 * runs the rest. Each entry also holds its page's token ids and the digest of
 * the prefix before the page, and prefix_get compares both on every hit: an
 * entry of another prompt under the key (a key collision, a record stored
 * under the wrong key) ends the run as a miss (kvq_cache_last_error says
 * so). Loading another prompt's K/V would thus need a SHA-256 collision
 * between the two prompts' prefixes. Needs the token layout, and either no key centring or given
 * centre values (an estimated centre depends on the prompt). Pages that are
 * not a clean run of positions 0.. (evictions, pending tokens) are skipped.
 * An entry whose ids and prefix digest match but whose page record is not a
 * clean page (positions other than its own, a slot not encoded) fails the
 * call with KVQ_ERR_CORRUPT.
 * prefix_put first encodes the staged tokens that the next append would
 * encode (see "Causality"), failing or not, so an attend after it sees them
 * as stored; otherwise a failed put leaves the cache unchanged, and the
 * entries it published before the failure stay in the store (each is whole
 * and checked on a hit). A prefix_get that fails sets *n_loaded to 0 and
 * leaves the cache as it was (empty), except peak_stored_bytes (as load). */
KVQ_API kvq_status kvq_cache_prefix_put(kvq_cache *cache, struct kvq_store *store,
                                        const int32_t *ids, size_t n);
KVQ_API kvq_status kvq_cache_prefix_get(kvq_cache *cache, struct kvq_store *store,
                                        const int32_t *ids, size_t n, size_t *n_loaded);

/* Residency figures of the whole cache. */
KVQ_API kvq_status kvq_cache_tier_stats(const kvq_cache *cache, kvq_tier_stats *st);

/* layer = -1: the total over layers (peak is the peak of the total). */
KVQ_API kvq_status kvq_cache_stats(const kvq_cache *cache, int layer, kvq_stats *st);
/* JSON rendering of the total and per-layer stats; *written excludes the NUL.
 * With dst NULL, reports the size needed. */
KVQ_API kvq_status kvq_cache_stats_json(const kvq_cache *cache, char *dst, size_t capacity,
                                        size_t *written);

/* The detailed message of the last call that left one: a failed call's
 * detail (codec errors of set_precision, the field a snapshot differs in),
 * or a note of a call that succeeded (a lost cold page, a prefix entry of
 * another prompt skipped); "" otherwise (kvq_cache_save, load and the prefix
 * calls clear it first). Never NULL; valid until the next call. */
KVQ_API const char *kvq_cache_last_error(const kvq_cache *cache);

/* Returns a copy of the cache's configuration (pointer fields NULL). */
KVQ_API kvq_status kvq_cache_get_config(const kvq_cache *cache, kvq_cache_config *cfg);

/* ---- model runner (llama2.c checkpoints) -----------------------------------
 * Loads llama2.c checkpoints: the legacy header (7 int32, negative
 * vocab_size = separate classifier) and the versioned "ak42" layout
 * (version 1 fp32, version 2 Q8_0 dequantized at load), and runs the f32
 * forward pass (RMSNorm, RoPE, grouped-query attention, SwiGLU) with K and V
 * appended to a kvq cache and attention computed by kvq_cache_attend. A
 * model is immutable after load; forward uses per-call scratch. Loading
 * checks every size the header implies for overflow and requires the file
 * to be exactly as long as its shape needs (KVQ_ERR_CORRUPT otherwise). */
typedef struct kvq_model kvq_model;

typedef struct kvq_model_info {
    size_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, head_dim;
    int shared_classifier;
    int version; /* 0 legacy, 1 or 2 ak42 */
} kvq_model_info;

KVQ_API kvq_status kvq_model_load(kvq_model **out, const char *path, const kvq_allocator *alloc);
/* As kvq_model_load, and on failure err_msg (err_msg_size bytes, may be
 * NULL) says what is wrong: the system's reason for a file that cannot be
 * read, or the rule a corrupt file breaks ("truncated: the header says ...
 * needs N bytes, the file has M"). */
KVQ_API kvq_status kvq_model_load_msg(kvq_model **out, const char *path,
                                      const kvq_allocator *alloc, char *err_msg,
                                      size_t err_msg_size);
KVQ_API void kvq_model_free(kvq_model *model);
KVQ_API kvq_status kvq_model_get_info(const kvq_model *model, kvq_model_info *info);
/* Fills the shape, max_tokens (seq_len) and RoPE fields of cfg for this model
 * (call kvq_cache_config_init first; codecs and policy are left as they are). */
KVQ_API kvq_status kvq_model_cache_shape(const kvq_model *model, kvq_cache_config *cfg);
/* Runs n tokens at positions pos0.. through the model, appending their K/V
 * to the cache (pre-RoPE keys when the cache has k_prerope) and writing the
 * logits of every token to logits ([n][vocab_size]; logits may be NULL when
 * only the cache is wanted, or hold only the last row when last_only).
 * Layers run one after the other (append, then attend), so a forward that
 * fails leaves the layers before the failing one as a forward that
 * succeeded would, the failing one as it was or holding the tokens
 * appended but not attended, and the later ones as they were; logits are
 * not written. The cache then no longer holds one sequence: free it (or
 * load a snapshot into a new one) rather than run the tokens again. */
KVQ_API kvq_status kvq_model_forward(const kvq_model *model, kvq_cache *cache,
                                     const int32_t *tokens, size_t n, int32_t pos0, float *logits,
                                     size_t logits_capacity, int last_only);

/* llama2.c tokenizer.bin: BPE encoder and decoder. vocab_size is 259..2^24
 * (ids 0..2 are <unk> <s> </s>, 3..258 the byte pieces) and must be the
 * number of entries in the file: a file shorter than its vocab_size entries,
 * with a length past its end, or with bytes after them (the tokenizer of a
 * larger vocabulary) is KVQ_ERR_CORRUPT. A path that is not a regular file
 * is KVQ_ERR_IO. */
typedef struct kvq_tokenizer kvq_tokenizer;
KVQ_API kvq_status kvq_tokenizer_load(kvq_tokenizer **out, const char *path, size_t vocab_size,
                                      const kvq_allocator *alloc);
/* As kvq_tokenizer_load, with kvq_model_load_msg's message on failure. */
KVQ_API kvq_status kvq_tokenizer_load_msg(kvq_tokenizer **out, const char *path,
                                          size_t vocab_size, const kvq_allocator *alloc,
                                          char *err_msg, size_t err_msg_size);
KVQ_API void kvq_tokenizer_free(kvq_tokenizer *tok);
/* llama2.c encode(): optional BOS (1), the dummy-prefix space, UTF-8 byte
 * fallback (<0xXX> = byte + 3), greedy highest-score merges, optional EOS
 * (2). *n_tokens gets the count; capacity >= strlen(text) + 3 always fits. */
KVQ_API kvq_status kvq_tokenizer_encode(const kvq_tokenizer *tok, const char *text, int bos,
                                        int eos, int32_t *tokens, size_t capacity,
                                        size_t *n_tokens);
/* The text piece of `token` following `prev` (llama2.c decode(): the space
 * after BOS is dropped, <0xXX> pieces become the byte). Never NULL. */
KVQ_API const char *kvq_tokenizer_piece(const kvq_tokenizer *tok, int32_t prev, int32_t token,
                                        char buf[8]);

/* ---- stores ----------------------------------------------------------------
 * A kvq_store maps keys (NUL-terminated strings of 1..1024 bytes) to byte
 * values (0..1 GiB). The cache's cold tier and its snapshots keep page
 * records (docs/record-format.md) in one. Stores are opened from a URL:
 *
 *   "file:DIR" or "DIR"  a directory of append-only segment files of
 *                        checksummed entries (docs/record-format.md). Every
 *                        put and del is on disk (fdatasync) before it
 *                        returns. Opening rebuilds the index by scanning the
 *                        segments: a torn last entry is skipped and cut off,
 *                        corrupt entries are skipped and counted; values are
 *                        checked again on every get. A segment file removed
 *                        from the directory under a running store takes its
 *                        keys with it (KVQ_ERR_RANGE), as a reopen would; an
 *                        entry cut off by truncation is KVQ_ERR_CORRUPT. No
 *                        expiry (a cache's cold_ttl_ms applies to Redis
 *                        only). The directory is created
 *                        when missing (its parent then fsynced) and locked
 *                        (flock): one writer, or any number of readonly=1
 *                        opens, at a time, from one process or several. An
 *                        open the lock refuses (a second writer, a reader
 *                        while a writer has it, a writer while readers
 *                        have it) fails at once with KVQ_ERR_IO and a
 *                        message naming which kind holds it (a reader's
 *                        index is built when it opens and would not follow
 *                        a writer's changes). Options after '?',
 *                        '&'-separated (file: form only): readonly=1 (shared
 *                        lock, no writes, no repair), segment_bytes=N
 *                        (roll-over size, default 64 MiB), compact_min=N
 *                        (compaction runs when dead bytes exceed half of at
 *                        least this many, default 16 MiB; 0 disables it).
 *   "redis://HOST[:PORT][/NS][?timeout_ms=N]"
 *                        a Redis server (needs a build with hiredis, else
 *                        KVQ_ERR_UNSUPPORTED); keys are "kvq:NS:KEY" (NS
 *                        defaults to "default"; letters, digits, '_', '-',
 *                        '.'). Each call has one deadline for all of it
 *                        (connecting, sending, every reply byte, each SCAN
 *                        round; for a list, all its rounds, callbacks not
 *                        counted): timeout_ms, 1..3600000, default 5000;
 *                        past it the call fails with KVQ_ERR_CONN ("timed
 *                        out"). Replies are checked before use: a GET
 *                        value announced over 1 GiB is KVQ_ERR_CORRUPT; a
 *                        reply bigger than its command can get (other bulk
 *                        strings over 64 KiB, lines over 4 KiB, over 65536
 *                        array elements or 32 MiB), malformed RESP, a put
 *                        answered by another status than OK, or a list or
 *                        stats whose SCAN cursor comes back (or runs past
 *                        2^24 rounds) is KVQ_ERR_IO. A dropped, timed-out
 *                        or out-of-step connection fails the call; the
 *                        next call reconnects once. A put or del whose
 *                        reply does not come back (a timeout, a dropped
 *                        connection) fails, yet the server may have applied
 *                        it: the key then holds either value.
 *
 * Errors: KVQ_ERR_RANGE (no such key), KVQ_ERR_NOSPACE (the disk is full),
 * KVQ_ERR_IO, KVQ_ERR_CONN, KVQ_ERR_CORRUPT (a stored value failed its
 * checksum: corrupt bytes are never returned). A failed put or del of the
 * file store leaves the store as it was: the key keeps its previous value;
 * with Redis, one that failed waiting for the reply may have been applied
 * (above). The message of the last failure is kept:
 * kvq_store_last_error.
 * Thread safety: calls on one store are serialized by a lock inside it. */
typedef struct kvq_store kvq_store;

typedef struct kvq_store_metrics {
    uint64_t records;        /* live keys */
    uint64_t live_bytes;     /* sum of the sizes of their values */
    uint64_t stored_bytes;   /* file store: bytes of all segments (live and dead entries);
                                redis: live_bytes */
    uint64_t segments;       /* file store: segment files */
    uint64_t bytes_written;  /* since open: bytes appended (file) or sent as values (redis) */
    uint64_t bytes_read;     /* since open: bytes read by get */
    uint64_t puts, gets, dels;
    uint64_t errors;         /* calls that returned an error other than KVQ_ERR_RANGE */
    uint64_t torn_tails;     /* file store: torn last entries skipped (and cut off) at open */
    uint64_t corrupt_skipped; /* file store: corrupt entries skipped at open; any store:
                                 values that failed their checksum on get */
    uint64_t compactions;
} kvq_store_metrics;

/* On error *out is NULL and err_msg (optional) says why. alloc may be NULL. */
KVQ_API kvq_status kvq_store_open(kvq_store **out, const char *url, const kvq_allocator *alloc,
                                  char *err_msg, size_t err_msg_size);
/* Closes the store. Lifetime rule: a store that caches still use as their
 * cold_store is only marked closed; it stays open for them (with its
 * directory lock or connection) and is closed when the last of them is
 * freed. So a cache and its cold store may be freed in either order. After
 * kvq_store_close the caller must not use the handle itself again (no
 * puts, gets, snapshots or prefix calls with it, no second close). */
KVQ_API void kvq_store_close(kvq_store *s);
/* Stores size bytes under key, replacing any previous value. */
KVQ_API kvq_status kvq_store_put(kvq_store *s, const char *key, const void *data, size_t size);
/* *data gets a copy of the value from the store's allocator (never NULL on
 * success, even for size 0); release it with kvq_store_free_buf. */
KVQ_API kvq_status kvq_store_get(kvq_store *s, const char *key, void **data, size_t *size);
KVQ_API void kvq_store_free_buf(kvq_store *s, void *data);
/* KVQ_ERR_RANGE when the key is absent. */
KVQ_API kvq_status kvq_store_del(kvq_store *s, const char *key);
/* Calls fn for every key that starts with prefix ("" or NULL: all), in no
 * particular order; a non-zero return stops the listing. fn runs without the
 * store's lock and may call the store (keys put or deleted meanwhile may or
 * may not be listed; Redis may list a key twice). */
KVQ_API kvq_status kvq_store_list(kvq_store *s, const char *prefix,
                                  int (*fn)(void *ctx, const char *key, size_t size), void *ctx);
KVQ_API kvq_status kvq_store_stats(kvq_store *s, kvq_store_metrics *st);
/* The message of the last failed call ("" when none). Valid until the next
 * call on the store. */
KVQ_API const char *kvq_store_last_error(kvq_store *s);

/* EXPERIMENTAL (tests): arm a fault. NOSPACE and WRITE_IO make writes fail
 * (KVQ_ERR_NOSPACE / KVQ_ERR_IO) once `after` more bytes are written (file
 * store: ENOSPC / EIO part-way through the entry, which is then cut off;
 * Redis: a put of more bytes than are left is refused whole); READ makes
 * gets fail with KVQ_ERR_IO once `after` more bytes are read. File store
 * only: SYNC fails the fdatasync after `after` more successful ones (once).
 * Redis only: DISCONNECT drops the connection after `after` more commands
 * (once). Faults other than SYNC and DISCONNECT stay armed until
 * KVQ_FAULT_NONE clears them. A kind the store does not support gives
 * KVQ_ERR_UNSUPPORTED. */
typedef enum {
    KVQ_FAULT_NONE = 0,
    KVQ_FAULT_NOSPACE = 1,
    KVQ_FAULT_WRITE_IO = 2,
    KVQ_FAULT_SYNC = 3,
    KVQ_FAULT_READ = 4,
    KVQ_FAULT_DISCONNECT = 5
} kvq_store_fault;
KVQ_API kvq_status kvq_store_inject_fault(kvq_store *s, int kind, long after);

/* Page records: the header of a record (docs/record-format.md), after every
 * check the library makes (lengths, ranges, slot arrays, CRC32C). layout
 * points into data (layout_len bytes, not NUL-terminated). KVQ_ERR_CORRUPT
 * for bytes that are not a valid record, KVQ_ERR_VERSION for a record of an
 * unsupported version. */
typedef struct kvq_record_info {
    uint32_t version;
    uint64_t cache_id; /* the first 64 bits of the writing cache's random id */
    uint32_t layer, page_tokens, n_kv_heads, head_dim, n_tokens;
    int32_t pos_min, pos_max; /* -1 when n_tokens == 0 */
    uint64_t prefix_hash;
    const char *layout;
    size_t layout_len;
    size_t block_len;
} kvq_record_info;
KVQ_API kvq_status kvq_record_inspect(const void *data, size_t size, kvq_record_info *info);

/* ---- small utilities used by tools and bindings ---------------------------*/
KVQ_API uint16_t kvq_f32_to_f16(float x); /* round to nearest even, saturating */
KVQ_API float kvq_f16_to_f32(uint16_t h);
KVQ_API uint16_t kvq_f32_to_bf16(float x); /* round to nearest even */
KVQ_API float kvq_bf16_to_f32(uint16_t h);
KVQ_API uint32_t kvq_crc32c(uint32_t crc, const void *data, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* KVQ_H */
