"""kvq.KVCache: the compressed, paged KV cache of libkvq (kvq_cache) on
numpy arrays and CPU torch tensors.

Shapes follow the C API: keys/values are [n_tokens, kv_heads, head_dim] per
layer, queries and attention outputs [n_queries, q_heads, head_dim]. Query
head qh belongs to KV head qh // (q_heads // kv_heads) (grouped-query
attention). Attention is computed by the library directly over the encoded
pages: softmax(q.K^T / sqrt(head_dim)).V over the keys whose position is <=
the query's position.

Ownership and threads: the KVCache owns the kvq_cache handle (close() or
garbage collection frees it) and the err_msg buffer the C cache keeps using
for later codec errors (set_precision). Mutating calls (append, attend,
set_precision, set_budget, set_threads) must not run concurrently on one cache.
"""

import ctypes
import json
import operator

import numpy as np

from . import _arrays, _lib
from ._lib import KvqShapeError
from .codec import Codec, ptr

__all__ = ["KVCache"]


def _spec_of(codec):
    return codec.spec if isinstance(codec, Codec) else str(codec)


def _index(x, what, where):
    """An int argument (a layer, a head): ints and numpy/torch integer
    scalars; floats and bools raise TypeError."""
    if isinstance(x, bool):
        raise TypeError("%s: %s must be an int, got %r" % (where, what, x))
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError("%s: %s must be an int, got %r" % (where, what, x)) from None


def _result_kind(as_torch):
    """The Kind of results asked for with as_torch (False, True or a torch
    dtype)."""
    if as_torch is False or as_torch is None:
        return _arrays.NUMPY
    if _arrays.torch_module() is None:
        raise TypeError("as_torch needs torch: import torch first")
    return _arrays.Kind(True, None if as_torch is True else as_torch)


def _positions(p, n, what, where):
    """int32 positions for n tokens/queries (one int for all queries of
    attend is expanded by the caller)."""
    pos, _ = _arrays.ints(p, what, where)
    pos = pos.reshape(-1)
    if pos.shape[0] != n:
        raise KvqShapeError("%s has %d entries for %d" % (what, pos.shape[0], n), where)
    if pos.size and (pos.min() < 0 or pos.max() >= 2**31 - 1):
        raise KvqShapeError("%s must be in 0..2^31-2" % what, where)
    return np.ascontiguousarray(pos, dtype=np.int32)


