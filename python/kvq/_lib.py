"""Loading libkvq and declaring its C API for ctypes.

This module is the only place that knows the C side: the structs mirror
include/kvq.h field by field (order and types must match the header), every
function gets its argtypes/restype, and a failed status becomes a KvqError.
Everything above it (Codec, KVCache, the compat classes) calls through the
Lib object returned by load().

Where the library comes from, first match wins: an explicit path given to
load() (or the lib= argument of the classes), the environment variable
KVQ_LIB, build/libkvq.so of the clone this package was imported from (the
library built from the same sources: an older installed one does not shadow
it), then the system loader (an installed libkvq.so.0: `make install`, then
ldconfig, or LD_LIBRARY_PATH). Lib.path and Lib.found_by say which one was
loaded.
"""

import ctypes
import ctypes.util
import enum
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p)

__all__ = ["Status", "KvqError", "KvqShapeError", "Lib", "load", "default_library_path"]


class Status(enum.IntEnum):
    """kvq_status values (KVQ_ERROR_LIST in kvq.h)."""
    OK = 0
    ERR_INVALID_ARG = -1
    ERR_NOMEM = -2
    ERR_UNKNOWN_CODEC = -3
    ERR_BAD_OPTION = -4
    ERR_HEAD_DIM = -5
    ERR_GROUP = -6
    ERR_DST_TOO_SMALL = -7
    ERR_SRC_SIZE = -8
    ERR_NONFINITE = -9
    ERR_NOT_FITTED = -10
    ERR_CORRUPT = -11
    ERR_VERSION = -12
    ERR_IO = -13
    ERR_ISA = -14
    ERR_UNSUPPORTED = -15
    ERR_FULL = -16
    ERR_ORDER = -17
    ERR_RANGE = -18
    ERR_MISMATCH = -19
    ERR_NOSPACE = -20
    ERR_CONN = -21


class KvqError(Exception):
    """A libkvq call failed.

    status  the kvq_status code (an int; Status(status) names it when known)
    message kvq_strerror(status), the library's text for the code
    detail  the detailed err_msg text creation functions fill ("" if none)
    where   the C function (or binding method) that failed
    """

    def __init__(self, status, message, detail="", where=""):
        self.status = int(status)
        self.message = message
        self.detail = detail or ""
        self.where = where or ""
        try:
            self.name = "KVQ_" + Status(self.status).name
        except ValueError:
            self.name = "status %d" % self.status
        text = "%s (%s)" % (message, self.name)
        if self.detail:
            text += ": " + self.detail
        if self.where:
            text = self.where + ": " + text
        super().__init__(text)


class KvqShapeError(KvqError, ValueError):
    """Arguments rejected by the binding before reaching C (wrong shape or
    size); status is KVQ_ERR_INVALID_ARG. Also a ValueError."""

    def __init__(self, detail, where=""):
        super().__init__(Status.ERR_INVALID_ARG, "invalid argument (shape or size)", detail, where)


# ---- struct mirrors of include/kvq.h -------------------------------------------------------

ALLOC_FN = CFUNCTYPE(c_void_p, c_void_p, c_size_t)
FREE_FN = CFUNCTYPE(None, c_void_p, c_void_p)


class kvq_allocator(Structure):
    _fields_ = [("alloc", ALLOC_FN), ("free", FREE_FN), ("ctx", c_void_p)]


class kvq_codec_params(Structure):
    _fields_ = [
        ("allocator", POINTER(kvq_allocator)),
        ("isa", c_int),
        ("err_msg", POINTER(c_char)),
        ("err_msg_size", c_size_t),
    ]


class kvq_codec_override(Structure):
    _fields_ = [
        ("layer", c_int),
        ("kv_head", c_int),
        ("is_value", c_int),
        ("codec", c_char_p),
        ("state", c_void_p),
        ("state_size", c_size_t),
    ]


