"""CPU torch tensors through the binding (Debian python3-torch).

float32/float16/bfloat16 tensors are accepted wherever numpy float arrays
are, contiguous float32 without a copy (the C call reads data_ptr()), uint8
tensors as encoded data; results come back as tensors (float results in the
input's dtype), equal to what the numpy path gives for the same float32
values. Integer, bool and non-CPU tensors are refused with TypeError. The
package itself never imports torch (checked in a fresh interpreter).
"""

import os
import subprocess
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import kvq  # noqa: E402
from kvq import _arrays  # noqa: E402

try:
    import torch
except ImportError:  # the runner reports the skip (a failure unless KVQ_ALLOW_SKIP=1)
    torch = None

NEEDS = unittest.skipIf(torch is None, "torch is not installed for %s (Debian: apt-get install "
                                       "python3-torch)" % sys.executable)


def gauss(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


class TestWithoutTorch(unittest.TestCase):
    def test_import_does_not_need_torch(self):
        """A fresh interpreter imports kvq and runs a codec with torch
        blocked from being imported."""
        code = ("import sys; sys.modules['torch'] = None\n"
                "sys.path.insert(0, %r)\n"
                "import numpy as np, kvq\n"
                "c = kvq.Codec('f32', 8)\n"
                "x = np.ones((2, 8), np.float32)\n"
                "assert (c.decode(c.encode(x)) == x).all()\n"
                "print('ok')\n" % os.path.join(REPO, "python"))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "ok")