class KVCache(_lib.Handle):
    """A kvq_cache over numpy arrays.

    KVCache(layers, kv_heads, head_dim, max_tokens, q_heads=None, k_codec="f16",
            v_codec="f16", overrides=None, page=16, recent_window=0, sinks=4,
            policy="none", budget=0, budget_ratio=0.0, protect_recent=128,
            k_layout="token", k_prerope=False, rope_theta=10000.0, rope_dims=0,
            k_center=False, k_center_values=None, threads=1, isa="auto", lib=None)

    Every option left at None (or not given) takes the library default of
    kvq_cache_config_init; the defaults shown are those. q_heads defaults to
    kv_heads. policy: "none", "window", "fifo", "utility"; k_layout: "token",
    "channel". budget (tokens per layer) is raised by the library to at least
    sinks + protect_recent. Codecs are spec strings or Codec objects (a
    Codec's spec is used; one with fitted state passes that state along as
    an override).

    overrides: a list of per-layer / per-KV-head codecs, each a dict
      {"codec": spec or Codec, "layer": -1, "head": -1, "values": False,
       "state": bytes or None}
    or a tuple (layer, head, values, codec[, state]); -1 means all.
    """

    _free = "kvq_cache_free"

    def __init__(self, layers, kv_heads, head_dim, max_tokens, q_heads=None, k_codec=None,
                 v_codec=None, overrides=None, page=None, recent_window=None, sinks=None,
                 policy=None, budget=None, budget_ratio=None, protect_recent=None, k_layout=None,
                 k_prerope=None, rope_theta=None, rope_dims=None, k_center=None,
                 k_center_values=None, threads=None, isa=None, lib=None):
        self._h = None
        self.lib = _lib.load(lib)
        cfg = _lib.kvq_cache_config()
        self.lib.kvq_cache_config_init(ctypes.byref(cfg))
        keep = []  # objects whose memory cfg points at until create returns

        def setnum(field, value, conv=int):
            if value is not None:
                if conv is int and (isinstance(value, float) or int(value) < 0):
                    raise KvqShapeError("%s must be a non-negative int, got %r" % (field, value),
                                        "KVCache")
                # ctypes would keep the low 64 bits of a larger int (2**64 + 1
                # layers would become 1); kvq_cache_create checks the limits
                if conv is int and int(value) >= 2**64:
                    raise KvqShapeError("%s must be below 2^64, got %r" % (field, value),
                                        "KVCache")
                setattr(cfg, field, conv(value))

        setnum("n_layers", layers)
        setnum("n_kv_heads", kv_heads)
        setnum("n_q_heads", kv_heads if q_heads is None else q_heads)
        setnum("head_dim", head_dim)
        setnum("max_tokens", max_tokens)
        setnum("page_tokens", page)
        setnum("recent_window", recent_window)
        setnum("sinks", sinks)
        setnum("budget_tokens", budget)
        setnum("budget_ratio", budget_ratio, float)
        setnum("protect_recent", protect_recent)
        setnum("rope_theta", rope_theta, float)
        setnum("rope_dims", rope_dims)
        setnum("n_threads", threads)
        if k_prerope is not None:
            cfg.k_prerope = int(bool(k_prerope))
        if k_center is not None:
            cfg.k_center = int(bool(k_center))
        if policy is not None:
            cfg.policy = self._enum(_lib.POLICY, policy, "policy")
        if k_layout is not None:
            cfg.k_layout = self._enum(_lib.LAYOUT, k_layout, "k_layout")
        if isa is not None:
            cfg.isa = _lib.isa_code(isa)

        ov = [] if overrides is None else list(overrides)
        for codec, is_value in ((k_codec, 0), (v_codec, 1)):
            if codec is None:
                continue
            spec = _spec_of(codec).encode()
            keep.append(spec)
            if is_value:
                cfg.v_codec = spec
            else:
                cfg.k_codec = spec
            if isinstance(codec, Codec) and codec.state_bytes:
                # the fitted state travels as an override that covers every head
                ov.insert(0, {"codec": codec, "values": bool(is_value)})
        if ov:
            arr = (_lib.kvq_codec_override * len(ov))()
            for i, o in enumerate(ov):
                o = self._override(o)
                spec = _spec_of(o["codec"]).encode()
                state = o.get("state")
                if state is None and isinstance(o["codec"], Codec) and o["codec"].state_bytes:
                    state = o["codec"].save_state()
                keep.append(spec)
                for key in ("layer", "head"):
                    x = o.get(key, -1)
                    # a C int: 2**32 would wrap to layer 0
                    if isinstance(x, float) or not -2**31 <= int(x) < 2**31:
                        raise KvqShapeError("override %d: %s must be an int in -1..2^31-1, got %r"
                                            % (i, key, x), "KVCache")
                arr[i].layer = int(o.get("layer", -1))
                arr[i].kv_head = int(o.get("head", -1))
                arr[i].is_value = int(bool(o.get("values", False)))
                arr[i].codec = spec
                if state:
                    sbuf = ctypes.create_string_buffer(bytes(state), len(state))
                    keep.append(sbuf)
                    arr[i].state = ctypes.addressof(sbuf)
                    arr[i].state_size = len(state)
            keep.append(arr)
            cfg.overrides = ctypes.cast(arr, ctypes.POINTER(_lib.kvq_codec_override))
            cfg.n_overrides = len(ov)
        if k_center_values is not None:
            cv, _ = _arrays.floats(k_center_values, "k_center_values", "KVCache")
            want = (int(layers), int(kv_heads), int(head_dim))
            if cv.shape != want:
                raise KvqShapeError("k_center_values must have shape %s, got %s" % (want, cv.shape),
                                    "KVCache")
            keep.append(cv)
            cfg.k_center_values = cv.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            if k_center is None:
                cfg.k_center = 1
        # the C cache keeps this pointer (set_precision reports codec errors
        # through it), so the buffer lives as long as the cache
        self._err, cfg.err_msg = _lib.err_buffer()
        cfg.err_msg_size = _lib.ERR_MSG_SIZE
        h = ctypes.c_void_p()
        st = self.lib.kvq_cache_create(ctypes.byref(h), ctypes.byref(cfg))
        self.lib.check(st, "kvq_cache_create", _lib.err_text(self._err))
        del keep
        self._h = h.value
        self.layers = cfg.n_layers
        self.kv_heads = cfg.n_kv_heads
        self.q_heads = cfg.n_q_heads
        self.head_dim = cfg.head_dim
        self.max_tokens = cfg.max_tokens

    @staticmethod
    def _enum(table, value, what):
        if isinstance(value, int) and value in table.values():
            return value
        try:
            return table[str(value).lower()]
        except KeyError:
            raise KvqShapeError("unknown %s %r (one of %s)" % (what, value, ", ".join(table)),
                                "KVCache") from None

    @staticmethod
    def _override(o):
        if isinstance(o, dict):
            if "codec" not in o:
                raise KvqShapeError("an override needs a 'codec'", "KVCache")
            return o
        o = tuple(o)
        if len(o) not in (4, 5):
            raise KvqShapeError("an override tuple is (layer, head, values, codec[, state])",
                                "KVCache")
        d = {"layer": o[0], "head": o[1], "values": o[2], "codec": o[3]}
        if len(o) == 5:
            d["state"] = o[4]
        return d

    @property
    def handle(self):
        if self._h is None:
            raise ValueError("cache is closed")
        return self._h

    def __repr__(self):
        return "KVCache(layers=%d, kv_heads=%d, q_heads=%d, head_dim=%d, max_tokens=%d)" % (
            self.layers, self.kv_heads, self.q_heads, self.head_dim, self.max_tokens)

    def _check(self, st, where, detail=False):
        # err_msg is only filled by codec creation inside the cache (create,
        # set_precision); other calls never show its possibly stale text
        text = ""
        if st and detail:
            text = _lib.err_text(self._err) or (self.lib.kvq_cache_last_error(self._h) or b"").decode(
                "utf-8", "replace")
        self.lib.check(st, where, text)

    def _layer(self, layer, where):
        layer = _index(layer, "layer", where)
        if not 0 <= layer < self.layers:
            raise KvqShapeError("layer %r is outside 0..%d" % (layer, self.layers - 1), where)
        return layer

    # ---- append / attend ----
    def append(self, layer, k, v, positions=None):
        """Appends tokens to a layer: k, v [n_tokens, kv_heads, head_dim] (or
        [kv_heads, head_dim] for one token), float arrays or CPU tensors
        (float32 is read in place); positions [n_tokens] strictly increasing
        ints continuing after the last appended one (None: the next
        positions in order). With a policy the layer holds at most its
        budget after the call. On error nothing is stored."""
        where = "KVCache.append"
        layer = self._layer(layer, where)
        k, _ = _arrays.floats(k, "k", where)
        v, _ = _arrays.floats(v, "v", where)
        hd = (self.kv_heads, self.head_dim)
        if k.ndim == 2:
            k = k[None]
        if v.ndim == 2:
            v = v[None]
        if k.ndim != 3 or k.shape[1:] != hd or v.shape != k.shape:
            raise KvqShapeError("k and v must both have shape [n_tokens, %d, %d], got %s and %s" %
                                (hd + (k.shape, v.shape)), where)
        n = k.shape[0]
        if n == 0:
            return
        pp = None
        if positions is not None:
            pos = _positions(positions, n, "positions", where)
            pp = ptr(pos)
        st = self.lib.kvq_cache_append(self.handle, layer, ptr(k), ptr(v), pp, n)
        self._check(st, "kvq_cache_append(layer %d, %d tokens)" % (layer, n))

    def attend(self, layer, q, q_positions, return_token_attention=False):
        """Attention of queries q [n_queries, q_heads, head_dim] (or
        [q_heads, head_dim] for one query) at q_positions (one int per query,
        or one int for all) over the layer's stored tokens.

        Returns out with q's shape (and type: a tensor for a tensor q, in
        its dtype); with return_token_attention also the attention each
        stored token received, summed over the query heads of its KV head's
        group and over the queries: float32 [kv_heads, n_tokens] over the
        tokens stored when the call starts, in ascending position order:
        read positions(layer) before the attend, not after it (an eviction
        the attend makes comes after the attention). Under the utility
        policy every attend updates the eviction scores."""
        where = "KVCache.attend"
        layer = self._layer(layer, where)
        q, kind = _arrays.floats(q, "q", where)
        single = q.ndim == 2
        if single:
            q = q[None]
        if q.ndim != 3 or q.shape[1:] != (self.q_heads, self.head_dim):
            raise KvqShapeError("q must have shape [n_queries, %d, %d], got %s" %
                                (self.q_heads, self.head_dim, q.shape), where)
        n = q.shape[0]
        qp, _ = _arrays.ints(q_positions, "q_positions", where)
        if qp.ndim == 0:
            qp = np.full(n, int(qp), dtype=np.int64)
        qp = qp.reshape(-1)
        if qp.shape[0] != n:
            raise KvqShapeError("q_positions has %d entries for %d queries" % (qp.shape[0], n),
                                where)
        if qp.size and (qp.min() < -2**31 or qp.max() >= 2**31):
            raise KvqShapeError("q_positions must fit in int32", where)
        qp = np.ascontiguousarray(qp, dtype=np.int32)
        out = np.zeros(q.shape, dtype=np.float32)
        ta, tap, tacap = None, None, 0
        if return_token_attention:
            nt = self.tokens(layer)
            ta = np.zeros((self.kv_heads, nt), dtype=np.float32)
            # a zero-size array may have no buffer: give C a real (unused) one
            tbuf = ta if ta.size else np.zeros(1, dtype=np.float32)
            tap, tacap = ptr(tbuf), ta.size
        if n:
            st = self.lib.kvq_cache_attend(self.handle, layer, ptr(q), ptr(qp), n, ptr(out),
                                           out.size, tap, tacap)
            self._check(st, "kvq_cache_attend(layer %d, %d queries)" % (layer, n))
        if single:
            out = out[0]
        out = kind.wrap(out)
        return (out, kind.wrap_raw(ta)) if return_token_attention else out

    def observe_attention(self, layer, weights, n_queries=None):
        """Attention computed outside kvq (FlashAttention, a PyTorch module)
        for the layer's stored tokens, in place of attend: under the utility
        policy it updates the eviction scores as attend would, then evicts
        to the budget and settles staged tokens as an attend that reached
        the newest token does (kvq_cache_observe_attention).

        weights: the softmax weights over the layer's tokens in ascending
        position order (positions(layer); one column per stored token,
        tokens(layer) columns), per query head (q_heads rows) or per KV head
        (kv_heads rows, each summed over its group's query heads), as
          [n_queries, heads, n_tokens]  one slice per query, or
          [heads, n_tokens]             summed over n_queries queries
                                        (n_queries defaults to 1).
        A float array or CPU tensor. Negative weights, NaN/Inf, or rows
        summing to more than n_queries probability distributions can raise
        KvqError; the cache is then unchanged."""
        where = "KVCache.observe_attention"
        layer = self._layer(layer, where)
        w, _ = _arrays.floats(weights, "weights", where)
        nt = self.tokens(layer)
        if w.ndim == 3:
            if n_queries is not None and _index(n_queries, "n_queries", where) != w.shape[0]:
                raise KvqShapeError("weights has %d queries, n_queries says %d"
                                    % (w.shape[0], n_queries), where)
            n_queries = w.shape[0]
            w = np.ascontiguousarray(w.sum(axis=0, dtype=np.float32))
        elif w.ndim == 2:
            n_queries = 1 if n_queries is None else _index(n_queries, "n_queries", where)
        else:
            raise KvqShapeError("weights must have shape [n_queries, heads, %d] or [heads, %d], "
                                "got %s" % (nt, nt, w.shape), where)
        if w.shape[0] not in (self.q_heads, self.kv_heads) or w.shape[1] != nt:
            raise KvqShapeError("weights must have %d (query heads) or %d (KV heads) rows of %d "
                                "(the tokens stored in layer %d), got %s"
                                % (self.q_heads, self.kv_heads, nt, layer, w.shape), where)
        if n_queries <= 0:
            raise KvqShapeError("n_queries must be positive, got %d" % n_queries, where)
        buf = w if w.size else np.zeros(1, dtype=np.float32)
        self._err.value = b""
        st = self.lib.kvq_cache_observe_attention(self.handle, layer, ptr(buf), w.shape[0], nt,
                                                  n_queries)
        self._check(st, "kvq_cache_observe_attention(layer %d, %d queries)" % (layer, n_queries),
                    detail=True)

    # ---- read back ----
    def tokens(self, layer):
        """Tokens stored in a layer now."""
        layer = self._layer(layer, "KVCache.tokens")
        n = ctypes.c_size_t()
        self._check(self.lib.kvq_cache_tokens(self.handle, layer, ctypes.byref(n)),
                    "kvq_cache_tokens")
        return n.value

    def positions(self, layer, as_torch=False):
        """Positions of the stored tokens of a layer, ascending (int32; an
        int32 tensor with as_torch)."""
        layer = self._layer(layer, "KVCache.positions")
        n = self.tokens(layer)
        out = np.zeros(max(n, 1), dtype=np.int32)
        self._check(self.lib.kvq_cache_positions(self.handle, layer, ptr(out), out.size),
                    "kvq_cache_positions")
        return _result_kind(as_torch).wrap_raw(out[:n])

    def get_kv(self, layer, head=-1, first=0, count=None, as_torch=False):
        """Decodes stored tokens first..first+count-1 (ascending position) of
        a layer to float32: returns (k, v), each [count, kv_heads, head_dim]
        for head=-1 or [count, head_dim] for one KV head. Keys come back as
        stored (post-RoPE unless k_prerope) with any centre added back.
        as_torch: float32 tensors, or a torch dtype to convert to (the
        program must have imported torch)."""
        where = "KVCache.get_kv"
        layer = self._layer(layer, where)
        n = self.tokens(layer)
        head = _index(head, "head", where)
        first = _index(first, "first", where)
        if count is None:
            count = max(n - first, 0)
        count = _index(count, "count", where)
        if first < 0 or count < 0:
            raise KvqShapeError("first and count must be non-negative", where)
        nh = self.kv_heads if head < 0 else 1
        k = np.zeros((count, nh, self.head_dim), dtype=np.float32)
        v = np.zeros_like(k)
        scratch = np.zeros(1, dtype=np.float32)
        kp, vp = (ptr(k), ptr(v)) if k.size else (ptr(scratch), ptr(scratch))
        st = self.lib.kvq_cache_get_kv(self.handle, layer, head, first, count, kp, vp, k.size)
        self._check(st, "kvq_cache_get_kv(layer %d, head %d, %d..+%d)" %
                    (layer, head, first, count))
        if head >= 0:
            k, v = k[:, 0], v[:, 0]
        kind = _result_kind(as_torch)
        return kind.wrap(k), kind.wrap(v)

    # ---- precision, budget, stats ----
    def set_precision(self, layer=-1, head=-1, values=False, codec=None):
        """Re-encodes the K (values=False) or V (values=True) codec of a
        layer (-1: all) and KV head (-1: all) with codec (a spec or Codec,
        required); new tokens use it. The arguments are in the order of
        kvq_cache_set_precision(cache, layer, kv_head, is_value, codec):
        set_precision(0, -1, True, "int4") or
        set_precision(layer=0, values=True, codec="int4").
        Returns the added error: sum ||old - new||^2 / sum ||old||^2 over
        the re-encoded vectors."""
        where = "KVCache.set_precision"
        if isinstance(layer, (str, Codec)):
            raise TypeError("%s(layer, head, values, codec): the codec comes last, as in "
                            "kvq_cache_set_precision (got %r as the layer)" % (where, layer))
        layer = _index(layer, "layer", where)
        head = _index(head, "head", where)
        if not isinstance(values, (bool, np.bool_)) and values not in (0, 1):
            raise TypeError("%s: values must be a bool (False: keys, True: values), got %r"
                            % (where, values))
        if codec is None:
            raise TypeError("%s(layer, head, values, codec): no codec given" % where)
        if not isinstance(codec, (str, Codec)):
            raise TypeError("%s: codec must be a spec string or a Codec, got %r" % (where, codec))
        nmse = ctypes.c_double(0.0)
        spec = _spec_of(codec)
        self._err.value = b""
        st = self.lib.kvq_cache_set_precision(self.handle, int(layer), int(head),
                                              int(bool(values)), spec.encode(),
                                              ctypes.byref(nmse))
        self._check(st, "kvq_cache_set_precision(%s, layer %d, head %d, %s)" %
                    (spec, layer, head, "values" if values else "keys"), detail=True)
        return nmse.value

    def set_budget(self, budget):
        """Evicts every layer down to budget tokens now (needs a policy). The
        budget is 1..max_tokens (KvqError with KVQ_ERR_INVALID_ARG otherwise,
        nothing changed)."""
        budget = _index(budget, "budget", "KVCache.set_budget")
        if budget <= 0:
            raise KvqShapeError("budget must be positive, got %d" % budget, "KVCache.set_budget")
        # ctypes would pass the low 64 bits of a larger int
        budget = min(budget, 2**64 - 1)
        self._err.value = b""
        st = self.lib.kvq_cache_set_budget(self.handle, budget)
        self._check(st, "kvq_cache_set_budget(%d)" % budget, detail=True)

    def set_threads(self, n_threads):
        """Sets how many attention threads the next attends use: 1 to the
        n_threads the cache was created with (the output is the same at every
        count)."""
        n = _index(n_threads, "n_threads", "KVCache.set_threads")
        if n <= 0:
            raise KvqShapeError("n_threads must be positive, got %d" % n, "KVCache.set_threads")
        st = self.lib.kvq_cache_set_threads(self.handle, n)
        if st:
            self.lib.check(st, "kvq_cache_set_threads(%d)" % n,
                           (self.lib.kvq_cache_last_error(self.handle) or b"").decode(
                               "utf-8", "replace"))

    def stats(self, layer=-1):
        """Every kvq_stats field as a dict (layer=-1: total over layers)."""
        layer = _index(layer, "layer", "KVCache.stats")
        s = _lib.kvq_stats()
        st = self.lib.kvq_cache_stats(self.handle, layer, ctypes.byref(s))
        self._check(st, "kvq_cache_stats(layer %d)" % layer)
        return s.to_dict()

    def stats_json(self):
        """The library's JSON rendering ({"total": ..., "layers": [...]}) as a str."""
        n = ctypes.c_size_t()
        self._check(self.lib.kvq_cache_stats_json(self.handle, None, 0, ctypes.byref(n)),
                    "kvq_cache_stats_json")
        buf = ctypes.create_string_buffer(n.value + 1)
        self._check(self.lib.kvq_cache_stats_json(self.handle, ctypes.addressof(buf), n.value + 1,
                                                  ctypes.byref(n)), "kvq_cache_stats_json")
        return buf.value.decode()

    def stats_dict(self):
        return json.loads(self.stats_json())

    def config(self):
        """The cache's configuration (kvq_cache_get_config) as a dict; codec
        names and other pointer fields are not reported by the library."""
        cfg = _lib.kvq_cache_config()
        self._check(self.lib.kvq_cache_get_config(self.handle, ctypes.byref(cfg)),
                    "kvq_cache_get_config")
        out = {}
        for name, typ in _lib.kvq_cache_config._fields_:
            if name in ("k_codec", "v_codec", "overrides", "n_overrides", "k_center_values",
                        "allocator", "err_msg", "err_msg_size"):
                continue
            out[name] = getattr(cfg, name)
        inv = {v: k for k, v in _lib.POLICY.items()}
        out["policy"] = inv.get(out["policy"], out["policy"])
        inv = {v: k for k, v in _lib.LAYOUT.items()}
        out["k_layout"] = inv.get(out["k_layout"], out["k_layout"])
        return out
