"""kvq.Codec: one libkvq codec handle working on numpy arrays and CPU torch
tensors.

A codec turns each vector of head_dim floats into vector_bytes bytes. Arrays
of any leading shape are accepted: the last axis is the vector (head_dim
floats, or vector_bytes bytes once encoded). The fused score and accumulate
calls work on the encoded bytes, exactly as the cache's attention does.
Values are numpy float32 arrays (read in place) or float32, float16 or
bfloat16 tensors, encoded data is uint8 (or bytes); any other dtype
raises TypeError, nothing is cast (see _arrays.py). Results come back as the caller's
type: numpy in, numpy out; torch in, torch out.

Ownership: the Codec owns its kvq_codec handle and frees it in close() (or
when garbage collected). A codec may be shared by threads except while fit()
or load_state() runs (the C contract).
"""

import ctypes

import numpy as np

from . import _arrays, _lib
from ._lib import KvqShapeError

__all__ = ["Codec"]


def ptr(a):
    return a.ctypes.data


def _out_array(out, shape, where):
    """The float32 numpy view of an out= argument (a numpy array or a CPU
    tensor) that C may write into; anything else raises."""
    msg = ("out must be a writeable C-contiguous float32 array or CPU tensor of shape %s"
           % (shape,))
    if _arrays.is_tensor(out):
        torch = _arrays.torch_module()
        if (out.device.type != "cpu" or out.dtype != torch.float32 or tuple(out.shape) != shape
                or not out.is_contiguous() or out.requires_grad):
            raise KvqShapeError(msg, where)
        return out.numpy()
    if (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != shape
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise KvqShapeError(msg, where)
    return out


class Codec(_lib.Handle):
    """A libkvq codec for vectors of head_dim floats.

    Codec(spec, head_dim, isa="auto", lib=None)
      spec     "f32", "f16", "bf16", "int8[:g=G]", "int4", "int2", "tq1".."tq4",
               "tqp2".."tqp4", "nuq1".."nuq8" with options (see kvq.h)
      isa      "auto", "scalar", "avx2" (forces a CPU path)
      lib      a library path or Lib (default: KVQ_LIB, then build/libkvq.so)
    Raises KvqError (status + kvq_strerror + the detailed message) when the
    spec or head_dim is rejected.
    """

    _free = "kvq_codec_free"

    def __init__(self, spec, head_dim, isa="auto", lib=None):
        self._h = None
        self.lib = _lib.load(lib)
        if not isinstance(spec, str):
            raise KvqShapeError("spec must be a str, got %r" % (spec,), "Codec")
        if int(head_dim) != head_dim or head_dim < 0:
            raise KvqShapeError("head_dim must be a non-negative int, got %r" % (head_dim,),
                                "Codec")
        buf, p = _lib.err_buffer()
        params = _lib.kvq_codec_params()
        params.isa = _lib.isa_code(isa)
        params.err_msg = p
        params.err_msg_size = _lib.ERR_MSG_SIZE
        h = ctypes.c_void_p()
        st = self.lib.kvq_codec_create(ctypes.byref(h), spec.encode(), int(head_dim),
                                       ctypes.byref(params))
        self.lib.check(st, "kvq_codec_create(%r, %d)" % (spec, head_dim), _lib.err_text(buf))
        self._h = h.value
        self.head_dim = int(head_dim)
        self.vector_bytes = int(self.lib.kvq_codec_vector_bytes(self._h))
        self.spec = self.lib.kvq_codec_spec(self._h).decode()

    def __repr__(self):
        return "Codec(%r, %d: %d bytes/vector, %.4g bits/value)" % (
            self.spec, self.head_dim, self.vector_bytes, self.bits_per_value)

    @property
    def handle(self):
        if self._h is None:
            raise ValueError("codec is closed")
        return self._h

    # ---- properties ----
    @property
    def bits_per_value(self):
        return float(self.lib.kvq_codec_bits_per_value(self.handle))

    @property
    def state_bytes(self):
        """Bytes of codec state (fitted nuq tables); 0 for stateless codecs."""
        return int(self.lib.kvq_codec_state_bytes(self.handle))

    @property
    def needs_fit(self):
        return bool(self.lib.kvq_codec_needs_fit(self.handle))

    @property
    def isa(self):
        return self.lib.isa_name(self.lib.kvq_codec_isa(self.handle))

    def encoded_size(self, n_vectors):
        return n_vectors * self.vector_bytes

    # ---- shape helpers ----
    def _vectors(self, x, what, where):
        """(float32 array [..., head_dim], Kind of the caller)"""
        x, kind = _arrays.floats(x, what, where)
        if x.ndim == 0 or x.shape[-1] != self.head_dim:
            raise KvqShapeError("%s must have shape [..., %d], got %s" %
                                (what, self.head_dim, x.shape), where)
        return x, kind

    def _codes(self, b, what, where):
        b, _ = _arrays.codes(b, what, where)
        if b.ndim == 0:
            raise KvqShapeError("%s must be an array of encoded bytes" % what, where)
        # a flat buffer of several whole vectors becomes [n, vector_bytes]
        if b.ndim == 1 and b.shape[0] != self.vector_bytes:
            if b.shape[0] % self.vector_bytes:
                raise KvqShapeError("%s: %d bytes is not a whole number of %d-byte vectors" %
                                    (what, b.shape[0], self.vector_bytes), where)
            b = b.reshape(-1, self.vector_bytes)
        if b.shape[-1] != self.vector_bytes:
            raise KvqShapeError("%s must have shape [..., %d] (vector_bytes), got %s" %
                                (what, self.vector_bytes, b.shape), where)
        return b

    # ---- encode / decode ----
    def encode(self, x):
        """x [..., head_dim] floats -> uint8 [..., vector_bytes] (a uint8
        tensor for a tensor x). NaN/Inf raise KvqError(KVQ_ERR_NONFINITE)."""
        x, kind = self._vectors(x, "x", "Codec.encode")
        n = x.size // self.head_dim
        out = np.empty(x.shape[:-1] + (self.vector_bytes,), dtype=np.uint8)
        if n:
            st = self.lib.kvq_codec_encode(self.handle, ptr(out), out.nbytes, ptr(x), n)
            self.lib.check(st, "kvq_codec_encode(%s)" % self.spec)
        return kind.wrap_raw(out)

    def decode(self, b, dtype=None):
        """uint8 [..., vector_bytes] (or a bytes object holding whole vectors)
        -> float32 [..., head_dim]; a uint8 tensor gives a float32 tensor
        (dtype: a torch dtype for another float type). Other dtypes raise
        TypeError."""
        is_t = _arrays.is_tensor(b)
        b = self._codes(b, "encoded data", "Codec.decode")
        out = np.empty(b.shape[:-1] + (self.head_dim,), dtype=np.float32)
        if b.size:
            st = self.lib.kvq_codec_decode(self.handle, ptr(out), out.size, ptr(b), b.nbytes)
            self.lib.check(st, "kvq_codec_decode(%s)" % self.spec)
        if is_t:
            return _arrays.Kind(True, dtype).wrap(out)
        return out if dtype is None else out.astype(dtype)

    def roundtrip(self, x):
        return self.decode(self.encode(x))

    # ---- fused kernels ----
    def score(self, q, enc):
        """Inner products <q_i, k_j> on the encoded keys: q [..., head_dim],
        enc [..., vector_bytes] -> float32 q.shape[:-1] + enc.shape[:-1]."""
        q, kind = self._vectors(q, "q", "Codec.score")
        enc = self._codes(enc, "keys", "Codec.score")
        nq = q.size // self.head_dim
        nk = enc.size // self.vector_bytes
        out = np.zeros(q.shape[:-1] + enc.shape[:-1], dtype=np.float32)
        if nq and nk:
            st = self.lib.kvq_codec_score(self.handle, ptr(out), out.size, ptr(q), nq, ptr(enc),
                                          enc.nbytes)
            self.lib.check(st, "kvq_codec_score(%s)" % self.spec)
        return kind.wrap(out)

    def accumulate(self, w, enc, out=None):
        """Weighted sum of the encoded values: w [..., n_vals] weights over
        enc [n_vals, vector_bytes] (any leading shape, flattened) ->
        float32 w.shape[:-1] + (head_dim,) (w's type). With out (float32,
        C-contiguous, that shape: a numpy array or a CPU tensor) the sum is
        added to out in place, as the C call does, and out is returned."""
        where = "Codec.accumulate"
        enc = self._codes(enc, "values", where)
        nv = enc.size // self.vector_bytes
        w, kind = _arrays.floats(w, "w", where)
        if w.ndim == 0 or w.shape[-1] != nv:
            raise KvqShapeError("w must have shape [..., %d] (one weight per encoded value), "
                                "got %s" % (nv, w.shape), where)
        shape = w.shape[:-1] + (self.head_dim,)
        given = out
        if out is None:
            out = np.zeros(shape, dtype=np.float32)
        else:
            out = _out_array(out, shape, where)
        nq = w.size // nv if nv else int(np.prod(w.shape[:-1]))
        if nq and nv:
            st = self.lib.kvq_codec_accumulate(self.handle, ptr(out), out.size, ptr(w), nq,
                                               ptr(enc), enc.nbytes)
            self.lib.check(st, "kvq_codec_accumulate(%s)" % self.spec)
        return given if given is not None else kind.wrap(out)

    # ---- state ----
    def fit(self, samples):
        """Fits codec state (nuq tables, a norm=8 range) from sample vectors
        [..., head_dim]; a no-op for codecs without state."""
        x, _ = self._vectors(samples, "samples", "Codec.fit")
        n = x.size // self.head_dim
        st = self.lib.kvq_codec_fit(self.handle, ptr(x), n)
        self.lib.check(st, "kvq_codec_fit(%s)" % self.spec)
        return self

    def save_state(self):
        """The codec state blob (magic, version, spec, head_dim, payload,
        CRC32C) as bytes."""
        n = ctypes.c_size_t()
        st = self.lib.kvq_codec_save_state(self.handle, None, 0, ctypes.byref(n))
        self.lib.check(st, "kvq_codec_save_state(%s)" % self.spec)
        buf = ctypes.create_string_buffer(n.value)
        st = self.lib.kvq_codec_save_state(self.handle, ctypes.addressof(buf), n.value,
                                           ctypes.byref(n))
        self.lib.check(st, "kvq_codec_save_state(%s)" % self.spec)
        return buf.raw[:n.value]

    def load_state(self, blob):
        blob = bytes(blob)
        st = self.lib.kvq_codec_load_state(self.handle, blob, len(blob))
        self.lib.check(st, "kvq_codec_load_state(%s)" % self.spec)
        return self

    def save_file(self, path):
        st = self.lib.kvq_codec_save_file(self.handle, str(path).encode())
        self.lib.check(st, "kvq_codec_save_file(%s)" % path)

    def load_file(self, path):
        st = self.lib.kvq_codec_load_file(self.handle, str(path).encode())
        self.lib.check(st, "kvq_codec_load_file(%s)" % path)
        return self
