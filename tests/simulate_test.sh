#!/bin/sh
# simulate_test.sh - `kvq simulate` before and around its run: every option
# is checked before any data is made (a bad codec, store or size is refused
# at once, with nothing on stdout and no progress line), the memory the run
# needs is estimated and a run that cannot fit is refused with the estimate
# and the limit, progress goes to stderr only when asked for (or on a
# terminal), and the text output gives every figure a meaning line and f32
# baselines beside it. The options' ranges, the f32 cache with the same
# eviction, the weight KL of an f32 cache (<= 1e-5 without eviction, equal
# to attn_kl_eviction_only with it, one query head per KV head) and the
# tiers are checked in cli_test.sh; they are not repeated here.
# Usage: sh tests/simulate_test.sh path/to/kvq   (data: $KVQ_DATA or ../shared/data)
# Needs a POSIX shell, grep, awk, timeout, and python3 (standard library)
# for the JSON checks (without it they fail, or with KVQ_ALLOW_SKIP=1 are
# skipped: see clilib.sh). Prints "N passed, N failed"; exits 1 on failure.

# shellcheck disable=SC2015,SC2086,SC3045
# ("a && ok || bad" as in cli_test.sh; $S, $HUGE, $D and $Q are argument
# lists; ulimit -v is tried before it is used)
KVQ=$1
if [ -z "$KVQ" ] || [ ! -x "$KVQ" ]; then
    echo "usage: sh tests/simulate_test.sh path/to/kvq" >&2
    exit 2
