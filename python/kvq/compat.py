"""Drop-in style classes for code written against the Python prototypes: a
whole-tensor K/V compressor (compress / decompress) and an adaptive cache
(update / get_kv / stats), both running on libkvq.

Layouts follow the prototypes, heads before tokens: the compressor takes
K and V of shape (layers, heads, seq, head_dim) (any [..., head_dim] works),
the adaptive cache takes per-step key/value of shape (heads, new_tokens,
head_dim). All memory figures are real: they are the byte sizes of the
encoded numpy buffers and codec state blobs held, or the library's own
accounting of what the cache has allocated.

Both take numpy float32 arrays (read in place when C-contiguous; any other
dtype raises TypeError: nothing is cast) or CPU torch tensors (float32 read
in place; float16 and bfloat16 converted) and give results back in the
caller's type.
"""

import numpy as np

from . import _arrays, _lib
from ._lib import KvqShapeError
from .cache import KVCache, _index
from .codec import Codec

__all__ = ["CompressedKV", "KVCompressor", "TurboQuantCompressor", "AdaptiveKVCache"]


class CompressedKV:
    """K and V encoded by KVCompressor.compress; self-describing (codec specs,
    head dims, shapes and any codec state travel with it).

    Memory figures (bytes):
      k_codes.nbytes, v_codes.nbytes   the encoded vectors (uint8 arrays)
      state_bytes                      codec state blobs (fitted tables), if any
      compressed_bytes                 the sum of the above: everything held
                                       except this object's few fixed fields
      original_bytes                   nbytes of the K and V arrays given to compress
      fp16_bytes                       the same values stored as fp16
    ratio = original_bytes / compressed_bytes; bits_per_value counts every
    compressed byte (state included) per K or V value.
    """

    def __init__(self, k_codes, v_codes, k_spec, v_spec, k_shape, v_shape, k_state, v_state,
                 original_bytes, dtype):
        self.k_codes = k_codes
        self.v_codes = v_codes
        self.k_spec = k_spec
        self.v_spec = v_spec
        self.k_shape = tuple(k_shape)
        self.v_shape = tuple(v_shape)
        self.k_state = bytes(k_state)
        self.v_state = bytes(v_state)
        self.original_bytes = int(original_bytes)
        self.dtype = dtype  # of the input: a numpy dtype, or a torch dtype (torch True)
        self.torch = False

    @property
    def n_values(self):
        return int(np.prod(self.k_shape)) + int(np.prod(self.v_shape))

    @property
    def payload_bytes(self):
        return int(self.k_codes.nbytes + self.v_codes.nbytes)

    @property
    def state_bytes(self):
        return len(self.k_state) + len(self.v_state)

    @property
    def compressed_bytes(self):
        return self.payload_bytes + self.state_bytes

    @property
    def fp16_bytes(self):
        return 2 * self.n_values

    @property
    def ratio(self):
        return self.original_bytes / self.compressed_bytes if self.compressed_bytes else 0.0

    @property
    def ratio_vs_fp16(self):
        return self.fp16_bytes / self.compressed_bytes if self.compressed_bytes else 0.0

    @property
    def bits_per_value(self):
        return self.compressed_bytes * 8.0 / self.n_values if self.n_values else 0.0

    @property
    def payload_bits_per_value(self):
        return self.payload_bytes * 8.0 / self.n_values if self.n_values else 0.0

    def memory(self):
        """The memory figures as a dict."""
        return {
            "k_spec": self.k_spec,
            "v_spec": self.v_spec,
            "k_bytes": int(self.k_codes.nbytes),
            "v_bytes": int(self.v_codes.nbytes),
            "state_bytes": self.state_bytes,
            "compressed_bytes": self.compressed_bytes,
            "original_bytes": self.original_bytes,
            "fp16_bytes": self.fp16_bytes,
            "ratio": self.ratio,
            "ratio_vs_fp16": self.ratio_vs_fp16,
            "bits_per_value": self.bits_per_value,
            "payload_bits_per_value": self.payload_bits_per_value,
        }

    # prototype-style aliases
    memory_bytes = compressed_bytes
    compression_ratio = ratio

    def __repr__(self):
        return ("CompressedKV(k=%s %s, v=%s %s, %d bytes from %d, ratio %.2f, %.3f bits/value)" %
                (self.k_spec, self.k_shape, self.v_spec, self.v_shape, self.compressed_bytes,
                 self.original_bytes, self.ratio, self.bits_per_value))