class kvq_cache_config(Structure):
    _fields_ = [
        ("n_layers", c_size_t),
        ("n_kv_heads", c_size_t),
        ("n_q_heads", c_size_t),
        ("head_dim", c_size_t),
        ("max_tokens", c_size_t),
        ("k_codec", c_char_p),
        ("v_codec", c_char_p),
        ("overrides", POINTER(kvq_codec_override)),
        ("n_overrides", c_size_t),
        ("page_tokens", c_size_t),
        ("recent_window", c_size_t),
        ("sinks", c_size_t),
        ("policy", c_int),
        ("budget_tokens", c_size_t),
        ("budget_ratio", c_double),
        ("protect_recent", c_size_t),
        ("k_layout", c_int),
        ("k_prerope", c_int),
        ("rope_theta", c_double),
        ("rope_dims", c_size_t),
        ("k_center", c_int),
        ("k_center_values", POINTER(c_float)),
        ("n_threads", c_size_t),
        ("allocator", POINTER(kvq_allocator)),
        ("isa", c_int),
        ("err_msg", POINTER(c_char)),
        ("err_msg_size", c_size_t),
        # residency tiers
        ("hot_tokens", c_size_t),
        ("hot_bytes", c_size_t),
        ("warm_tokens", c_size_t),
        ("warm_bytes", c_size_t),
        ("warm_codec", c_char_p),
        ("warm_allocator", POINTER(kvq_allocator)),
        ("cold_store", c_void_p),
        ("warm_promote", c_int),
        ("verify_tiers", c_int),
        ("strict_tiers", c_int),
        ("cold_ttl_ms", c_uint64),
        ("link_gbps", c_double * 2),
        ("link_latency_ms", c_double * 2),
        ("huge_pages", c_int),
    ]


STATS_FIELDS = [
    ("tokens", c_uint64),
    ("tokens_appended", c_uint64),
    ("tokens_evicted", c_uint64),
    ("payload_bytes", c_uint64),
    ("metadata_bytes", c_uint64),
    ("codec_meta_bytes", c_uint64),
    ("stored_bytes", c_uint64),
    ("peak_stored_bytes", c_uint64),
    ("bytes_written", c_uint64),
    ("bytes_read", c_uint64),
    ("reencodes", c_uint64),
    ("pages", c_uint64),
    ("free_slots", c_uint64),
    ("bits_per_value", c_double),
    ("total_bits_per_value", c_double),
    ("fragmentation", c_double),
    ("asymptotic_bits_per_value", c_double),
    ("fixed_bytes", c_uint64),
    ("tokens_cold", c_uint64),
    ("arena_bytes", c_uint64),
]


class kvq_stats(Structure):
    _fields_ = STATS_FIELDS

    def to_dict(self):
        return {name: getattr(self, name) for name, _ in STATS_FIELDS}


class kvq_model_info(Structure):
    _fields_ = [(n, c_size_t) for n in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                                        "vocab_size", "seq_len", "head_dim")] + [
        ("shared_classifier", c_int),
        ("version", c_int),
    ]


ISA = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3, "avxvnni": 4}
POLICY = {"none": 0, "window": 1, "fifo": 2, "utility": 3}
LAYOUT = {"token": 0, "channel": 1}

