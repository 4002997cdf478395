"""kvq.Model and kvq.Tokenizer: the library's llama2.c model runner and BPE
tokenizer, so that a real model can fill a KVCache from Python.

Model.forward runs tokens through the f32 model; their K and V go into the
given KVCache (whose codecs, policy and budget apply) and attention runs on
it, so the logits show what the cache's compression does to the model.
A model is immutable after load; the objects own their handles.
"""

import ctypes

import numpy as np

from . import _arrays, _lib
from ._lib import KvqShapeError
from .cache import KVCache
from .codec import ptr

__all__ = ["Model", "Tokenizer"]


class Model(_lib.Handle):
    """Model(path, lib=None): a llama2.c checkpoint (legacy or ak42 v1/v2)."""

    _free = "kvq_model_free"

    def __init__(self, path, lib=None):
        self._h = None
        self.lib = _lib.load(lib)
        h = ctypes.c_void_p()
        st = self.lib.kvq_model_load(ctypes.byref(h), str(path).encode(), None)
        self.lib.check(st, "kvq_model_load(%s)" % path)
        self._h = h.value
        info = _lib.kvq_model_info()
        self.lib.check(self.lib.kvq_model_get_info(self._h, ctypes.byref(info)),
                       "kvq_model_get_info")
        self.info = {name: getattr(info, name) for name, _ in _lib.kvq_model_info._fields_}
        self.vocab_size = self.info["vocab_size"]


    @property
    def handle(self):
        if self._h is None:
            raise ValueError("model is closed")
        return self._h

    def cache(self, **options):
        """A KVCache shaped for this model (kvq_model_cache_shape: layers,
        heads, head_dim, max_tokens = seq_len, RoPE); options are KVCache
        keywords (codecs, policy, budget, ...) and may override the shape."""
        cfg = _lib.kvq_cache_config()
        self.lib.kvq_cache_config_init(ctypes.byref(cfg))
        self.lib.check(self.lib.kvq_model_cache_shape(self.handle, ctypes.byref(cfg)),
                       "kvq_model_cache_shape")
        kw = dict(layers=cfg.n_layers, kv_heads=cfg.n_kv_heads, q_heads=cfg.n_q_heads,
                  head_dim=cfg.head_dim, max_tokens=cfg.max_tokens, rope_theta=cfg.rope_theta,
                  rope_dims=cfg.rope_dims, lib=self.lib)
        kw.update(options)
        return KVCache(**kw)

    def forward(self, cache, tokens, pos0=0, last_only=False, logits=True):
        """Runs tokens (ints: a list, an integer array or tensor) at
        positions pos0.. through the model, appending their K/V to cache.
        Returns float32 logits [n, vocab] ([vocab] with last_only; a tensor
        for tensor tokens), or None with logits=False."""
        where = "Model.forward"
        if not isinstance(cache, KVCache):
            raise TypeError("%s: cache must be a KVCache (Model.cache() makes one)" % where)
        toks, kind = _arrays.ints(tokens, "tokens", where)
        toks = toks.reshape(-1)
        if toks.size and (toks.min() < 0 or toks.max() >= self.vocab_size):
            raise KvqShapeError("token ids must be in 0..%d" % (self.vocab_size - 1), where)
        toks = np.ascontiguousarray(toks, dtype=np.int32)
        n = toks.shape[0]
        if n == 0:
            raise KvqShapeError("no tokens", where)
        out, op, cap = None, None, 0
        if logits:
            out = np.zeros((1 if last_only else n, self.vocab_size), dtype=np.float32)
            op, cap = ptr(out), out.size
        st = self.lib.kvq_model_forward(self.handle, cache.handle, ptr(toks), n, int(pos0), op,
                                        cap, int(bool(last_only)))
        self.lib.check(st, "kvq_model_forward(%d tokens at %d)" % (n, pos0))
        if out is None:
            return None
        return kind.wrap(out[0] if last_only else out)

    def generate(self, cache, prompt, steps, pos0=0):
        """Greedy decoding: feeds prompt, then `steps` argmax tokens; returns
        the generated tokens (not the prompt)."""
        prompt = _arrays.ints(prompt, "prompt", "Model.generate")[0].reshape(-1).tolist()
        logits = np.asarray(self.forward(cache, prompt, pos0, last_only=True))
        pos = pos0 + len(prompt)
        outs = []
        for _ in range(steps):
            t = int(np.argmax(logits))
            outs.append(t)
            if len(outs) == steps:
                break
            logits = np.asarray(self.forward(cache, [t], pos, last_only=True))
            pos += 1
        return outs


class Tokenizer(_lib.Handle):
    """Tokenizer(path, vocab_size, lib=None): a llama2.c tokenizer.bin."""

    _free = "kvq_tokenizer_free"

    def __init__(self, path, vocab_size, lib=None):
        self._h = None
        self.lib = _lib.load(lib)
        h = ctypes.c_void_p()
        st = self.lib.kvq_tokenizer_load(ctypes.byref(h), str(path).encode(), int(vocab_size),
                                         None)
        self.lib.check(st, "kvq_tokenizer_load(%s)" % path)
        self._h = h.value


    def encode(self, text, bos=True, eos=False):
        """llama2.c BPE encode; returns a list of token ids."""
        raw = text.encode("utf-8")
        cap = len(raw) + 3
        buf = np.zeros(cap, dtype=np.int32)
        n = ctypes.c_size_t()
        st = self.lib.kvq_tokenizer_encode(self._h, raw, int(bool(bos)), int(bool(eos)),
                                           ptr(buf), cap, ctypes.byref(n))
        self.lib.check(st, "kvq_tokenizer_encode")
        return buf[:n.value].tolist()

    def decode(self, tokens, prev=1):
        """The text of tokens (each piece following its predecessor; prev is
        the token before the first, BOS by default)."""
        out = []
        scratch = ctypes.create_string_buffer(8)
        for t in tokens:
            piece = self.lib.kvq_tokenizer_piece(self._h, int(prev), int(t),
                                                 ctypes.addressof(scratch))
            out.append(piece or b"")
            prev = t
        return b"".join(out).decode("utf-8", "replace")
