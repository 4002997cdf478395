#!/usr/bin/env python3
"""stories15M in PyTorch with its KV cache held by kvq.

The forward pass of a llama2.c checkpoint (karpathy's tinyllamas
stories15M: dim 288, 6 layers, 6 heads, head_dim 48, vocab 32000) written in
PyTorch, as src/model/model.c computes it: token embedding, then per layer
RMSNorm (eps 1e-5), the q/k/v projections, RoPE on interleaved pairs
(theta 10000), attention, the output projection and the residual, RMSNorm
and a SwiGLU feed-forward (w2(silu(w1 x) * w3 x)) and the residual; a final
RMSNorm and the classifier shared with the embedding. The keys and values
go into a kvq.KVCache through the binding (torch tensors, passed without a
copy) and kvq attends over them, compressed as the codecs say
(--attention torch instead computes attention in PyTorch over the K/V kvq
holds and gives kvq the weights through observe_attention, as an engine
with its own attention kernels would).

It then measures what `kvq eval` measures, the same way: each story (one
per non-empty line, BOS first, at most seq_len tokens) is run once through
an f32 cache in one chunk for the reference logits, then decoded token by
token (after an optional --prefill chunk) through the cache under test, and
every prediction is compared with the reference: mean NLL and perplexity,
ΔNLL and KL(f32 || kvq) with their standard errors, the KL median, p99 and
maximum (on logits quantized as `kvq eval` does), top-1 agreement, the
change of the f32 top token's probability, and the cache's bits per value.

    examples/torch_stories15M.py --max-lines 2                       # f32 cache
    examples/torch_stories15M.py --max-lines 2 --k-codec int8 --v-codec int8
    examples/torch_stories15M.py --check --max-lines 2               # against build/kvq eval

--check runs an f32 cache and the --k-codec/--v-codec cache (int8 by
default) here and with `kvq eval --json` on the same stories, prints both,
and fails (exit 1) unless: the f32 cache's NLLs agree within 1e-4 nats;
for the compressed cache, the per-token NLLs of libkvq's own forward (what
kvq eval runs; their mean equals its NLL) and of this one differ by no
more than float rounding explains: the two forwards compute K/V that agree
to about 1e-6, but a lossy codec rounds a value lying that close to a code
boundary the other way, and the predictions after it move by a fraction of
the codec's own error, so the two runs' NLLs differ by noise (about 0.004
nats per token for int8, 20% of what int8 itself changes); the mean of the
per-token differences must lie within 4 standard errors (batch means over
16 tokens) + 1e-4 of zero, which a systematic difference (a wrong RoPE,
keys given pre-RoPE, f16-rounded values) would not. The cache's tokens and
bits per value must match. It ends with "N passed, N failed".

Needs numpy and torch (Debian python3-numpy, python3-torch) and libkvq
(build/libkvq.so of this clone, $KVQ_LIB, or an installed one).
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))  # this clone's binding, when run from it

try:
    import numpy as np
    import torch
except ImportError as e:
    WHY = ("torch_stories15M.py needs numpy and PyTorch for %s (Debian: apt-get install "
           "python3-numpy python3-torch): %s" % (sys.executable, e))
    if os.environ.get("KVQ_ALLOW_SKIP") == "1":  # as python/tests/run.py
        print("SKIPPED: %s (KVQ_ALLOW_SKIP=1)\n0 passed, 0 failed" % WHY)
        sys.exit(0)
    sys.exit(WHY)

import kvq  # noqa: E402

# ---- the model -------------------------------------------------------------------------


class Llama2c:
    """A llama2.c checkpoint in the legacy layout: 7 int32 (dim, hidden_dim,
    n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative
    vocab_size: the classifier is not shared), then float32 weights:
    embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, the
    unused freq_cis table (seq_len * head_dim), [classifier]."""

    def __init__(self, path):
        with open(path, "rb") as fh:
            head = fh.read(28)
            if len(head) != 28:
                raise ValueError("%s: shorter than a llama2.c header" % path)
            dim, hidden, L, nh, nkv, vocab, seq = struct.unpack("<7i", head)
            w = np.fromfile(fh, dtype="<f4")
        shared = vocab > 0
        vocab = abs(vocab)
        hd = dim // nh
        kvd = nkv * hd
        sizes = [("emb", (vocab, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)),
                 ("wk", (L, kvd, dim)), ("wv", (L, kvd, dim)), ("wo", (L, dim, dim)),
                 ("rms_ffn", (L, dim)), ("w1", (L, hidden, dim)), ("w2", (L, dim, hidden)),
                 ("w3", (L, hidden, dim)), ("rms_final", (dim,)), ("freq_cis", (seq * hd,))]
        if not shared:
            sizes.append(("wcls", (vocab, dim)))
        need = sum(int(np.prod(s)) for _, s in sizes)
        if w.size != need:
            raise ValueError("%s: the header's shape needs %d floats, the file has %d"
                             % (path, need, w.size))
        off = 0
        for name, shape in sizes:
            n = int(np.prod(shape))
            setattr(self, name, torch.from_numpy(w[off:off + n].reshape(shape)))
            off += n
        if shared:
            self.wcls = self.emb
        self.dim, self.hidden, self.n_layers = dim, hidden, L
        self.n_heads, self.n_kv_heads, self.head_dim = nh, nkv, hd
        self.vocab_size, self.seq_len = vocab, seq
        # RoPE frequencies as model.c computes them: 10000^(-i/head_dim), i even, in float32
        i = torch.arange(0, hd, 2, dtype=torch.float32)
        self.freq = 1.0 / torch.pow(torch.tensor(10000.0), i / hd)

    def cache(self, **options):
        """A kvq cache of this model's shape; options are KVCache keywords."""
        return kvq.KVCache(layers=self.n_layers, kv_heads=self.n_kv_heads,
                           q_heads=self.n_heads, head_dim=self.head_dim,
                           max_tokens=self.seq_len, **options)

    @staticmethod
    def linear(x, w):
        """x [n, in] times the rows of w [out, in] (llama2.c's matmul); one
        token as a matrix-vector product, which generic BLAS does faster."""
        return torch.mv(w, x[0])[None] if x.shape[0] == 1 else x @ w.T

    @staticmethod
    def rmsnorm(x, w):
        ss = (x * x).mean(dim=-1, keepdim=True) + 1e-5
        return w * (x * torch.rsqrt(ss))

    def rope(self, x, pos):
        """x [n, heads, head_dim]: pairs (2i, 2i+1) rotated by pos * freq_i."""
        ang = pos.to(torch.float32)[:, None] * self.freq[None, :]      # [n, hd/2]
        c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)

    def attention_torch(self, cache, layer, q, pos):
        """Attention computed here over the K/V the cache holds (decoded, as
        kvq's own attention reads them), its weights handed to kvq."""
        k, v = cache.get_kv(layer, as_torch=True)                      # [m, H, hd]
        kpos = cache.positions(layer, as_torch=True).to(torch.int64)   # [m]
        G = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(G, dim=1)                              # [m, QH, hd]
        v = v.repeat_interleave(G, dim=1)
        s = torch.einsum("nhd,mhd->nhm", q, k) / math.sqrt(self.head_dim)
        s = s.masked_fill(kpos[None, None, :] > pos[:, None, None], float("-inf"))
        w = torch.softmax(s, dim=-1)                                   # [n, QH, m]
        cache.observe_attention(layer, w)
        return torch.einsum("nhm,mhd->nhd", w, v)

    @torch.no_grad()
    def forward(self, cache, tokens, pos0, attention="kvq"):
        """Logits [n, vocab] of tokens at positions pos0..; their K/V are
        appended to the cache, layer by layer, and attention runs on it."""
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        n = tokens.shape[0]
        pos = torch.arange(pos0, pos0 + n, dtype=torch.int64)
        H, QH, hd = self.n_kv_heads, self.n_heads, self.head_dim
        x = self.emb[tokens]
        for layer in range(self.n_layers):
            xb = self.rmsnorm(x, self.rms_att[layer])
            q = self.rope(self.linear(xb, self.wq[layer]).view(n, QH, hd), pos)
            k = self.rope(self.linear(xb, self.wk[layer]).view(n, H, hd), pos)
            v = self.linear(xb, self.wv[layer]).view(n, H, hd)
            cache.append(layer, k, v, pos)  # contiguous float32: kvq reads them in place
            if attention == "kvq":
                att = cache.attend(layer, q, pos)
            else:
                att = self.attention_torch(cache, layer, q, pos)
            x = x + self.linear(att.reshape(n, self.dim), self.wo[layer])
            xb = self.rmsnorm(x, self.rms_ffn[layer])
            h = (torch.nn.functional.silu(self.linear(xb, self.w1[layer]))
                 * self.linear(xb, self.w3[layer]))
            x = x + self.linear(h, self.w2[layer])
        return self.linear(self.rmsnorm(x, self.rms_final), self.wcls)