# name: (restype, argtypes). Pointers to data are c_void_p: the binding passes
# numpy buffer addresses (ints) and owns the buffers for the call's duration.
_P = c_void_p
_SZ = c_size_t
_SZP = POINTER(c_size_t)
_PROTOS = {
    "kvq_version_string": (c_char_p, []),
    "kvq_strerror": (c_char_p, [c_int]),
    "kvq_cpu_best_isa": (c_int, []),
    "kvq_cpu_supports": (c_int, [c_int]),
    "kvq_isa_name": (c_char_p, [c_int]),
    "kvq_codec_create": (c_int, [POINTER(_P), c_char_p, _SZ, POINTER(kvq_codec_params)]),
    "kvq_codec_free": (None, [_P]),
    "kvq_codec_spec": (c_char_p, [_P]),
    "kvq_codec_head_dim": (_SZ, [_P]),
    "kvq_codec_vector_bytes": (_SZ, [_P]),
    "kvq_codec_bits_per_value": (c_double, [_P]),
    "kvq_codec_state_bytes": (_SZ, [_P]),
    "kvq_codec_isa": (c_int, [_P]),
    "kvq_codec_needs_fit": (c_int, [_P]),
    "kvq_codec_encode_bound": (_SZ, [_P, _SZ]),
    "kvq_codec_encode": (c_int, [_P, _P, _SZ, _P, _SZ]),
    "kvq_codec_decode": (c_int, [_P, _P, _SZ, _P, _SZ]),
    "kvq_codec_score": (c_int, [_P, _P, _SZ, _P, _SZ, _P, _SZ]),
    "kvq_codec_accumulate": (c_int, [_P, _P, _SZ, _P, _SZ, _P, _SZ]),
    "kvq_codec_fit": (c_int, [_P, _P, _SZ]),
    "kvq_codec_save_state": (c_int, [_P, _P, _SZ, _SZP]),
    "kvq_codec_load_state": (c_int, [_P, _P, _SZ]),
    "kvq_codec_save_file": (c_int, [_P, c_char_p]),
    "kvq_codec_load_file": (c_int, [_P, c_char_p]),
    "kvq_cache_config_init": (None, [POINTER(kvq_cache_config)]),
    "kvq_cache_create": (c_int, [POINTER(_P), POINTER(kvq_cache_config)]),
    "kvq_cache_free": (None, [_P]),
    "kvq_cache_append": (c_int, [_P, _SZ, _P, _P, _P, _SZ]),
    "kvq_cache_attend": (c_int, [_P, _SZ, _P, _P, _SZ, _P, _SZ, _P, _SZ]),
    "kvq_cache_observe_attention": (c_int, [_P, _SZ, _P, _SZ, _SZ, _SZ]),
    "kvq_cache_tokens": (c_int, [_P, _SZ, _SZP]),
    "kvq_cache_positions": (c_int, [_P, _SZ, _P, _SZ]),
    "kvq_cache_get_kv": (c_int, [_P, _SZ, c_int, _SZ, _SZ, _P, _P, _SZ]),
    "kvq_cache_set_precision": (c_int, [_P, c_int, c_int, c_int, c_char_p, POINTER(c_double)]),
    "kvq_cache_last_error": (c_char_p, [_P]),
    "kvq_cache_set_budget": (c_int, [_P, _SZ]),
    "kvq_cache_set_threads": (c_int, [_P, _SZ]),
    "kvq_cache_stats": (c_int, [_P, c_int, POINTER(kvq_stats)]),
    "kvq_cache_stats_json": (c_int, [_P, _P, _SZ, _SZP]),
    "kvq_cache_get_config": (c_int, [_P, POINTER(kvq_cache_config)]),
    "kvq_model_load": (c_int, [POINTER(_P), c_char_p, POINTER(kvq_allocator)]),
    "kvq_model_free": (None, [_P]),
    "kvq_model_get_info": (c_int, [_P, POINTER(kvq_model_info)]),
    "kvq_model_cache_shape": (c_int, [_P, POINTER(kvq_cache_config)]),
    "kvq_model_forward": (c_int, [_P, _P, _P, _SZ, c_int32, _P, _SZ, c_int]),
    "kvq_tokenizer_load": (c_int, [POINTER(_P), c_char_p, _SZ, POINTER(kvq_allocator)]),
    "kvq_tokenizer_free": (None, [_P]),
    "kvq_tokenizer_encode": (c_int, [_P, c_char_p, c_int, c_int, _P, _SZ, _SZP]),
    "kvq_tokenizer_piece": (c_char_p, [_P, c_int32, c_int32, _P]),
    "kvq_f32_to_f16": (c_uint16, [c_float]),
    "kvq_f16_to_f32": (c_float, [c_uint16]),
    "kvq_f32_to_bf16": (c_uint16, [c_float]),
    "kvq_bf16_to_f32": (c_float, [c_uint16]),
    "kvq_crc32c": (c_uint32, [c_uint32, _P, _SZ]),
}

ERR_MSG_SIZE = 512

# functions a library may lack (the binding works without them; calling one
# raises); every other one in _PROTOS is required when loading
_OPTIONAL = ("kvq_model_", "kvq_tokenizer_")


def _missing(path, name):
    def fail(*args):
        raise AttributeError("%s has no %s (an older build of libkvq?)" % (path, name))
    return fail


