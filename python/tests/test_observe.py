"""Attention computed outside kvq drives its eviction:
KVCache.observe_attention (kvq_cache_observe_attention) and
AdaptiveKVCache.update(key, value, attention_weights).

A cache given the token attention of another cache's attend through
observe_attention must evolve exactly as that cache (same float operations:
positions, bytes and counters equal after every step). Weights that rank the
tokens clearly must keep the tokens they favour, in every accepted layout;
weights that are not softmax probabilities, of the wrong shape or dtype,
leave the cache unchanged.
"""

import os
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import kvq  # noqa: E402


def gauss(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


def softmax_rows(s):
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def state(c, layers):
    """What a caller can see of a cache (bytes_read aside: attend reads
    pages, observe does not)."""
    out = []
    for layer in range(layers):
        s = c.stats(layer)
        s.pop("bytes_read")
        out.append((c.positions(layer).tolist(), s))
    return out


class TestObserve(unittest.TestCase):
    def test_twin_of_attend(self):
        """observe(token_attn of an attend) leaves what that attend left."""
        r = np.random.default_rng(31)
        L, H, QH, d = 2, 2, 6, 16
        for kc, vc, budget, window in (("int8", "tq3", 20, 0), ("f16", "int4", 33, 3)):
            with self.subTest(k=kc, v=vc):
                kw = dict(layers=L, kv_heads=H, q_heads=QH, head_dim=d, max_tokens=200,
                          k_codec=kc, v_codec=vc, policy="utility", budget=budget, sinks=2,
                          protect_recent=4, page=8, recent_window=window)
                a, b = kvq.KVCache(**kw), kvq.KVCache(**kw)
                nxt, step = 0, 0
                while nxt < 90:
                    m = 25 if step == 0 else 1 + step % 3
                    pos = np.arange(nxt, nxt + m)
                    nxt += m
                    for layer in range(L):
                        k, v, q = gauss(r, m, H, d), gauss(r, m, H, d), 1.5 * gauss(r, m, QH, d)
                        a.append(layer, k, v, pos)
                        b.append(layer, k, v, pos)
                        _, ta = a.attend(layer, q, pos, return_token_attention=True)
                        b.observe_attention(layer, ta, n_queries=m)
                    self.assertEqual(state(a, L), state(b, L), "step %d" % step)
                    step += 1
                self.assertEqual(a.tokens(0), budget)
                self.assertGreater(a.stats()["tokens_evicted"], 0)
                q = gauss(r, 1, QH, d)
                for layer in range(L):
                    np.testing.assert_array_equal(a.attend(layer, q, nxt - 1),
                                                  b.attend(layer, q, nxt - 1))

    def test_layouts_rank_tokens(self):
        """Ten tokens; sink 0 and the newest are kept; the weights decide
        which four of 1..8 go (the least attended: 2, 5, 6, 8), whether
        given per query head, per KV head, per query or summed."""
        H, QH, d = 2, 4, 8
        a = np.array([0.25, 0.2, 0.025, 0.25, 0.2, 0.05, 0.075, 0.25, 0.1, 0.25])
        share = np.array([0.1, 0.2, 0.3, 0.4])  # of a token's weight per query head
        per_q = (share[:, None] * a[None, :]).astype(np.float32)          # [QH, n]
        per_kv = per_q.reshape(H, QH // H, 10).sum(axis=1)                # [H, n]
        two = np.stack([per_q * 0.5, per_q * 1.5])                        # 2 queries
        layouts = {"query heads": (per_q, None), "KV heads": (per_kv, None),
                   "per query": (two, None), "summed": (two.sum(axis=0), 2)}
        for name, (w, nq) in layouts.items():
            with self.subTest(layout=name):
                c = kvq.KVCache(layers=1, kv_heads=H, q_heads=QH, head_dim=d, max_tokens=16,
                                k_codec="f32", v_codec="f32", policy="utility", budget=6,
                                sinks=1, protect_recent=1)
                c.append(0, np.ones((10, H, d), np.float32), np.ones((10, H, d), np.float32))
                self.assertEqual(c.tokens(0), 10)  # nothing goes before attention
                c.observe_attention(0, w, nq)
                self.assertEqual(c.positions(0).tolist(), [0, 1, 3, 4, 7, 9])

    def test_bad_weights_leave_the_cache(self):
        r = np.random.default_rng(32)
        H, QH, d, n = 2, 4, 8, 30
        c = kvq.KVCache(layers=1, kv_heads=H, q_heads=QH, head_dim=d, max_tokens=64,
                        k_codec="int8", v_codec="int8", policy="utility", budget=12, sinks=2,
                        protect_recent=2)
        c.append(0, gauss(r, n, H, d), gauss(r, n, H, d))
        before = state(c, 1)
        good = softmax_rows(gauss(r, 3, QH, n))
        shape_errors = [good[:, :, :-1], good[:, :3], good[0, 0], good[None],
                        np.ones((5, n), np.float32)]
        for w in shape_errors:
            with self.assertRaises(kvq.KvqShapeError, msg=str(np.shape(w))):
                c.observe_attention(0, w)
        with self.assertRaises(kvq.KvqShapeError):
            c.observe_attention(0, good, n_queries=2)  # 3 queries in the array
        with self.assertRaises(kvq.KvqShapeError):
            c.observe_attention(0, good.sum(axis=0), n_queries=0)
        c_errors = {
            "NaN": (np.where(np.arange(n) == 7, np.nan, good[0]), kvq.Status.ERR_NONFINITE,
                    "weights["),
            "negative": (good[0] - 0.01, kvq.Status.ERR_RANGE, ">= 0"),
            "scores": (gauss(r, QH, n) + 3.0, kvq.Status.ERR_RANGE, "sums to"),
            "2 queries as 1": (good[:2].sum(axis=0), kvq.Status.ERR_RANGE, "sums to"),
        }
        for name, (w, status, text) in c_errors.items():
            with self.subTest(error=name):
                with self.assertRaises(kvq.KvqError) as cm:
                    c.observe_attention(0, w)
                self.assertEqual(cm.exception.status, status)
                self.assertIn(text, cm.exception.detail)
                self.assertEqual(state(c, 1), before)
        # the same weights, right: evicts to the budget and settles
        c.observe_attention(0, good)
        self.assertEqual(c.tokens(0), 12)
        self.assertLess(c.stats(0)["payload_bytes"], before[0][1]["payload_bytes"])


class TestAdaptiveWeights(unittest.TestCase):
    """update(key, value, attention_weights): the prototype's API. The
    caller attends with its own full-precision keys over the tokens the
    cache keeps (positions()) and the new one."""

    def run_decode(self, weights_of, steps=80, layout=lambda w: w):
        r = np.random.default_rng(41)
        H, QH, d = 2, 4, 16
        u = np.zeros(d, np.float32)
        u[5] = 1.0
        ac = kvq.AdaptiveKVCache(heads=H, head_dim=d, budget=24, q_heads=QH, k_codec="int8",
                                 v_codec="int8", sinks=2, protect_recent=4)
        keys = []
        for t in range(steps):
            k = 0.1 * gauss(r, H, 1, d)
            if t == 20:
                k[:, 0] = 5.0 * u  # the token every query attends to
            keys.append(k[:, 0])
            kept = np.r_[ac.positions(), t].astype(int)
            K = np.stack([keys[p] for p in kept], axis=1)            # [H, n, d]
            q = np.tile(10.0 * u, (QH, 1))
            w = weights_of(q, K, QH // H)                             # [QH, n]
            self.assertIsNone(ac.update(k, gauss(r, H, 1, d), attention_weights=layout(w)))
            self.assertLessEqual(len(ac), 24)
        return ac

    @staticmethod
    def attention(q, K, G):
        s = np.einsum("hd,hnd->hn", q, np.repeat(K, G, axis=0)) / np.sqrt(q.shape[-1])
        return softmax_rows(s).astype(np.float32)

    @staticmethod
    def uniform(q, K, G):
        n = K.shape[1]
        return np.full((q.shape[0], n), 1.0 / n, np.float32)

    def test_weights_drive_eviction(self):
        ac = self.run_decode(self.attention)
        pos = ac.positions().tolist()
        self.assertIn(20, pos)  # the attended token survived
        self.assertEqual(pos[:2], [0, 1])
        self.assertEqual(pos[-4:], [76, 77, 78, 79])
        s = ac.stats()
        self.assertEqual(s["tokens"], 24)
        self.assertEqual(s["observed_weights"], 80)
        self.assertEqual(s["tokens_evicted"], 80 - 24)
        # the same run with weights that favour nothing: token 20 goes (the
        # weights, not the keys, decided)
        self.assertNotIn(20, self.run_decode(self.uniform).positions().tolist())

    def test_weight_layouts(self):
        # per KV head (summed over the group), with a query axis, with a batch axis
        layouts = {
            "KV heads": lambda w: w.reshape(2, 2, -1).sum(axis=1),
            "queries axis": lambda w: w[:, None, :],
            "batch axis": lambda w: w[None, :, None, :],
        }
        for name, f in layouts.items():
            with self.subTest(layout=name):
                pos = self.run_decode(self.attention, steps=40, layout=f).positions().tolist()
                self.assertIn(20, pos)
                self.assertEqual(len(pos), 24)

    def test_prefill_chunk(self):
        r = np.random.default_rng(42)
        H, d, n = 2, 16, 30
        ac = kvq.AdaptiveKVCache(heads=H, head_dim=d, budget=12, k_codec="f16", v_codec="f16",
                                 sinks=1, protect_recent=2)
        K = gauss(r, H, n, d)
        s = np.einsum("hqd,hnd->hqn", K, K) / np.sqrt(d)
        s = np.where(np.arange(n)[None, None, :] <= np.arange(n)[None, :, None], s, -np.inf)
        s[:, :, 9] += 30.0 * (np.arange(n) >= 9)[None, :]  # everyone after 9 attends to 9
        w = softmax_rows(s)                                   # (heads, queries, tokens), causal
        ac.update(K, gauss(r, H, n, d), attention_weights=w)
        pos = ac.positions().tolist()
        self.assertEqual(len(pos), 12)
        self.assertIn(9, pos)
        self.assertEqual(pos[0], 0)
        self.assertEqual(pos[-2:], [28, 29])

    def test_refused_updates_change_nothing(self):
        r = np.random.default_rng(43)
        H, QH, d = 2, 4, 8
        ac = kvq.AdaptiveKVCache(heads=H, head_dim=d, budget=8, q_heads=QH, k_codec="int8",
                                 v_codec="int8", sinks=1, protect_recent=2)
        for t in range(5):
            ac.update(gauss(r, H, 1, d), gauss(r, H, 1, d),
                      attention_weights=np.full((QH, t + 1), 1.0 / (t + 1), np.float32))
        before = state(ac.cache, 1)
        k, v = gauss(r, H, 1, d), gauss(r, H, 1, d)
        good = np.full((QH, 6), 1 / 6, np.float32)
        bad = {
            "width (weights before the append)": (np.full((QH, 5), 0.2, np.float32),
                                                   kvq.KvqShapeError),
            "rows": (np.full((3, 6), 1 / 6, np.float32), kvq.KvqShapeError),
            "NaN": (np.where(np.arange(6) == 2, np.nan, good), kvq.KvqError),
            "negative": (good - 0.2, kvq.KvqError),
            "logits": (gauss(r, QH, 6) + 2.0, kvq.KvqError),
            "int dtype": (np.ones((QH, 6), np.int64), TypeError),
        }
        for name, (w, err) in bad.items():
            with self.subTest(error=name):
                with self.assertRaises(err):
                    ac.update(k, v, attention_weights=w)
                self.assertEqual(state(ac.cache, 1), before)
        ac.update(k, v, attention_weights=good)
        self.assertEqual(ac.positions().tolist()[-1], 5)


if __name__ == "__main__":
    unittest.main()