# ---- what kvq eval measures -------------------------------------------------------------

REF_RANGE = 32.0                 # tools/evalref.h: log-probabilities kept to 32 nats below the top
REF_STEP = REF_RANGE / 65535.0   # in 65536 codes


def summarize(logits):
    """(max, log-sum-exp, index of the first maximum) in float64."""
    x = logits.astype(np.float64)
    top = int(np.argmax(x))
    mx = x[top]
    return mx, mx + math.log(np.exp(x - mx).sum()), top


def codes(logits, mx):
    q = (mx - logits.astype(np.float64)) / REF_STEP + 0.5
    return np.minimum(np.floor(q), 65535.0)


def kl_codes(a, b):
    """KL(P || Q) of the distributions exp(-a step), exp(-b step) as
    tools/evalref.c computes it from the codes."""
    wa, wb = np.exp(-a * REF_STEP), np.exp(-b * REF_STEP)
    sa, sb = wa.sum(), wb.sum()
    return (wa * (b - a)).sum() * REF_STEP / sa + math.log(sb) - math.log(sa)


class Figures:
    """Per-token comparisons with the reference, and the cache's bytes."""

    def __init__(self):
        self.kl, self.dnll, self.nll, self.nll_ref, self.top1, self.dp, self.kept = ([] for _ in
                                                                                     range(7))
        self.bits = self.vals = self.asym = self.fixed = self.total_bits = 0.0
        self.sequences = 0

    def token(self, ref, logits, nxt, kept):
        rmx, rlse, rtop = summarize(ref)
        mx, lse, top = summarize(logits)
        nll_ref = rlse - float(ref[nxt])
        nll = lse - float(logits[nxt])
        self.nll.append(nll)
        self.nll_ref.append(nll_ref)
        self.dnll.append(nll - nll_ref)
        self.top1.append(top == rtop)
        self.dp.append(abs(math.exp(float(logits[rtop]) - lse) - math.exp(rmx - rlse)))
        self.kl.append(kl_codes(codes(ref, rmx), codes(logits, mx)))
        self.kept.append(kept)

    def cache(self, c, heads, head_dim):
        s = c.stats()
        self.bits += s["payload_bytes"] * 8.0
        self.vals += s["tokens"] * heads * head_dim * 2.0
        self.asym += s["asymptotic_bits_per_value"]
        self.fixed += s["fixed_bytes"]
        self.total_bits += s["stored_bytes"] * 8.0
        self.sequences += 1

    def result(self, prefill):
        n = len(self.nll)

        def mean_se(x):
            x = np.asarray(x, np.float64)
            return x.mean(), (x.std(ddof=1) / math.sqrt(n) if n > 1 else 0.0)

        kl = np.sort(np.asarray(self.kl))

        def quantile(q):
            h = (n - 1) * q
            i = int(h)
            return kl[i] + (h - i) * (kl[i + 1] - kl[i]) if i + 1 < n else kl[n - 1]

        dnll, dnll_se = mean_se(self.dnll)
        klm, kl_se = mean_se(self.kl)
        nll, nll_ref = float(np.mean(self.nll)), float(np.mean(self.nll_ref))
        seqs = max(self.sequences, 1)
        return {
            "nll_f32": nll_ref, "nll": nll, "ppl_f32": math.exp(nll_ref), "ppl": math.exp(nll),
            "kl": klm, "top1_agree": float(np.mean(self.top1)),
            "bits_per_value": self.bits / self.vals if self.vals else 0.0, "tokens": n,
            "delta_nll": dnll, "delta_nll_stderr": dnll_se, "kl_stderr": kl_se,
            "kl_median": quantile(0.5), "kl_p99": quantile(0.99), "kl_max": float(kl[-1]),
            "dp_top_mean_abs": float(np.mean(self.dp)),
            "asymptotic_bits_per_value": self.asym / seqs,
            "fixed_bytes_per_sequence": self.fixed / seqs,
            "tokens_kept_mean": float(np.mean(self.kept)), "sequences": self.sequences,
            "prefill": prefill,
            "total_bits_per_value": self.total_bits / self.vals if self.vals else 0.0,
        }