class KVCompressor:
    """Compresses whole K/V tensors with libkvq codecs.

    KVCompressor(k_codec="tqp3", v_codec="tq3", fit="auto", isa="auto", lib=None)

    The defaults are TurboQuant: keys with TurboQuant-prod (tq2 + a 1-bit QJL
    sketch of the residual: unbiased inner products), values with
    TurboQuant-MSE at 3 bits. Any codec spec works (int8, int4:g=32, nuq4,
    tq4:norm=8, ...). fit="auto" fits codecs that need it (nuq tables, the
    tq norm=8 range) on the very tensor being compressed, with one table set
    per tensor (all layers and heads together); fit=False never fits (a nuq
    codec then fails with KVQ_ERR_NOT_FITTED).

    compress(k, v) -> CompressedKV; decompress(c) -> (k, v) float32 arrays
    of the original shapes (or `dtype`).
    """

    def __init__(self, k_codec="tqp3", v_codec="tq3", fit="auto", isa="auto", lib=None):
        self.lib = _lib.load(lib)
        self.k_codec = k_codec
        self.v_codec = v_codec
        self.fit = fit
        self.isa = isa
        self._codecs = {}

    def _codec(self, spec, head_dim, state=b""):
        """A stateless codec is created once per (spec, head_dim) and reused;
        one with state is created fresh (fit and load_state mutate it)."""
        key = (spec, head_dim)
        c = self._codecs.get(key)
        if c is None:
            c = Codec(spec, head_dim, isa=self.isa, lib=self.lib)
            if c.state_bytes or c.needs_fit:
                if state:
                    c.load_state(state)
                return c
            self._codecs[key] = c
        return c

    def _encode(self, spec, x):
        c = self._codec(spec, x.shape[-1])
        state = b""
        if c.needs_fit or c.state_bytes:
            if (self.fit == "auto" or self.fit is True) and x.size:
                c.fit(x.reshape(-1, x.shape[-1]))
            if not c.needs_fit:
                state = c.save_state()
        return c.encode(x), c.spec, state

    def compress(self, k, v):
        """k, v: float arrays or CPU tensors (layers, heads, seq, head_dim),
        or any [..., head_dim]; NaN/Inf raise KvqError, other dtypes
        TypeError."""
        where = "KVCompressor.compress"
        kx, kind = _arrays.floats(k, "k", where)
        vx, _ = _arrays.floats(v, "v", where)
        # the bytes given: a tensor's own dtype (2 for float16), else float32
        original = sum(x.element_size() * x.numel() if _arrays.is_tensor(x) else a.nbytes
                       for x, a in ((k, kx), (v, vx)))
        if kx.ndim == 0 or vx.ndim == 0:
            raise KvqShapeError("k and v must be arrays [..., head_dim]", where)
        kc, ks, kst = self._encode(self.k_codec, kx)
        vc, vs, vst = self._encode(self.v_codec, vx)
        dtype = kind.dtype if kind.torch else np.dtype(np.float32)
        c = CompressedKV(kc, vc, ks, vs, kx.shape, vx.shape, kst, vst, original, dtype)
        c.torch = kind.torch
        return c

    def decompress(self, c, dtype=None):
        """(k, v) decoded from a CompressedKV, shaped as given to compress:
        numpy float32 (or dtype) for numpy input; for tensor input, CPU
        tensors in the input's dtype (or dtype, a torch dtype)."""
        if not isinstance(c, CompressedKV):
            raise KvqShapeError("decompress expects a CompressedKV", "KVCompressor.decompress")
        kd = self._codec(c.k_spec, c.k_shape[-1], c.k_state).decode(c.k_codes)
        vd = self._codec(c.v_spec, c.v_shape[-1], c.v_state).decode(c.v_codes)
        kd, vd = kd.reshape(c.k_shape), vd.reshape(c.v_shape)
        if c.torch:
            if _arrays.torch_module() is None:
                raise TypeError("this CompressedKV was made from tensors: import torch first")
            kind = _arrays.Kind(True, c.dtype if dtype is None else dtype)
            return kind.wrap(kd), kind.wrap(vd)
        if dtype is not None and np.dtype(dtype) != np.float32:
            kd, vd = kd.astype(dtype), vd.astype(dtype)
        return kd, vd