@NEEDS
class TestTorch(unittest.TestCase):
    def test_zero_copy_float32(self):
        t = torch.randn(5, 3, 16)
        a, kind = _arrays.floats(t, "x")
        self.assertEqual(a.ctypes.data, t.data_ptr())  # C reads the tensor's memory
        self.assertTrue(kind.torch)
        a, _ = _arrays.floats(t.requires_grad_(), "x")  # detached, still no copy
        self.assertEqual(a.ctypes.data, t.data_ptr())
        u = torch.randn(16, 5).t()  # not contiguous: one contiguous copy
        a, _ = _arrays.floats(u, "x")
        self.assertNotEqual(a.ctypes.data, u.data_ptr())
        np.testing.assert_array_equal(a, u.detach().numpy())
        b = torch.zeros(8, dtype=torch.uint8)
        self.assertEqual(_arrays.codes(b)[0].ctypes.data, b.data_ptr())
        # a result wrapped from float32 shares the numpy buffer
        out = np.zeros(4, np.float32)
        self.assertEqual(_arrays.Kind(True, torch.float32).wrap(out).data_ptr(), out.ctypes.data)

    def test_codec(self):
        r = np.random.default_rng(51)
        x = gauss(r, 4, 7, 64)
        for spec in ("int8", "tq3", "int4:g=32"):
            c = kvq.Codec(spec, 64)
            ref = c.encode(x)
            for dt in (torch.float32, torch.float16, torch.bfloat16):
                with self.subTest(spec=spec, dtype=dt):
                    t = torch.from_numpy(x).to(dt)
                    e = c.encode(t)
                    self.assertIsInstance(e, torch.Tensor)
                    self.assertEqual(e.dtype, torch.uint8)
                    self.assertEqual(tuple(e.shape), (4, 7, c.vector_bytes))
                    # the same bytes as the float32 values of the tensor
                    np.testing.assert_array_equal(e.numpy(), c.encode(t.float().numpy()))
                    if dt == torch.float32:
                        np.testing.assert_array_equal(e.numpy(), ref)
            d = c.decode(torch.from_numpy(ref))
            self.assertEqual(d.dtype, torch.float32)
            np.testing.assert_array_equal(d.numpy(), c.decode(ref))
            self.assertEqual(c.decode(torch.from_numpy(ref), dtype=torch.bfloat16).dtype,
                             torch.bfloat16)
            q = torch.randn(3, 64, dtype=torch.float16)
            s = c.score(q, torch.from_numpy(ref[0]))
            self.assertEqual((s.dtype, tuple(s.shape)), (torch.float16, (3, 7)))
            np.testing.assert_allclose(s.float().numpy(), c.score(q.float().numpy(), ref[0]),
                                       rtol=2e-3, atol=2e-3)  # f16 output rounding
            w = torch.rand(2, 7)
            acc = c.accumulate(w, ref[1])
            self.assertEqual(acc.dtype, torch.float32)
            np.testing.assert_array_equal(acc.numpy(), c.accumulate(w.numpy(), ref[1]))
            out = torch.ones(2, 64)
            self.assertIs(c.accumulate(w, ref[1], out=out), out)  # in place in the tensor
            np.testing.assert_allclose(out.numpy(), acc.numpy() + 1, rtol=1e-6, atol=1e-6)

    def test_refused_tensors(self):
        c = kvq.Codec("int8", 16)
        e = c.encode(torch.randn(3, 16))
        for bad in (torch.ones(3, 16, dtype=torch.int32), torch.ones(3, 16, dtype=torch.bool),
                    torch.ones(3, 16, dtype=torch.complex64), torch.empty(3, 16, device="meta"),
                    torch.ones(3, 16, dtype=torch.float64)):
            with self.assertRaises(TypeError, msg=str(bad.dtype)):
                c.encode(bad)
        with self.assertRaises(TypeError) as cm:  # float64 is not cast: the message says how
            c.encode(torch.ones(3, 16, dtype=torch.float64))
        self.assertIn("torch.float64", str(cm.exception))
        self.assertIn("x.float()", str(cm.exception))
        for bad in (e.float(), e.to(torch.int64) + 256, e.to(torch.int8)):
            with self.assertRaises(TypeError, msg=str(bad.dtype)):
                c.decode(bad)
        with self.assertRaises(TypeError) as cm:
            c.encode(torch.empty(3, 16, device="meta"))
        self.assertIn(".cpu()", str(cm.exception))
        with self.assertRaises(TypeError):
            c.encode(torch.randn(3, 16).to_sparse())
        cache = kvq.KVCache(layers=1, kv_heads=2, head_dim=16, max_tokens=8)
        with self.assertRaises(TypeError):
            cache.append(0, torch.randn(2, 2, 16), torch.randn(2, 2, 16),
                         positions=torch.tensor([0.0, 1.0]))
        with self.assertRaises(TypeError):
            cache.append(torch.tensor(0.0), torch.randn(2, 2, 16), torch.randn(2, 2, 16))
        self.assertEqual(cache.tokens(0), 0)

    def test_cache(self):
        r = np.random.default_rng(52)
        H, QH, d, n = 2, 4, 32, 40
        K, V, Q = gauss(r, n, H, d), gauss(r, n, H, d), gauss(r, 3, QH, d)
        qpos = [10, 25, 39]
        kw = dict(layers=1, kv_heads=H, q_heads=QH, head_dim=d, max_tokens=64, k_codec="int8",
                  v_codec="int8")
        ref_cache = kvq.KVCache(**kw)
        ref_cache.append(0, K, V)
        ref, ref_ta = ref_cache.attend(0, Q, qpos, return_token_attention=True)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            with self.subTest(dtype=dt):
                c = kvq.KVCache(**kw)
                kt, vt = torch.from_numpy(K).to(dt), torch.from_numpy(V).to(dt)
                c.append(0, kt, vt, torch.arange(n))
                k, v = c.get_kv(0, as_torch=True)
                self.assertIsInstance(k, torch.Tensor)
                # staged in f16 until the attend: the tensor's values rounded
                # to f16 (exact for float16, and for bfloat16 too: its 8-bit
                # mantissa fits f16's 11 and these N(0,1) values its range)
                np.testing.assert_array_equal(k.numpy(), kt.float().numpy().astype(
                    np.float16).astype(np.float32))
                out, ta = c.attend(0, torch.from_numpy(Q).to(dt), torch.tensor(qpos),
                                   return_token_attention=True)
                self.assertEqual(out.dtype, dt)
                self.assertEqual(tuple(out.shape), (3, QH, d))
                self.assertIsInstance(ta, torch.Tensor)
                if dt == torch.float32:
                    np.testing.assert_array_equal(out.numpy(), ref)
                    np.testing.assert_array_equal(ta.numpy(), ref_ta)
                else:
                    # the inputs rounded to 8 (bf16) or 11 (f16) bits, and the output
                    eps = 2.0 ** (-8 if dt == torch.bfloat16 else -11)
                    err = np.abs(out.float().numpy() - ref).max()
                    self.assertLess(err, 40 * eps * np.abs(ref).max())
                self.assertEqual(c.positions(0, as_torch=True).dtype, torch.int32)
                k16, _ = c.get_kv(0, as_torch=torch.float16)
                self.assertEqual(k16.dtype, torch.float16)
                c.observe_attention(0, torch.from_numpy(ref_ta).to(dt), n_queries=3)

    def test_compat(self):
        r = np.random.default_rng(53)
        k = torch.from_numpy(gauss(r, 2, 3, 20, 64)).to(torch.bfloat16)
        v = torch.from_numpy(gauss(r, 2, 3, 20, 64)).to(torch.bfloat16)
        comp = kvq.KVCompressor(k_codec="int8", v_codec="int8")
        c = comp.compress(k, v)
        self.assertEqual(c.original_bytes, 2 * k.numel() * 2)  # bf16: 2 bytes per value
        kd, vd = comp.decompress(c)
        self.assertEqual((kd.dtype, tuple(kd.shape)), (torch.bfloat16, tuple(k.shape)))
        rel = ((kd.float() - k.float()).norm() / k.float().norm()).item()
        self.assertLess(rel, 0.02)  # int8 (1e-2 rel.) on top of bf16's own 2^-8
        kd32, _ = comp.decompress(c, dtype=torch.float32)
        self.assertEqual(kd32.dtype, torch.float32)

        H, QH, d = 2, 4, 16
        ac = kvq.AdaptiveKVCache(heads=H, head_dim=d, budget=8, q_heads=QH, k_codec="f16",
                                 v_codec="f16", sinks=1, protect_recent=2)
        for t in range(12):
            w = torch.softmax(torch.randn(QH, min(t, 8) + 1), dim=-1)  # kept + new
            ac.update(torch.randn(H, 1, d), torch.randn(H, 1, d), attention_weights=w)
        self.assertEqual(len(ac), 8)
        kk, vv = ac.get_kv()
        self.assertIsInstance(kk, torch.Tensor)
        self.assertEqual(tuple(kk.shape), (H, 8, d))
        out = ac.attend(torch.randn(QH, d, dtype=torch.float16))
        self.assertEqual((out.dtype, tuple(out.shape)), (torch.float16, (QH, d)))

    def test_model_tokens_as_tensor(self):
        path = os.path.join(os.environ.get("KVQ_DATA") or os.path.join(REPO, "..", "shared",
                                                                          "data"),
                            "stories260K", "stories260K.bin")
        if not os.path.exists(path):
            self.skipTest("model data not found (set KVQ_DATA)")
        m = kvq.Model(path)
        ids = [1, 403, 407, 261, 378]
        a = m.forward(m.cache(k_codec="f32", v_codec="f32"), ids)
        b = m.forward(m.cache(k_codec="f32", v_codec="f32"), torch.tensor(ids))
        self.assertIsInstance(b, torch.Tensor)
        np.testing.assert_array_equal(b.numpy(), a)
        with self.assertRaises(TypeError):
            m.forward(m.cache(), torch.tensor([1.0, 2.0]))


if __name__ == "__main__":
    unittest.main()