def read_stories(path, skip, max_lines):
    """The non-empty lines (a trailing \\r dropped), as kvq eval reads them."""
    with open(path, "rb") as fh:
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in fh.read().split(b"\n")]
    lines = [ln for ln in lines if ln]
    lines = lines[skip:]
    return lines[:max_lines] if max_lines else lines


def story_ids(tok, stories, seq_len):
    """Each story's tokens (BOS first, at most seq_len); stories of fewer
    than two tokens have nothing to predict and are left out."""
    out = []
    for text in stories:
        ids = tok.encode(text.decode("utf-8"), bos=True)[:seq_len]
        if len(ids) >= 2:
            out.append(ids)
    return out


def evaluate(model, tok, stories, cache_options, prefill=0, attention="kvq", refs=None):
    """kvq eval's measurement of one cache configuration, in PyTorch.
    Returns the figures and every prediction's NLL (story by story). refs
    (a dict) keeps the f32 reference logits for the next configuration."""
    fig = Figures()
    H, hd, S = model.n_kv_heads, model.head_dim, model.seq_len
    seqs = story_ids(tok, stories, S)
    for si, ids in enumerate(seqs):
        n = len(ids)
        # the reference: one chunk through an f32 cache
        ref = None if refs is None else refs.get(si)
        if ref is None:
            ref = model.forward(model.cache(k_codec="f32", v_codec="f32"), ids, 0).numpy()
            if refs is not None:
                refs[si] = ref
        c = model.cache(**cache_options)
        pe = min(prefill, n)
        if pe:
            lg = model.forward(c, ids[:pe], 0, attention).numpy()
            for t in range(min(pe, n - 1)):
                fig.token(ref[t], lg[t], ids[t + 1], t + 1)  # query t sees 0..t
        held = c.tokens(0)
        for t in range(pe, n):
            lg = model.forward(c, ids[t:t + 1], t, attention)
            if t + 1 < n:
                fig.token(ref[t], lg[0].numpy(), ids[t + 1], held + 1)
            held = c.tokens(0)
        fig.cache(c, H, hd)
    return fig.result(prefill), fig.nll


