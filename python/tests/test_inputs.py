"""What the binding accepts: every entry point rejects data of the wrong
dtype with TypeError instead of casting it (a float array given as encoded
bytes used to decode to zeros, ints above 255 wrapped, float positions were
truncated), integer arguments must be integers, and set_precision takes its
arguments in the order of kvq_cache_set_precision. Float values are numpy
float32 (float64 and float16 arrays raise TypeError naming the dtype and the
fix, .astype(numpy.float32): nothing is cast), float32/float16/bfloat16
tensors or lists of floats; nothing is stored when a call is refused.
"""

import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import kvq  # noqa: E402
from kvq import _arrays  # noqa: E402


def gauss(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


class TestDtypes(unittest.TestCase):
    def test_codec_rejects_wrong_dtypes(self):
        r = np.random.default_rng(1)
        c = kvq.Codec("int8", 16)
        x = gauss(r, 5, 16)
        e = c.encode(x)
        # encoded data must be uint8 (or bytes): a float array is not, and
        # int values above 255 would wrap
        for bad in (e.astype(np.float32), e.astype(np.int64) + 256, e.astype(np.int16),
                    e.astype(bool), e.tolist()):
            with self.assertRaises(TypeError, msg=repr(getattr(bad, "dtype", type(bad)))):
                c.decode(bad)
            with self.assertRaises(TypeError):
                c.score(x, bad)
            with self.assertRaises(TypeError):
                c.accumulate(np.ones((1, 5), np.float32), bad)
        # values must be floats: integers, bools, complex are refused
        for bad in (np.arange(80).reshape(5, 16), np.ones((5, 16), bool),
                    np.ones((5, 16), np.complex64), np.ones((5, 16), np.uint8), [[1] * 16],
                    b"\0" * 64, "0123456789abcdef"):
            with self.assertRaises(TypeError, msg=repr(getattr(bad, "dtype", type(bad)))):
                c.encode(bad)
        with self.assertRaises(TypeError):
            c.score(np.ones((1, 16), np.int32), e)
        with self.assertRaises(TypeError):
            c.accumulate(np.ones((1, 5), np.int64), e)
        with self.assertRaises(TypeError):
            c.fit(np.ones((5, 16), np.int8))
        with self.assertRaises(TypeError) as cm:
            c.decode(e.astype(np.float32))
        self.assertIn("uint8", str(cm.exception))
        self.assertIn("Codec.decode", str(cm.exception))
        # the accepted forms give the same bytes and values
        np.testing.assert_array_equal(c.decode(e.tobytes()), c.decode(e))
        np.testing.assert_array_equal(c.decode(bytearray(e.tobytes())), c.decode(e))
        for ok in (x.astype(np.float16).astype(np.float32), x.tolist()):
            np.testing.assert_array_equal(c.encode(ok), c.encode(np.asarray(ok, np.float32)))

    def test_float_arrays_must_be_float32(self):
        # float64 numpy was accepted and converted although the contract says nothing is
        # cast: every entry point now refuses it (and float16), naming the dtype and the fix
        r = np.random.default_rng(7)
        H, QH, d = 2, 4, 16
        x = gauss(r, 3, H, d)
        c = kvq.Codec("int8", d)
        cache = kvq.KVCache(layers=1, kv_heads=H, q_heads=QH, head_dim=d, max_tokens=16,
                            k_codec="int8", v_codec="int8", policy="utility", budget=8)
        ac = kvq.AdaptiveKVCache(heads=H, head_dim=d, budget=8, q_heads=QH)
        comp = kvq.KVCompressor(k_codec="int8", v_codec="int8")
        e = c.encode(x)
        for dt in (np.float64, np.float16, np.longdouble):
            bad = x.astype(dt)
            calls = {
                "Codec.encode": lambda: c.encode(bad),
                "Codec.fit": lambda: kvq.Codec("nuq4", d).fit(bad.reshape(-1, d)),
                "Codec.score": lambda: c.score(bad[0], e[0]),
                "Codec.accumulate": lambda: c.accumulate(bad[0, :, :3], e[0]),
                "KVCache.append": lambda: cache.append(0, bad, x),
                "KVCache.attend": lambda: cache.attend(0, bad[:1].repeat(2, axis=1), [0]),
                "KVCache.observe_attention": lambda: cache.observe_attention(
                    0, np.full((QH, 3), 1 / 3, dt)),
                "AdaptiveKVCache.update": lambda: ac.update(bad.transpose(1, 0, 2), x.transpose(1, 0, 2)),
                "KVCompressor.compress": lambda: comp.compress(x, bad),
            }
            for name, call in calls.items():
                with self.subTest(call=name, dtype=np.dtype(dt).name):
                    with self.assertRaises(TypeError) as cm:
                        call()
                    msg = str(cm.exception)
                    self.assertIn("got %s" % np.dtype(dt), msg)
                    self.assertIn(".astype(numpy.float32)", msg)
                    self.assertIn(name, msg)
            self.assertEqual(cache.tokens(0), 0)
            self.assertEqual(len(ac), 0)
        # a numpy float64 scalar is numpy data too; a list of floats has no dtype
        with self.assertRaises(TypeError):
            c.encode(np.float64(1.0))
        np.testing.assert_array_equal(c.encode(x.tolist()), e)
        # float32 as the message says: accepted, and C-contiguous input read in place
        a, _ = _arrays.floats(x.astype(np.float64).astype(np.float32), "x")
        self.assertEqual(a.dtype, np.float32)
        self.assertIs(_arrays.floats(x, "x")[0], x)

    def test_zero_copy_and_layout(self):
        r = np.random.default_rng(2)
        x = gauss(r, 4, 16)
        a, kind = _arrays.floats(x, "x")
        self.assertIs(a, x)  # C-contiguous float32: the caller's buffer
        self.assertFalse(kind.torch)
        t = x.T  # Fortran order: made contiguous once, same values
        a, _ = _arrays.floats(t, "x")
        self.assertTrue(a.flags.c_contiguous)
        np.testing.assert_array_equal(a, t)
        b = np.zeros(8, np.uint8)
        self.assertIs(_arrays.codes(b)[0], b)

    def test_cache_rejects_wrong_dtypes(self):
        r = np.random.default_rng(3)
        H, QH, d = 2, 4, 8
        c = kvq.KVCache(layers=2, kv_heads=H, q_heads=QH, head_dim=d, max_tokens=64,
                        k_codec="f32", v_codec="f32", policy="utility", budget=32)
        k, v = gauss(r, 3, H, d), gauss(r, 3, H, d)
        refused = [
            lambda: c.append(0, k.astype(np.int32), v),
            lambda: c.append(0, k, (v > 0)),
            lambda: c.append(0, k, v, positions=[0.0, 1.0, 2.0]),
            lambda: c.append(0, k, v, positions=np.array([0, 1, 2], np.float32)),
            lambda: c.append(0.0, k, v),
            lambda: c.append(True, k, v),
            lambda: c.append("0", k, v),
        ]
        for call in refused:
            with self.assertRaises(TypeError):
                call()
            self.assertEqual(c.tokens(0), 0)  # nothing stored
        # float64 and float16 arrays are refused, not cast (the message names the dtype
        # and the fix); nothing is stored
        for a, b in ((k.astype(np.float64), v), (k, v.astype(np.float16))):
            with self.assertRaises(TypeError) as cm:
                c.append(0, a, b)
            self.assertIn(".astype(numpy.float32)", str(cm.exception))
            self.assertEqual(c.tokens(0), 0)
        # accepted: float32 values, any integer positions and layers
        c.append(np.int64(0), k, v.astype(np.float16).astype(np.float32),
                 np.array([0, 1, 2], np.uint8))
        c.append(1, k, v)
        self.assertEqual(c.tokens(0), 3)
        np.testing.assert_array_equal(c.get_kv(0)[0], k)
        np.testing.assert_array_equal(c.get_kv(0)[1], v.astype(np.float16).astype(np.float32))
        q = gauss(r, 1, QH, d)
        for call in (lambda: c.attend(0, q.astype(np.int64), [2]),
                     lambda: c.attend(0, q, [2.0]),
                     lambda: c.attend(0, q, 2.5),
                     lambda: c.attend(1.0, q, [2]),
                     lambda: c.get_kv(0, head=1.0),
                     lambda: c.get_kv(0, first=0.5),
                     lambda: c.positions(0.0),
                     lambda: c.stats(0.0),
                     lambda: c.set_budget(8.0),
                     lambda: c.observe_attention(0, np.ones((QH, 3), np.int32)),
                     lambda: c.observe_attention(0, np.ones((QH, 3), bool))):
            with self.assertRaises(TypeError):
                call()
        self.assertEqual(c.positions(0).tolist(), [0, 1, 2])
        with self.assertRaises(TypeError):
            c.attend(0, q.astype(np.float64), [2])
        out = c.attend(0, q, np.int16(2))
        self.assertEqual(out.dtype, np.float32)
        np.testing.assert_array_equal(out, c.attend(0, q, [2]))
        with self.assertRaises(TypeError):
            kvq.KVCache(layers=1, kv_heads=H, head_dim=d, max_tokens=10,
                        k_center_values=np.ones((1, H, d), np.int32))

    def test_compat_and_model_reject_wrong_dtypes(self):
        r = np.random.default_rng(4)
        comp = kvq.KVCompressor(k_codec="int8", v_codec="int8")
        k = gauss(r, 1, 2, 5, 16)
        for bad in (k.astype(np.int32), (k > 0)):
            with self.assertRaises(TypeError):
                comp.compress(bad, k)
            with self.assertRaises(TypeError):
                comp.compress(k, bad)
        ac = kvq.AdaptiveKVCache(heads=2, head_dim=16, budget=8, k_codec="f16", v_codec="f16")
        with self.assertRaises(TypeError):
            ac.update(np.ones((2, 1, 16), np.int64), gauss(r, 2, 1, 16))
        with self.assertRaises(TypeError):
            ac.update(gauss(r, 2, 1, 16), gauss(r, 2, 1, 16),
                      attention_weights=np.ones((2, 1), np.int64))
        with self.assertRaises(TypeError):
            ac.update(gauss(r, 2, 1, 16), gauss(r, 2, 1, 16), positions=[0.5])
        self.assertEqual(len(ac), 0)  # nothing was appended by the refused calls


class TestArgumentOrder(unittest.TestCase):
    def test_set_precision_in_c_order(self):
        r = np.random.default_rng(5)
        H, d, n = 2, 32, 20
        c = kvq.KVCache(layers=2, kv_heads=H, head_dim=d, max_tokens=32, k_codec="int8",
                        v_codec="int8")
        k, v = gauss(r, n, H, d), gauss(r, n, H, d)
        for layer in (0, 1):
            c.append(layer, k, v)
            c.attend(layer, gauss(r, 1, H, d), [n - 1])  # settles the prefill
        k0, v0 = c.get_kv(0)
        # (layer, head, values, codec), as kvq_cache_set_precision(cache, layer, kv_head,
        # is_value, codec): layer 0, KV head 1, the values, to int4
        added = c.set_precision(0, 1, True, "int4")
        self.assertGreater(added, 1e-4)
        k1, v1 = c.get_kv(0)
        np.testing.assert_array_equal(k1, k0)
        np.testing.assert_array_equal(v1[:, 0], v0[:, 0])
        self.assertGreater(np.abs(v1[:, 1] - v0[:, 1]).max(), 0)
        np.testing.assert_array_equal(c.get_kv(1)[1], v0)  # layer 1 untouched
        self.assertEqual(c.stats(0)["reencodes"], n)
        # keywords in the same order; every argument has the C default but the codec
        c.set_precision(layer=1, values=False, codec=kvq.Codec("int4", d))
        self.assertEqual(c.stats(1)["reencodes"], n * H)
        # the old order (codec first) is refused, never read as a layer
        with self.assertRaises(TypeError) as cm:
            c.set_precision("int4", 0, 1, True)
        self.assertIn("codec comes last", str(cm.exception))
        with self.assertRaises(TypeError):
            c.set_precision(kvq.Codec("int4", d))
        with self.assertRaises(TypeError):
            c.set_precision("int4", layer=0)
        with self.assertRaises(TypeError):
            c.set_precision(0, 0, True)  # no codec
        with self.assertRaises(TypeError):
            c.set_precision(0, 0, "yes", "int4")
        self.assertEqual(c.stats()["reencodes"], n + n * H)  # the refused calls did nothing


class TestLimits(unittest.TestCase):
    SHAPE = dict(layers=2, kv_heads=2, head_dim=16, max_tokens=64)

    def test_counts_do_not_wrap(self):
        # ctypes keeps the low 64 bits of an int: 2**64 + 1 layers made a
        # 1-layer cache, an override of layer 2**32 applied to layer 0
        for kw in ({"layers": 2**64 + 1}, {"kv_heads": 2**64 + 2, "q_heads": 2**64 + 2},
                   {"max_tokens": 2**64 + 16}, {"budget": 2**64, "policy": "fifo"},
                   {"sinks": 2**65}):
            with self.assertRaises(kvq.KvqShapeError, msg=repr(kw)):
                kvq.KVCache(**dict(self.SHAPE, **kw))
        for ov in ((2**32, -1, False, "int4"), (0, 2**32 + 1, True, "int4"),
                   {"codec": "int4", "layer": -2**31 - 1}, {"codec": "int4", "head": 1.0}):
            with self.assertRaises(kvq.KvqShapeError, msg=repr(ov)):
                kvq.KVCache(**dict(self.SHAPE, overrides=[ov]))

    def test_library_limits(self):
        # kvq.h's KVQ_MAX_* limits and override ranges: refused by
        # kvq_cache_create with KVQ_ERR_INVALID_ARG and a message naming the field
        cases = (({"layers": 4097}, "n_layers"),
                 ({"kv_heads": 4097, "q_heads": 4097}, "n_kv_heads"),
                 ({"max_tokens": 2**30 + 1}, "max_tokens"),
                 ({"page": 4097}, "page_tokens"),
                 ({"threads": 257}, "n_threads"),
                 ({"protect_recent": 2**64 - 1}, "protect_recent"),
                 ({"budget": 2**30 + 1, "policy": "window"}, "budget_tokens"),
                 ({"budget_ratio": float("inf"), "policy": "window"}, "budget_ratio"),
                 ({"overrides": [(2, 0, False, "int4")]}, "layer 2"),
                 ({"overrides": [(0, 2, True, "int4")]}, "kv_head 2"))
        for kw, field in cases:
            with self.assertRaises(kvq.KvqError, msg=repr(kw)) as cm:
                kvq.KVCache(**dict(self.SHAPE, **kw))
            self.assertEqual(cm.exception.status, kvq.Status.ERR_INVALID_ARG, repr(kw))
            self.assertIn(field, cm.exception.detail, repr(kw))
        # the last layer and head are fine
        kvq.KVCache(**dict(self.SHAPE, overrides=[(1, 1, True, "int4")])).close()

    def test_max_tokens_left_zero(self):
        # kvq_cache_config_init leaves max_tokens 0 (kvq.h says so): the create error
        # names the field
        with self.assertRaises(kvq.KvqError) as cm:
            kvq.KVCache(layers=1, kv_heads=2, head_dim=16, max_tokens=0)
        self.assertEqual(cm.exception.status, kvq.Status.ERR_INVALID_ARG)
        self.assertIn("max_tokens 0 is outside 1..2^30", cm.exception.detail)
        with open(os.path.join(REPO, "include", "kvq.h")) as f:
            h = f.read()
        at = h.index("KVQ_API void kvq_cache_config_init(")
        self.assertIn("max_tokens", h[h.rindex("/*", 0, at):at])  # the comment beside it

    def test_set_budget_at_most_max_tokens(self):
        r = np.random.default_rng(6)
        for policy in ("none", "window", "fifo", "utility"):
            c = kvq.KVCache(**dict(self.SHAPE, policy=policy,
                                   budget=0 if policy == "none" else 48))
            c.append(0, gauss(r, 60, 2, 16), gauss(r, 60, 2, 16))
            for bad in (65, 2**64 - 1, 2**64 + 5):
                with self.assertRaises(kvq.KvqError, msg=(policy, bad)) as cm:
                    c.set_budget(bad)
                self.assertEqual(cm.exception.status, kvq.Status.ERR_INVALID_ARG)
                self.assertIn("outside 1..max_tokens", cm.exception.detail)
            self.assertEqual(c.tokens(0), 60)
            if policy != "none":
                c.set_budget(64)
                c.set_budget(20)
                self.assertEqual(c.tokens(0), 20)
            c.close()


if __name__ == "__main__":
    unittest.main()