def default_library_path():
    """build/libkvq.so of the clone that holds this package (python/kvq in
    the repository); an installed package has none."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "build", "libkvq.so"))


SYSTEM_NAME = "libkvq.so.0"  # the soname `make install` installs


class _DlInfo(Structure):
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p), ("dli_sname", c_char_p),
                ("dli_saddr", c_void_p)]


def _file_of(dll, name):
    """The file the dynamic loader mapped for a library it found by name
    (dladdr on one of its functions), or the name where that is unknown."""
    for libc in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libc).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [c_void_p, POINTER(_DlInfo)]
        dladdr.restype = c_int
        info = _DlInfo()
        addr = ctypes.cast(dll.kvq_version_string, c_void_p).value
        if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode("utf-8", "replace"))
    return name


class Handle:
    """Owns one library handle (self._h, freed by the Lib function named in
    _free): close() frees it once; garbage collection and the end of a with
    block close it too."""

    _free = None
    _h = None

    def close(self):
        if self._h is not None:
            getattr(self.lib, self._free)(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Lib:
    """One loaded libkvq with its functions declared (attribute access gives
    the ctypes function, e.g. lib.kvq_codec_encode)."""

    def __init__(self, path, how="path"):
        self.dll = ctypes.CDLL(path)
        self.path = _file_of(self.dll, path) if how == "system" else path
        self.found_by = how  # "path", "KVQ_LIB", "system" or "clone"
        missing = []
        for name, (res, args) in _PROTOS.items():
            try:
                fn = getattr(self.dll, name)
            except AttributeError:
                missing.append(name)
                setattr(self, name, _missing(path, name))
                continue
            fn.restype = res
            fn.argtypes = args
            setattr(self, name, fn)
        required = [m for m in missing if not m.startswith(_OPTIONAL)]
        if required:
            raise OSError("%s lacks %s: an older or partial build of libkvq? Rebuild it (make)"
                          % (path, ", ".join(required)))

    def strerror(self, status):
        return self.kvq_strerror(int(status)).decode("utf-8", "replace")

    def check(self, status, where="", detail=""):
        """Raises KvqError for a failed status; detail is the err_msg text."""
        if status != 0:
            raise KvqError(status, self.strerror(status), detail, where)

    @property
    def version(self):
        return self.kvq_version_string().decode()

    def isa_name(self, isa):
        return self.kvq_isa_name(int(isa)).decode()

    def cpu_supports(self, isa):
        return bool(self.kvq_cpu_supports(isa_code(isa)))


def isa_code(isa):
    if isinstance(isa, int):
        return isa
    try:
        return ISA[str(isa).lower()]
    except KeyError:
        raise KvqShapeError("unknown isa %r (one of %s)" % (isa, ", ".join(ISA))) from None


_cache = {}
_lock = threading.Lock()


def _load_file(path, how):
    path = os.path.abspath(os.fspath(path))
    lib = _cache.get(path)
    if lib is None:
        if not os.path.exists(path):
            raise OSError("libkvq not found at %s (%s): build it with `make` (build/libkvq.so) "
                          "or give the path of an installed libkvq.so" %
                          (path, "from KVQ_LIB" if how == "KVQ_LIB" else "given explicitly"))
        lib = Lib(path, how)
        _cache[path] = lib
    return lib


def _in_clone():
    """Whether this package is python/kvq of a kvq clone (not an installed copy)."""
    root = os.path.dirname(os.path.dirname(default_library_path()))
    return os.path.exists(os.path.join(root, "include", "kvq.h"))


def _load_system(tried):
    """libkvq.so.0 through the dynamic loader (ld.so.cache, LD_LIBRARY_PATH),
    or None (with the reason appended to tried)."""
    names = [SYSTEM_NAME]
    found = ctypes.util.find_library("kvq")
    if found and found not in names:
        names.append(found)
    for name in names:
        lib = _cache.get("system:" + name)
        if lib is not None:
            return lib
        try:
            lib = Lib(name, "system")
        except OSError as e:
            tried.append("the system loader's %s (%s)" % (name, e))
            continue
        # a library already loaded from a path has this soname too: the
        # loader hands that one back, and so do we
        lib = _cache.setdefault(os.path.abspath(lib.path), lib) if lib.path != name else lib
        _cache["system:" + name] = lib
        return lib
    return None


def load(path=None):
    """The Lib for path; without one, the first found of $KVQ_LIB, this
    clone's build/libkvq.so (when the package is imported from a clone),
    the system loader's libkvq.so.0 (an installed library) and, for an
    installed package, nothing more. Each library is loaded once per
    process. Raises OSError saying what was tried when none is found."""
    if isinstance(path, Lib):
        return path
    with _lock:
        if path is not None:
            return _load_file(path, "path")
        env = os.environ.get("KVQ_LIB")
        if env:
            return _load_file(env, "KVQ_LIB")
        tried = ["$KVQ_LIB (not set)"]
        clone = default_library_path()
        in_clone = _in_clone()
        if in_clone:
            # the library built from the same sources as this package: an
            # older installed one must not shadow it
            if os.path.exists(clone):
                return _load_file(clone, "clone")
            tried.append("this clone's %s (no such file: run `make`)" % clone)
        lib = _load_system(tried)
        if lib is not None:
            return lib
        if not in_clone:
            tried.append("no clone's build folder (this package is installed at %s)"
                         % os.path.dirname(os.path.abspath(__file__)))
        raise OSError(
            "libkvq not found. Tried " + "; ".join(tried) + ". Build it in the clone with "
            "`make` (build/libkvq.so), or install it with `make install` and run `ldconfig` "
            "(or add its lib folder to LD_LIBRARY_PATH), or set KVQ_LIB=/path/to/libkvq.so.")


def err_buffer():
    """A writable err_msg buffer and the pointer to put in a params struct."""
    buf = ctypes.create_string_buffer(ERR_MSG_SIZE)
    return buf, ctypes.cast(buf, POINTER(c_char))


def err_text(buf):
    return buf.value.decode("utf-8", "replace") if buf is not None else ""
