"""Array arguments of the binding: numpy arrays and CPU torch tensors in,
the caller's type out.

Every entry point turns its array arguments into C-contiguous numpy arrays
through the functions here, which check the dtype instead of casting:

  floats(x)  K/V, queries, weights, samples: numpy float32 arrays (any
             other dtype, float64 and float16 included, raises TypeError
             naming it and the fix, x.astype(numpy.float32): kvq casts no
             array), CPU torch tensors of float32, float16 or bfloat16 (a
             torch model's own dtypes: converted, results in the same
             dtype), or a list of Python floats (no dtype to keep: made
             float32). Integer, bool and complex data raise TypeError in
             every form (kvq never turns codes or token ids into values).
  codes(b)   encoded bytes: numpy or torch uint8, bytes, bytearray,
             memoryview. Anything else raises TypeError (a float array is
             not encoded data; int values above 255 would wrap).
  ints(x)    positions, token ids: integer arrays or tensors, Python ints.
             Floats and bools raise TypeError.

No copy is made when the data already is C-contiguous float32 (or uint8
for codes), numpy or torch: the C call reads the caller's buffer (a torch
tensor's data_ptr()). float32 that is not C-contiguous (a transpose, a
slice with steps) is made contiguous once; float16 and bfloat16 tensors are
converted to float32 once.

torch is optional: it is never imported here. A tensor can only come from a
program that imported torch, so sys.modules tells whether one may be given.
Tensors must be on the CPU (a CUDA tensor raises TypeError naming .cpu()).

The returned Kind wraps results: torch in, torch out (float results in the
input's dtype, sharing memory with the float32 result when that is the
dtype); numpy in, numpy out (float32).
"""

import sys

import numpy as np

__all__ = ["Kind", "NUMPY", "floats", "codes", "ints", "is_tensor", "torch_module"]


def torch_module():
    """The torch module when the program imported it, else None."""
    return sys.modules.get("torch")


def is_tensor(x):
    t = torch_module()
    return t is not None and isinstance(x, t.Tensor)


class Kind:
    """How to hand a result back: numpy, or torch with the input's float
    dtype (None: float32)."""

    __slots__ = ("torch", "dtype")

    def __init__(self, torch=False, dtype=None):
        self.torch = torch
        self.dtype = dtype

    def wrap(self, a):
        """A float32 numpy result in the caller's type."""
        if not self.torch:
            return a
        t = torch_module().from_numpy(a)
        if self.dtype is not None and self.dtype != t.dtype:
            t = t.to(self.dtype)
        return t

    def wrap_raw(self, a):
        """A result whose dtype stays as it is (uint8 codes, int positions)."""
        return torch_module().from_numpy(a) if self.torch else a

    def __repr__(self):
        return "Kind(torch, %s)" % self.dtype if self.torch else "Kind(numpy)"


NUMPY = Kind()


def _where(where, what):
    return "%s: %s" % (where, what) if where else what


def _cpu_tensor(t, what, where):
    if t.device.type != "cpu":
        raise TypeError(_where(where, "%s is a tensor on %s; kvq works on CPU memory: pass "
                                      "%s.cpu()" % (what, t.device, what)))
    if t.layout != torch_module().strided:
        raise TypeError(_where(where, "%s is a %s tensor: pass %s.to_dense()"
                                      % (what, t.layout, what)))
    return t.detach()


def floats(x, what="x", where=""):
    """(float32 C-contiguous numpy array, Kind) for a float32 array, a float
    tensor or a list of floats; no copy for C-contiguous float32 input. Any
    other numpy dtype raises TypeError (nothing is cast)."""
    if is_tensor(x):
        torch = torch_module()
        t = _cpu_tensor(x, what, where)
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(_where(where, "%s must be a float32, float16 or bfloat16 tensor, got "
                                          "%s: convert it with %s.float()" % (what, t.dtype, what)))
        dtype = t.dtype
        if dtype != torch.float32:
            t = t.to(torch.float32)
        t = t.contiguous()  # the same tensor when it already is
        return t.numpy(), Kind(True, dtype)
    if isinstance(x, (bytes, bytearray, memoryview, str)):
        raise TypeError(_where(where, "%s must be floats, got %s" % (what, type(x).__name__)))
    if isinstance(x, (np.ndarray, np.generic)):
        if x.dtype != np.float32:
            kind = {"i": "integer", "u": "integer", "b": "bool", "c": "complex"}.get(x.dtype.kind)
            raise TypeError(_where(where, "%s must be a float32 array, got %s%s: convert it with "
                                          "%s.astype(numpy.float32) (kvq casts no array)"
                                   % (what, x.dtype, " (%s data)" % kind if kind else "", what)))
        return np.ascontiguousarray(x), NUMPY
    a = np.asarray(x)  # a list (of lists) of numbers: no dtype of its own
    if a.dtype.kind != "f":
        raise TypeError(_where(where, "%s must be float32 values, got %s (%s): kvq does not turn "
                                      "them into floats" % (what, type(x).__name__, a.dtype)))
    return np.ascontiguousarray(a, dtype=np.float32), NUMPY


def codes(b, what="encoded data", where=""):
    """(uint8 C-contiguous numpy array, Kind) for encoded bytes."""
    if isinstance(b, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(b), dtype=np.uint8), NUMPY
    if is_tensor(b):
        torch = torch_module()
        t = _cpu_tensor(b, what, where)
        if t.dtype != torch.uint8:
            raise TypeError(_where(where, "%s must be uint8 (the bytes Codec.encode returns), "
                                          "got a %s tensor" % (what, t.dtype)))
        return t.contiguous().numpy(), Kind(True, None)
    a = b if isinstance(b, np.ndarray) else np.asarray(b)
    if a.dtype != np.uint8:
        raise TypeError(_where(where, "%s must be uint8 (the bytes Codec.encode returns) or "
                                      "bytes, got %s" % (what, a.dtype)))
    return np.ascontiguousarray(a), NUMPY


def ints(x, what="positions", where=""):
    """(int64 numpy array, Kind) for integer data (positions, token ids)."""
    if is_tensor(x):
        torch = torch_module()
        t = _cpu_tensor(x, what, where)
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(_where(where, "%s must be integers, got a %s tensor"
                                          % (what, t.dtype)))
        return t.to(torch.int64).numpy(), Kind(True, None)
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(_where(where, "%s must be integers, got %s" % (what, a.dtype)))
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(_where(where, "%s: %d does not fit in int64" % (what, a.max())))
    return a.astype(np.int64, copy=False), NUMPY
