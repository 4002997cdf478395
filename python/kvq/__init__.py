"""kvq: Python binding of libkvq, the compressed KV cache library.

    import kvq
    c = kvq.Codec("tq3", 128)                  # codecs on arrays [..., head_dim]
    codes = c.encode(x); y = c.decode(codes)
    cache = kvq.KVCache(layers=2, kv_heads=4, q_heads=8, head_dim=64, max_tokens=4096,
                        k_codec="int8", v_codec="tq3", policy="utility", budget=1024)
    cache.append(0, k, v)                      # [n_tokens, kv_heads, head_dim]
    out = cache.attend(0, q, positions)        # [n_queries, q_heads, head_dim]
    cache.observe_attention(0, weights)        # or: attention you computed drives eviction

Arrays are numpy float32 arrays (any other dtype raises TypeError naming it:
nothing is cast, convert with x.astype(numpy.float32)) or CPU torch tensors
(float32 read in place; float16 and bfloat16 converted); results come back
in the caller's type. torch is optional and never imported by the package.

The library is libkvq.so, found (first match wins) at an explicit path
(kvq.load(path), or lib= on the classes), at $KVQ_LIB, at build/libkvq.so of
the clone the package was imported from, or through the system loader
(libkvq.so.0 after `make install`). Failures raise kvq.KvqError with the status
code, the library's message and the library's detailed message.

Needs numpy (Debian: apt-get install python3-numpy) and the standard library.
"""

from ._lib import KvqError, KvqShapeError, Lib, Status, default_library_path, load

__version__ = "0.1.0"
from .cache import KVCache
from .codec import Codec
from .compat import AdaptiveKVCache, CompressedKV, KVCompressor, TurboQuantCompressor
from .model import Model, Tokenizer

__all__ = [
    "AdaptiveKVCache", "Codec", "CompressedKV", "KVCache", "KVCompressor", "KvqError",
    "KvqShapeError", "Lib", "Model", "Status", "Tokenizer", "TurboQuantCompressor", "cpu_supports",
    "default_library_path", "load", "strerror", "version",
]

CODECS = ["f32", "f16", "bf16", "int8", "int4", "int2", "tq1", "tq2", "tq3", "tq4", "tqp2",
          "tqp3", "tqp4", "nuq1", "nuq2", "nuq3", "nuq4", "nuq5", "nuq6", "nuq7", "nuq8"]


def version(lib=None):
    """kvq_version_string() of the loaded library."""
    return load(lib).version


def strerror(status, lib=None):
    return load(lib).strerror(status)


def cpu_supports(isa, lib=None):
    """Whether this CPU (and build) has the path isa ("scalar", "avx2", ...)."""
    return load(lib).cpu_supports(isa)