def nll_c_runner(path, tok, stories, cache_options, prefill=0):
    """Every prediction's NLL from libkvq's own forward (kvq_model_forward,
    what `kvq eval` runs) through the same cache, decoded the same way."""
    m = kvq.Model(path)
    seq_len = m.info["seq_len"]
    out = []
    for ids in story_ids(tok, stories, seq_len):
        n = len(ids)
        c = m.cache(**cache_options)
        pe = min(prefill, n)
        rows = []
        if pe:
            rows += list(m.forward(c, ids[:pe], 0)[:n - 1])
        for t in range(pe, n):
            lg = m.forward(c, ids[t:t + 1], pos0=t, last_only=True, logits=t + 1 < n)
            if lg is not None:
                rows.append(lg)
        for t, lg in enumerate(rows):
            mx, lse, _ = summarize(lg)
            out.append(lse - float(lg[ids[t + 1]]))
    return out


def paired_bound(d, block=16):
    """4 standard errors of the mean of the per-token differences d between
    two runs, by batch means over blocks of `block` consecutive tokens
    (tokens of a story are correlated: a code rounded the other way in one
    run moves the predictions after it, so the plain standard error would
    be too small). Under no systematic difference the mean lies within it
    with probability about 1 - 6e-5 (normal blocks)."""
    d = np.asarray(d, np.float64)
    nb = len(d) // block
    if nb < 2:
        return 4.0 * d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    means = d[:nb * block].reshape(nb, block).mean(axis=1)
    return 4.0 * means.std(ddof=1) / math.sqrt(nb)