fi
case $KVQ in /*) ;; *) KVQ=$(pwd)/$KVQ ;; esac
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 2>/dev/null)
DATA=${KVQ_DATA:-../shared/data}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_simulate_test.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
. "$(dirname "$0")/clilib.sh"

# runs kvq under a 20 s bound (exit 124 past it): the refusals below must
# come before any data is made, and the runs they refuse would take hours
# (--prompt 1000000000: about 200 TiB of K/V/Q), so a refusal that waited
# for the data would hit the bound, not pass
brun() {
    want=$1
    what=$2
    shift 2
    timeout 20 "$KVQ" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq "$want" ]; then
        ok
    else
        bad "$what: exit $rc, want $want (kvq $*)"
        sed 's/^/    stderr: /' "$TMP/err" | head -5 >&2
    fi
}
# nothing on stdout and no progress line: the refusal came before the work
nothing_done() {
    [ -s "$TMP/out" ] && bad "$1: wrote to stdout" || ok
    if grep -q "memory needed\|data: \|prefill \|decode " "$TMP/err"; then
        bad "$1: progress lines before the refusal"
        sed 's/^/    stderr: /' "$TMP/err" | head -5 >&2
    else ok; fi
}

HUGE="--prompt 1000000000"
S="simulate --layers 1 --kv-heads 2 --q-heads 4 --head-dim 16 --prompt 64 --decode 8"

# ---- options checked before any data: codecs, store, sizes ----
brun 2 "a bad codec with a huge prompt" simulate $HUGE --k-codec bogus --progress
expect_in "$TMP/err" "^kvq simulate: --k-codec bogus: unknown codec 'bogus'" "the bad codec is named"
nothing_done "a bad codec"
brun 2 "a group that does not divide head_dim" simulate $HUGE --v-codec int4:g=48 --progress
expect_in "$TMP/err" "^kvq simulate: --v-codec int4:g=48: .*does not divide head_dim 128" "the group rule is named"
nothing_done "a bad group"
brun 2 "a chan: value codec" simulate $HUGE --v-codec chan:int3 --progress
expect_in "$TMP/err" "^kvq simulate: --v-codec chan:int3: chan: is a key-only layout" "chan: is named a key layout"
expect_in "$TMP/err" "such as int4 or tq3" "a per-token value codec is suggested"
brun 2 "a nuq codec" simulate $HUGE --k-codec nuq4 --progress
expect_in "$TMP/err" "^kvq simulate: --k-codec nuq4: nuq codecs need per-channel tables" "nuq's tables are named"
expect_in "$TMP/err" "kvq calibrate --codecs nuq4 --target-bits 4 -o FILE" "the command-line way is given"
brun 2 "a bad warm codec" simulate $HUGE --hot-tokens 64 --warm-codec tq9 --progress
expect_in "$TMP/err" "^kvq simulate: --warm-codec tq9: unknown codec" "the warm codec is named"
nothing_done "a bad warm codec"
# .npy data: the codec's name is checked before the files are read (a
# missing directory would be exit 1)
brun 2 "a bad codec with .npy data" simulate --data "$TMP/nothing" --k-codec bogus
expect_in "$TMP/err" "--k-codec bogus: unknown codec" "the codec comes before the files"
brun 1 "missing .npy data" simulate --data "$TMP/nothing"
# --cold: an unknown scheme is refused before a directory of that name is made
(cd "$TMP" && timeout 20 "$KVQ" simulate $HUGE --hot-tokens 64 --cold bogus:/x >out 2>err)
rc=$?
[ "$rc" -eq 2 ] && ok || bad "--cold bogus:/x: exit $rc, want 2"
expect_in "$TMP/err" "^kvq simulate: --cold bogus:/x: unknown store 'bogus:'" "the unknown store is named"
[ -e "$TMP/bogus:" ] && bad "--cold bogus:/x made a directory" || ok
brun 2 "--cold redis: without //" simulate $HUGE --hot-tokens 64 --cold redis:localhost
expect_in "$TMP/err" "redis://HOST" "the Redis form is given"
# The rest of a store's URL is the store's to check when it opens: after
# the memory check (which creates nothing), before the data is made (no
# "data:" progress line); a store that cannot be reached is exit 1 there
brun 2 "--cold with a bad Redis port" simulate --hot-tokens 64 --cold redis://127.0.0.1:99999 --progress
expect_in "$TMP/err" "^kvq simulate: --cold redis://127.0.0.1:99999: bad port" "the store's URL check"
expect_not_in "$TMP/err" "data: " "the URL is checked before the data is made"
brun 1 "--cold with no Redis there" simulate --hot-tokens 64 --cold redis://127.0.0.1:1 --progress
expect_in "$TMP/err" "^kvq simulate: --cold redis://127.0.0.1:1: " "the store that cannot be reached is named"
expect_not_in "$TMP/err" "data: " "the store opens before the data is made"
# a good file store URL with a bad codec: refused before the store is made
brun 2 "a bad codec with a cold store" simulate $S --hot-tokens 32 --cold "file:$TMP/cold" --k-codec bogus
[ -e "$TMP/cold" ] && bad "a refused run made its cold store" || ok
# prompt + decode above the cache's max_tokens (2^30 = 1073741824)
brun 2 "prompt + decode above 2^30" simulate --prompt 1073741824 --decode 1
expect_in "$TMP/err" "1073741825 tokens, above the cache's limit of 2^30" "the token limit is given"
brun 2 "--progress and --quiet" $S --progress --quiet

# ---- memory: estimated first, a run that cannot fit refused (exit 1) ----
brun 1 "--prompt 1000000000" simulate $HUGE --progress
expect_in "$TMP/err" "^kvq simulate: the run needs about .* of memory, more than the .* available" \
    "the refusal gives the estimate and the limit"
nothing_done "--prompt 1000000000"
# The estimate must cover what the run holds at its end, whatever else it
# counts: K, pre-RoPE K and V [8][N][8][128] and Q [8][N][32][128] in f32,
# and the two f32 caches, which without a policy (the default) both hold K
# and V of every token (N = 1000000512 with the default --decode 512):
# 7 x 8*N*8*128*4 + 8*N*32*128*4 bytes, 327.8 TiB. The message rounds to
# 0.1 of its unit.
awk -v n=1000000512 '
    /the run needs about/ {
        for (i = 1; i <= NF; i++) if ($i == "about") { v = $(i + 1); u = $(i + 2) }
        f = (u == "TiB") ? 2^40 : (u == "PiB") ? 2^50 : (u == "EiB") ? 2^60 : 0
        need = 7 * 8 * n * 8 * 128 * 4 + 8 * n * 32 * 128 * 4
        if (f == 0 || (v + 0.05) * f < need) { print "estimate " v " " u " below " need " bytes"; exit 1 }
        found = 1
    }
    END { if (!found) exit 1 }' "$TMP/err" && ok || bad "the estimate is below the data and the f32 cache"
# a limit of the process's own: ulimit -v (the default run needs about 0.9 GiB).
# A sanitizer build reserves terabytes of shadow address space at start, which
# any ulimit -v forbids: there these checks are skipped, named.
if readelf -d "$KVQ" 2>/dev/null | grep -q 'NEEDED.*lib[at]san'; then
    echo "SKIP ulimit -v: $KVQ is a sanitizer build (its shadow memory needs unlimited address space)"
elif (ulimit -v 300000) 2>/dev/null; then
    (ulimit -v 300000 && exec timeout 20 "$KVQ" simulate >"$TMP/out" 2>"$TMP/err")
    rc=$?
    [ "$rc" -eq 1 ] && ok || bad "a run above ulimit -v: exit $rc, want 1"
    expect_in "$TMP/err" "available (ulimit -v, RLIMIT_AS)" "the refusal names ulimit -v"
    # a small run fits under the same limit (the check refuses only what cannot fit)
    (ulimit -v 300000 && exec "$KVQ" $S >"$TMP/out" 2>"$TMP/err")
    rc=$?
    [ "$rc" -eq 0 ] && ok || bad "a small run under ulimit -v 300000: exit $rc, want 0"
else
    cannot_run "ulimit -v" "this shell cannot set it"
fi
# The JSON's estimate against what the run held. f32 codes, no eviction:
# the data (K, pre-RoPE K, V: 2*8200*4*64*4 bytes each, Q twice that) and
# three caches holding every token's K and V in f32 (33.6 MB each) are all
# written, so the peak resident size is at least the estimate less what it
# counts that may stay untouched: the 32 MiB it allows for the program, the
# metadata (24 bytes a token and layer estimated) and the per-token buffers,
# about 2 MB here of 187 MB: 0.9 leaves five times that.
run 0 "simulate f32 json, 16400 token-layers" simulate --layers 2 --kv-heads 4 --q-heads 8 \
    --head-dim 64 --prompt 8192 --decode 8 --k-codec f32 --v-codec f32 --quality-every 1000 --json
check_json "the memory estimate covers the run and is what it holds" '
m, f32 = d["memory"], d["timing"]["f32_stored_bytes"]
data = 2 * 8200 * 4 * 64 * 4 * 3 + 2 * 8200 * 8 * 64 * 4
assert m["estimate_bytes"] >= data + f32, (m, data, f32)
assert m["peak_rss_bytes"] >= data, (m, data)
assert m["peak_rss_bytes"] >= 0.9 * (m["estimate_bytes"] - 32 * 2**20), m
assert m["limit_bytes"] > 0 and m["limit_source"], m
'

# .npy data: the estimate covers the arrays read (f32 in memory, at least
# the files' bytes less their headers, which are under 4 KiB each)
if [ -f "$DATA/stories260K/kv-story1/k.npy" ]; then
    run 0 "simulate .npy data json" simulate --data "$DATA/stories260K/kv-story1" --decode 16 --json
    check_json "the estimate covers the .npy arrays" '
import os
dd = "'"$DATA"'/stories260K/kv-story1"
files = sum(os.path.getsize(os.path.join(dd, f)) - 4096 for f in ("k.npy", "k_prerope.npy", "v.npy", "q.npy"))
assert d["memory"]["estimate_bytes"] >= files, (d["memory"], files)
'
else
    cannot_run "simulate .npy data" "$DATA/stories260K/kv-story1 not found"
fi

# ---- progress: on stderr with --progress, none from a script without it ----
run 0 "simulate --progress" $S --progress --json
expect_in "$TMP/err" "^kvq simulate: about .* of memory needed, .* available" "progress gives the memory estimate"
expect_in "$TMP/err" "^kvq simulate: data: 1 layers x 72 tokens generated, [0-9.]* s$" "progress: the data"
expect_in "$TMP/err" "^kvq simulate: prefill 64/64 tokens, [0-9.]* s$" "progress: the prefill"
expect_in "$TMP/err" "^kvq simulate: decode 8/8 tokens, [0-9.]* s$" "progress: the decode"
check_json "stdout stays one JSON object with --progress" 'assert d["config"]["decode"] == 8'
run 0 "simulate without --progress, stderr not a terminal" $S
[ -s "$TMP/err" ] && bad "progress or other text on stderr without --progress" || ok
run 0 "simulate --quiet" $S --quiet
[ -s "$TMP/err" ] && bad "text on stderr with --quiet" || ok

# ---- the text output: f32 baselines beside every figure, a meaning under each ----
# the demo's settings (make demo: int8 keys, tq3 values, utility eviction to
# 1024 of 2048 tokens) at a quarter of the tokens and layers
D="simulate --layers 2 --prompt 512 --decode 64 --k-codec int8 --v-codec tq3 --policy utility --budget 256"
run 0 "the demo, smaller" $D
expect_in "$TMP/out" "^  memory and time (all layers) *this cache *f32 same eviction *f32 no eviction$" \
    "the accounting has both f32 caches as columns"
expect_in "$TMP/out" "^  quality vs exact attention *this cache *f32 same eviction$" \
    "the quality table has the f32 cache with the same eviction as a column"
expect_in "$TMP/out" "^baselines" "the baselines are said"
expect_in "$TMP/out" "^  KL floor from eviction " "the KL floor (eviction alone) is a row"
expect_in "$TMP/out" "attn_kl_eviction_only" "the KL floor names its JSON field"
# every figure row (a label, then numbers) is followed by its meaning,
# indented 8; the accounting has 13 rows without tiers, the quality 5
awk '
    /^  [^ (].*[0-9]$/ || /^    [^ ].*[0-9]$/ { if (row) miss++; row = $0; rows++; next }
    { if (row && $0 !~ /^        [^ ]/) { miss++; print "no meaning under: " row }; row = "" }
    END { if (row) miss++; print rows " rows, " miss + 0 " without a meaning"; exit !(rows >= 18 && miss == 0) }' \
    "$TMP/out" >"$TMP/rows" && ok || bad "a figure without its meaning line: $(cat "$TMP/rows")"
# the three columns are figures of three caches: tokens stored, this cache and
# the f32 cache with the same eviction hold at most the budget (256 a layer,
# 512), the f32 cache without eviction every token (576 x 2 layers)
grep -q "^  tokens stored  *[0-9]*  *[0-9]*  *1152$" "$TMP/out" && ok || bad "tokens stored: the f32 cache without eviction holds 1152"
awk '/^  tokens stored / { exit !($3 <= 512 && $4 <= 512) }' "$TMP/out" && ok || bad "tokens stored: the budget"

# ---- the figures the text added, in JSON (new fields; old names kept) ----
# f32 codecs: the kvq cache is the f32 cache with the same eviction, so its
# outputs are that cache's, bit for bit
Q="simulate --layers 1 --kv-heads 2 --q-heads 8 --head-dim 16 --prompt 256 --decode 32 --window 16 --json"
run 0 "simulate f32 codecs, GQA, eviction" $Q --k-codec f32 --v-codec f32 --policy utility --budget 64
check_json "f32 codecs: no error against the f32 cache with the same eviction" '
q = d["quality"]
assert q["attn_rel_err_vs_f32_same_eviction"] == 0, q
assert q["attn_kl_eviction_only"] == q["f32_same_eviction"]["attn_kl_eviction_only"], q
'
# Gibbs: a cache whose weights pc sum to 1 over the kept tokens, whose exact
# weights pg sum to the mass kept, has sum pc log(pc/pg) >= -log(mass kept):
# the KL floor bounds each sample, so the means too (up to rounding, 1e-6).
# With 4 query heads per KV head each head renormalises apart, and the f32
# cache stays above the floor (cli_test.sh: equal with one query head).
run 0 "simulate int4, GQA, eviction" $Q --k-codec int4 --v-codec int4 --policy utility --budget 64
check_json "the weight KL is at least its eviction floor; the codecs add an error" '
q = d["quality"]
f = q["f32_same_eviction"]
for c in (q, f):
    assert c["attn_kl_eviction_only"] > 0 and c["attn_kl"] >= c["attn_kl_eviction_only"] - 1e-6, c
assert q["attn_rel_err_vs_f32_same_eviction"] > 1e-3, q   # int4: far above f32 rounding
t = d["timing"]
for k in ("decode_step_ms", "f32_decode_step_ms", "f32_same_eviction_decode_step_ms",
          "append_ns_per_token", "f32_append_ns_per_token", "f32_same_eviction_append_ns_per_token"):
    assert t[k] > 0, (k, t)
'

finish