TurboQuantCompressor = KVCompressor


class AdaptiveKVCache:
    """A budgeted, compressed KV cache with utility-based eviction (the
    prototype's adaptive cache) on top of KVCache.

    AdaptiveKVCache(heads, head_dim, budget, layers=1, q_heads=None,
                    k_codec="int8", v_codec="tq3", policy="utility", sinks=4,
                    protect_recent=None, max_tokens=1 << 20, lib=None, **options)

    heads are KV heads; q_heads (default heads) are the query heads of the
    attention weights and queries. protect_recent (the newest tokens that
    are never evicted) defaults to min(128, budget // 4); when sinks +
    protect_recent exceed the budget, the protected window (then the sinks)
    shrink to fit, so the effective budget per layer is min(budget,
    max_tokens) (stats() reports it). Other KVCache options (page,
    recent_window, k_layout, threads, ...) pass through **options.

    Layouts (heads first, as in the prototypes): keys/values
    (heads, new_tokens, head_dim), a leading batch axis of 1 allowed, or
    (heads, head_dim) for one token; queries (q_heads, n_queries, head_dim)
    or (q_heads, head_dim). numpy arrays or CPU torch tensors; get_kv and
    attend answer in the type of the last key given to update.

    update(key, value, attention_weights) is for callers that compute
    attention themselves: the weights are those of the new queries over the
    layer's tokens after the append (the kept tokens in position order, the
    new ones last), per query head or per KV head:
        (heads, n_tokens)                one query (a decode step)
        (heads, n_queries, n_tokens)     several queries (a prefill chunk)
        (1, heads, n_queries, n_tokens)  with a batch axis of 1
    They update each token's utility as kvq's own attention would (EMA:
    0.9 old + 0.1 new, a new token starts at 1.0) through
    kvq_cache_observe_attention, which then evicts the lowest-utility
    tokens outside the sinks and the protected recent window down to the
    budget. update(key, value, query=q) instead lets kvq attend with q and
    returns the output; the weights kvq computes then drive eviction.
    Without either, the budget is applied at once (the new tokens may go
    too, as in a prefill compressed without attention).
    """

    def __init__(self, heads, head_dim, budget, layers=1, q_heads=None, k_codec="int8",
                 v_codec="tq3", policy="utility", sinks=4, protect_recent=None,
                 max_tokens=1 << 20, lib=None, **options):
        if protect_recent is None:
            protect_recent = min(128, int(budget) // 4)
        self.heads = int(heads)
        self.head_dim = int(head_dim)
        self.q_heads = int(q_heads) if q_heads is not None else self.heads
        self.layers = int(layers)
        self.budget = int(budget)
        self.effective_budget = min(self.budget, int(max_tokens))
        self.cache = KVCache(layers=self.layers, kv_heads=self.heads, q_heads=self.q_heads,
                             head_dim=self.head_dim, max_tokens=max_tokens, k_codec=k_codec,
                             v_codec=v_codec, policy=policy, budget=self.budget, sinks=sinks,
                             protect_recent=protect_recent, lib=lib, **options)
        self._next_pos = [0] * self.layers
        self._kind = _arrays.NUMPY
        self.attention_updates = 0
        self.observed_weights = 0

    def _tokens_major(self, x, what):
        """(heads, n, d) / (1, heads, n, d) / (heads, d) -> [n, heads, d]."""
        x, kind = _arrays.floats(x, what, "AdaptiveKVCache.update")
        if x.ndim == 4 and x.shape[0] == 1:
            x = x[0]
        if x.ndim == 2:
            x = x[:, None, :]
        if x.ndim != 3 or x.shape[0] != self.heads or x.shape[2] != self.head_dim:
            raise KvqShapeError("%s must have shape (%d heads, new_tokens, %d), got %s" %
                                (what, self.heads, self.head_dim, x.shape), "AdaptiveKVCache")
        return np.ascontiguousarray(x.transpose(1, 0, 2)), kind

    def _weights(self, attention_weights, layer, n_after):
        """The weights as (rows [heads, n_after], n_queries), checked before
        anything is appended (the C call checks them again)."""
        where = "AdaptiveKVCache.update"
        w, _ = _arrays.floats(attention_weights, "attention_weights", where)
        if w.ndim == 4 and w.shape[0] == 1:
            w = w[0]
        if w.ndim == 3:
            nq = w.shape[1]
            w = w.sum(axis=1, dtype=np.float32)
        elif w.ndim == 2:
            nq = 1
        else:
            nq = 0
        if nq == 0 or w.shape[0] not in (self.q_heads, self.heads) or w.shape[1] != n_after:
            raise KvqShapeError(
                "attention_weights must have shape ([1,] heads, [n_queries,] %d): %d query heads "
                "or %d KV heads, over the %d tokens layer %d holds after the append (position "
                "order, new tokens last); got %s" % (n_after, self.q_heads, self.heads, n_after,
                                                     layer, np.shape(attention_weights)), where)
        if not np.all(np.isfinite(w)):
            raise _lib.KvqError(_lib.Status.ERR_NONFINITE,
                                self.cache.lib.strerror(_lib.Status.ERR_NONFINITE),
                                "attention_weights contain NaN or Inf", where)
        group = 1 if w.shape[0] == self.q_heads else self.q_heads // self.heads
        # the bound of kvq_cache_observe_attention: softmax rows of nq queries
        # (x the group for KV-head rows), with 1/32 for the engine's rounding
        if w.size and (w.min() < 0 or
                       w.sum(axis=1, dtype=np.float64).max() > nq * group * (1 + 1 / 32)):
            raise _lib.KvqError(_lib.Status.ERR_RANGE, self.cache.lib.strerror(
                _lib.Status.ERR_RANGE), "attention_weights must be softmax probabilities (>= 0, "
                "each query's row summing to at most 1)", where)
        return np.ascontiguousarray(w), nq

    def update(self, key, value, attention_weights=None, layer=0, query=None,
               query_position=None, positions=None):
        """Appends key/value (heads, new_tokens, head_dim) to layer, then
        evicts down to the budget by utility: with attention_weights
        (computed by the caller; see the class docstring) through them, or
        with query (q_heads, [n_queries,] head_dim) by attending with it at
        query_position (default: the newest position) and returning the
        output (q_heads, [n_queries,] head_dim). Returns None otherwise.
        Everything is checked before the append: on error the cache is
        unchanged."""
        where = "AdaptiveKVCache.update"
        if attention_weights is not None and query is not None:
            raise TypeError("%s: give attention_weights (attention you computed) or query "
                            "(kvq attends), not both" % where)
        layer = _index(layer, "layer", where)
        if not 0 <= layer < self.layers:
            raise KvqShapeError("layer %r is outside 0..%d" % (layer, self.layers - 1), where)
        k, kind = self._tokens_major(key, "key")
        v, _ = self._tokens_major(value, "value")
        if k.shape != v.shape:
            raise KvqShapeError("key and value shapes differ: %s vs %s" % (k.shape, v.shape),
                                where)
        n = k.shape[0]
        if positions is None:
            pos = np.arange(self._next_pos[layer], self._next_pos[layer] + n, dtype=np.int64)
        else:
            pos, _ = _arrays.ints(positions, "positions", where)
            pos = pos.reshape(-1)
        w = None
        if attention_weights is not None:
            w, nq = self._weights(attention_weights, layer, self.cache.tokens(layer) + n)
        self.cache.append(layer, k, v, pos)
        self._kind = kind
        if n:
            self._next_pos[layer] = int(pos[-1]) + 1
        if w is not None:
            self.cache.observe_attention(layer, w, nq)
            self.attention_updates += 1
            self.observed_weights += 1
            return None
        if query is None:
            self.cache.set_budget(self.effective_budget)  # no attention will do it
            return None
        qp = self._next_pos[layer] - 1 if query_position is None else query_position
        return self.attend(query, layer, qp)

    def attend(self, query, layer=0, position=None):
        """Attention of query (q_heads, [n_queries,] head_dim) at position
        (default: the newest) over the layer; updates the utility scores.
        The output has the query's type."""
        q, kind = _arrays.floats(query, "query", "AdaptiveKVCache.attend")
        single = q.ndim == 2
        if single:
            q = q[:, None, :]
        if q.ndim != 3 or q.shape[0] != self.q_heads or q.shape[2] != self.head_dim:
            raise KvqShapeError("query must have shape (%d q_heads, [n_queries,] %d), got %s" %
                                (self.q_heads, self.head_dim, np.shape(query)),
                                "AdaptiveKVCache.attend")
        if position is None:
            position = self._next_pos[layer] - 1
        out = self.cache.attend(layer, np.ascontiguousarray(q.transpose(1, 0, 2)), position)
        self.attention_updates += 1
        out = out.transpose(1, 0, 2)
        return kind.wrap(np.ascontiguousarray(out[:, 0] if single else out))

    def get_kv(self, layer=0):
        """(k, v) of the tokens kept, decoded: each (heads, n_tokens, head_dim),
        in ascending position order (see positions()), in the type of the
        last key given to update."""
        k, v = self.cache.get_kv(layer)
        k = np.ascontiguousarray(k.transpose(1, 0, 2))
        v = np.ascontiguousarray(v.transpose(1, 0, 2))
        return self._kind.wrap(k), self._kind.wrap(v)

    def positions(self, layer=0):
        return self._kind.wrap_raw(self.cache.positions(layer))

    def tokens(self, layer=0):
        """Tokens the layer holds now."""
        return self.cache.tokens(layer)

    def __len__(self):
        """Tokens stored per layer: what each layer holds once a step has
        updated every layer (at most the effective budget after eviction).
        Between the layers' updates of one step they differ, and len() is
        the most any layer holds; stats()["tokens"] is the total over the
        layers (len() x layers between steps)."""
        return max(self.cache.tokens(layer) for layer in range(self.layers))

    def stats(self, layer=-1):
        """The cache's kvq_stats (layer=-1: the total over the layers) plus:

        effective_budget   tokens kept per layer, min(budget, max_tokens)
        fp16_bytes         the kept tokens' K and V as plain fp16 arrays:
                           (tokens - tokens_cold) x heads x head_dim x 2 x 2 bytes
                           (fp32_bytes: the same in fp32)
        ratio_vs_fp16      fp16_bytes / stored_bytes: how many times smaller
                           than plain fp16 the cache is, every byte it has
                           allocated counted (codes with their scales, the
                           f16 staging of tokens not yet encoded, unfilled
                           page slots and holes left by eviction, page
                           tables and per-slot positions and scores). Tokens
                           an update gave neither weights nor a query stay
                           staged in f16 until the next attend encodes them,
                           so the ratio is below 1 until then. The fixed
                           bytes do not shrink with the budget, so at a
                           small budget the ratio is low, below 1 when they
                           exceed what the codecs save (int8 keys and tq3
                           values, budget 16, pages of 16: 0.6 to 0.8 at 2
                           heads x head_dim 16, where 1952 bytes of tables
                           stand beside 832 of codes; 1.2 at 4 x 64)
        asymptotic_ratio_vs_fp16
                           16 / asymptotic_bits_per_value: the same ratio for
                           a long sequence's tokens in full pages, payload
                           only (what ratio_vs_fp16 approaches as the budget
                           grows; int8 keys with tq3 values at head_dim 128:
                           2.84)
        attention_updates  attends and observed weights
        observed_weights   updates whose weights drove eviction
        """
        s = self.cache.stats(layer)
        values = (s["tokens"] - s["tokens_cold"]) * self.heads * self.head_dim * 2
        s["effective_budget"] = self.effective_budget
        s["fp16_bytes"] = values * 2
        s["fp32_bytes"] = values * 4
        s["ratio_vs_fp16"] = s["fp16_bytes"] / s["stored_bytes"] if s["stored_bytes"] else 0.0
        asym = s["asymptotic_bits_per_value"]
        s["asymptotic_ratio_vs_fp16"] = 16.0 / asym if asym else 0.0
        s["attention_updates"] = self.attention_updates
        s["observed_weights"] = self.observed_weights
        return s

    def close(self):
        self.cache.close()