def print_table(r, desc):
    print("torch_stories15M: %d sequences, %d predicted tokens, %s; cache %s"
          % (r["sequences"], r["tokens"], "prefill %d then decoding" % r["prefill"]
             if r["prefill"] else "decoding token by token", desc))
    row = "  %-30s %12s %12s"
    print(row % ("", "f32 cache", "kvq cache"))
    print("  %-30s %12.5f %12.5f" % ("mean NLL (nats)", r["nll_f32"], r["nll"]))
    print("  %-30s %12.4f %12.4f" % ("perplexity", r["ppl_f32"], r["ppl"]))
    print("  %-30s %12s %+12.5f +- %.5f" % ("delta NLL (nats)", "", r["delta_nll"],
                                            r["delta_nll_stderr"]))
    print("  %-30s %12s %12.5f +- %.5f" % ("KL(f32 || kvq) mean", "", r["kl"], r["kl_stderr"]))
    print("  %-30s %12s %12.5f %12.5f %12.5f" % ("KL median, p99, max", "", r["kl_median"],
                                                 r["kl_p99"], r["kl_max"]))
    print("  %-30s %12s %12.4f" % ("top-1 agreement", "", r["top1_agree"]))
    print("  %-30s %12s %12.5f" % ("mean |dp| of the f32 top token", "", r["dp_top_mean_abs"]))
    print("  %-30s %12.2f %12.3f" % ("bits per value (payload)", 32.0, r["bits_per_value"]))
    print("  %-30s %12s %12.3f" % ("bits per value (asymptotic)", "",
                                   r["asymptotic_bits_per_value"]))
    print("  %-30s %12s %12.0f" % ("fixed bytes per sequence", "", r["fixed_bytes_per_sequence"]))
    print("  %-30s %12s %12.3f" % ("bits per value (all bytes)", "", r["total_bits_per_value"]))
    print("  %-30s %12s %12.1f" % ("tokens kept (layer 0, mean)", "", r["tokens_kept_mean"]))


# ---- --check: the same figures from kvq eval ----------------------------------------------

def kvq_eval(exe, args, codecs):
    cmd = [exe, "eval", "--model", args.model, "--tokenizer", args.tokenizer, "--text", args.text,
           "--skip", str(args.skip), "--json", "--k-codec", codecs[0], "--v-codec", codecs[1]]
    if args.max_lines:
        cmd += ["--max-lines", str(args.max_lines)]
    if args.prefill:
        cmd += ["--prefill", str(args.prefill)]
    cmd += cache_cli(args)
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s failed (exit %d): %s" % (" ".join(cmd), out.returncode, out.stderr.strip()))
    return json.loads(out.stdout.strip().splitlines()[-1]), " ".join(cmd)


def cache_cli(args):
    out = []
    for opt, val in (("--policy", args.policy), ("--budget", args.budget),
                     ("--sinks", args.sinks), ("--window", args.window),
                     ("--recent", args.recent), ("--page", args.page)):
        if val is not None:
            out += [opt, str(val)]
    return out


def cache_options(args, k_codec, v_codec):
    o = {"k_codec": k_codec, "v_codec": v_codec}
    for key, val in (("policy", args.policy), ("budget", args.budget), ("sinks", args.sinks),
                     ("protect_recent", args.window), ("recent_window", args.recent),
                     ("page", args.page)):
        if val is not None:
            o[key] = val
    return o


def main(argv=None):
    examples = "\n".join(ln for ln in __doc__.splitlines() if ln.startswith("    examples/"))
    ap = argparse.ArgumentParser(
        description="stories15M in PyTorch with its KV cache in kvq; kvq eval's figures",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=examples)
    data = os.environ.get("KVQ_DATA") or os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                          "data"))
    ap.add_argument("--data", default=data, help="the shared data folder (stories15M/, text/); "
                                                 "default $KVQ_DATA or %(default)s")
    ap.add_argument("--model", help="the checkpoint (default DATA/stories15M/stories15M.bin)")
    ap.add_argument("--tokenizer", help="default DATA/stories15M/tokenizer.bin")
    ap.add_argument("--text", help="one story per line (default "
                                   "DATA/text/tinystories-valid-sample.txt)")
    ap.add_argument("--skip", type=int, default=0, help="lines to skip first")
    ap.add_argument("--max-lines", type=int, default=0, help="stories to run (0: all)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="the first N tokens of a story in one chunk, then decoding")
    ap.add_argument("--k-codec", default=None, help="key codec (f32 without --check; int8 with)")
    ap.add_argument("--v-codec", default=None, help="value codec (as --k-codec)")
    ap.add_argument("--policy", choices=("none", "window", "fifo", "utility"))
    ap.add_argument("--budget", type=int, help="tokens kept per layer under a policy")
    ap.add_argument("--sinks", type=int)
    ap.add_argument("--window", type=int, help="protected recent window of the policies")
    ap.add_argument("--recent", type=int, help="f16 recent window")
    ap.add_argument("--page", type=int, help="tokens per page")
    ap.add_argument("--attention", choices=("kvq", "torch"), default="kvq",
                    help="kvq attends (default), or PyTorch over kvq's K/V with the weights "
                         "given to kvq (observe_attention)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON line")
    ap.add_argument("--check", action="store_true",
                    help="also run build/kvq eval on the same stories (f32 and the codecs) "
                         "and fail unless the NLLs agree")
    ap.add_argument("--kvq", default=os.path.join(REPO, "build", "kvq"),
                    help="the kvq tool for --check (default %(default)s)")
    args = ap.parse_args(argv)
    for name in ("skip", "max_lines", "prefill", "threads"):
        if getattr(args, name) < 0 or (name == "threads" and args.threads == 0):
            ap.error("--%s must be %s" % (name.replace("_", "-"),
                                         "at least 1" if name == "threads" else ">= 0"))
    args.model = args.model or os.path.join(args.data, "stories15M", "stories15M.bin")
    args.tokenizer = args.tokenizer or os.path.join(args.data, "stories15M", "tokenizer.bin")
    args.text = args.text or os.path.join(args.data, "text", "tinystories-valid-sample.txt")
    for what in ("model", "tokenizer", "text"):
        if not os.path.isfile(getattr(args, what)):
            ap.error("--%s %s: no such file (--data names the shared data folder)"
                     % (what, getattr(args, what)))
    default = "int8" if args.check else "f32"
    kc, vc = args.k_codec or default, args.v_codec or default
    torch.set_num_threads(args.threads)

    model = Llama2c(args.model)
    tok = kvq.Tokenizer(args.tokenizer, model.vocab_size)
    stories = read_stories(args.text, args.skip, args.max_lines)
    if not stories:
        ap.error("%s: no story selected (--skip %d, --max-lines %d)"
                 % (args.text, args.skip, args.max_lines))
    lib = kvq.load()
    if not args.json:
        print("libkvq %s (%s), torch %s, %d thread(s), attention by %s"
              % (lib.version, lib.path, torch.__version__, args.threads, args.attention))

    if not args.check:
        t0 = time.time()
        r, _ = evaluate(model, tok, stories, cache_options(args, kc, vc), args.prefill,
                        args.attention)
        r["seconds"] = time.time() - t0
        if args.json:
            print(json.dumps(r))
        else:
            print_table(r, "K %s, V %s" % (kc, vc))
        return 0

    results, refs = {}, {}
    for codecs in (("f32", "f32"), (kc, vc)):
        t0 = time.time()
        opts = cache_options(args, *codecs)
        mine, nll_t = evaluate(model, tok, stories, opts, args.prefill, args.attention, refs)
        theirs, cmd = kvq_eval(args.kvq, args, codecs)
        nll_c = nll_c_runner(args.model, tok, stories, opts, args.prefill)
        results[codecs] = (mine, theirs, np.asarray(nll_t), np.asarray(nll_c))
        if not args.json:
            print("\n== K %s, V %s: PyTorch forward (kvq cache) vs %s  [%.1f s]"
                  % (codecs + (cmd, time.time() - t0)))
            print("  %-26s %14s %14s" % ("", "torch", "kvq eval"))
            for key in ("nll_f32", "nll", "delta_nll", "kl", "kl_max", "top1_agree",
                        "dp_top_mean_abs", "bits_per_value", "asymptotic_bits_per_value",
                        "fixed_bytes_per_sequence", "tokens_kept_mean", "tokens"):
                print("  %-26s %14.7g %14.7g  diff %.3g" % (key, mine[key], theirs[key],
                                                           mine[key] - theirs[key]))
    f32m, f32k, _, _ = results[("f32", "f32")]
    cm, ck, nt, nc = results[(kc, vc)]
    d = nt - nc if len(nt) == len(nc) else np.full(1, np.inf)
    name = "K %s V %s" % (kc, vc)
    checks = [
        ("f32 cache: NLL, torch vs kvq eval", f32m["nll"], f32k["nll"], 1e-4),
        ("f32 reference: NLL, torch vs kvq eval", f32m["nll_f32"], f32k["nll_f32"], 1e-4),
        # the per-token NLLs taken from libkvq's forward are kvq eval's (its
        # JSON prints 6 decimals)
        ("%s: NLL, libkvq forward vs kvq eval" % name, float(nc.mean()), ck["nll"], 1e-6),
        # the two compressed runs differ by float rounding that the codec
        # turns into codes rounded the other way now and then: their
        # per-token differences must have no mean beyond their noise
        ("%s: NLL, torch vs libkvq forward (paired)" % name, cm["nll"], float(nc.mean()),
         1e-4 + paired_bound(d)),
        # the mean KL(f32 || cache) of two runs without a systematic
        # difference lies within 4 of their combined standard errors (the
        # runs are positively correlated, so that overstates the spread)
        ("%s: KL, torch vs kvq eval" % name, cm["kl"], ck["kl"],
         1e-6 + 4.0 * math.hypot(cm["kl_stderr"], ck["kl_stderr"])),
    ]
    report = []
    for what, a, b, tol in checks:
        report.append({"check": what, "torch": a, "kvq_eval": b, "diff": a - b, "bound": tol,
                       "ok": bool(abs(a - b) <= tol)})
    # the cache holds the same tokens and bytes (kvq eval prints bits to 4
    # decimals, fixed bytes to 1, tokens kept to 3)
    for what, key, tol in (("tokens", "tokens", 0), ("bits per value", "bits_per_value", 5e-5),
                           ("asymptotic bits/value", "asymptotic_bits_per_value", 5e-5),
                           ("fixed bytes per sequence", "fixed_bytes_per_sequence", 0.05),
                           ("tokens kept", "tokens_kept_mean", 5e-4)):
        report.append({"check": "%s: %s" % (name, what), "torch": cm[key], "kvq_eval": ck[key],
                       "diff": cm[key] - ck[key], "bound": tol,
                       "ok": bool(abs(cm[key] - ck[key]) <= tol)})
    passed = sum(c["ok"] for c in report)
    failed = len(report) - passed
    summary = {"per_token_diff_mean": float(d.mean()), "per_token_diff_sd": float(d.std(ddof=1))
               if len(d) > 1 else 0.0, "per_token_diff_max": float(np.abs(d).max())}
    if args.json:
        print(json.dumps({"checks": report, "paired": summary,
                          "torch": {"f32": f32m, "compressed": cm},
                          "kvq_eval": {"f32": f32k, "compressed": ck}}))
    else:
        print("\n%s, torch - libkvq forward per token: mean %+.2e, sd %.2e, max |.| %.2e"
              % (name, summary["per_token_diff_mean"], summary["per_token_diff_sd"],
                 summary["per_token_diff_max"]))
        for c in report:
            print("%s %-48s %.7g vs %.7g  diff %+.2e  (bound %.2e)"
                  % ("PASS" if c["ok"] else "FAIL", c["check"], c["torch"], c["kvq_eval"],
                     c["diff"], c["bound"]))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
