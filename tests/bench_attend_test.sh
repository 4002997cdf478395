#!/bin/sh
# bench_attend_test.sh - tests of `kvq bench attend` (and the option
# handling of `kvq bench codecs`): --help exits 0, every bad value exits 2
# naming its option, and the --json output has the fields issue 11 names
# (step_us, bytes_read, floor_us, x_floor, ratio_vs_f32, ratio_vs_dense, the
# read bandwidths, prefill_us) as positive numbers that agree with each
# other. No timing is judged: only shapes, identities and the byte counts
# that follow from the formats.
# Usage: sh tests/bench_attend_test.sh path/to/kvq
# Needs python3 (standard library) for the JSON checks (see clilib.sh).
# Prints "N passed, N failed"; exits 1 on failure.

KVQ=$1
if [ -z "$KVQ" ] || [ ! -x "$KVQ" ]; then
    echo "usage: sh tests/bench_attend_test.sh path/to/kvq" >&2
    exit 2
fi
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 2>/dev/null)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_bench_attend_test.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
. "$(dirname "$0")/clilib.sh"

# ---- help ----
run 0 "attend --help" bench attend --help
expect_in "$TMP/out" "usage: kvq bench attend" "attend --help prints the usage"
expect_in "$TMP/out" "--prefill" "attend --help names --prefill"
run 0 "attend -h" bench attend -h
run 0 "codecs --help" bench codecs --help
expect_in "$TMP/out" "usage: kvq bench codecs" "codecs --help prints the usage"

# ---- usage errors: exit 2, the message names the option ----
# bad_opt OPTION args...: exit 2 and OPTION in stderr
bad_opt() {
    opt=$1
    shift
    run 2 "bad $*" "$@"
    expect_in "$TMP/err" "$opt" "message of '$*' names $opt"
}
bad_opt --threads bench attend --threads 0
bad_opt --threads bench attend --threads 65
bad_opt --threads bench attend --threads 2x
bad_opt --threads bench attend --threads -1
bad_opt --threads bench attend --threads ""
bad_opt --threads bench attend --threads
bad_opt 1..64 bench attend --threads 99
bad_opt --threads bench attend --threads 1,,2
bad_opt --threads bench attend --threads 1,65
bad_opt --threads bench attend --threads 1,2,
bad_opt --threads bench attend --threads 1,2,3,4,5
bad_opt --context bench attend --context 0
bad_opt --context bench attend --context abc
bad_opt --context bench attend --context 256,,512
bad_opt --context bench attend --context 256,
bad_opt --context bench attend --context 99999999
bad_opt --context bench attend --context none
bad_opt --prefill bench attend --prefill 70000
bad_opt --prefill bench attend --prefill -5
bad_opt --reps bench attend --reps 0
bad_opt --codec bench attend --codec bogus9
bad_opt --codec bench attend --codec int8,,tq3
bad_opt --baselines bench attend --baselines llama.cpp:q5_1
bad_opt --bogus bench attend --bogus
bad_opt --isa bench attend --isa sse9
bad_opt --isa bench attend --isa avx2,
bad_opt --isa bench attend --isa avx2,,scalar
bad_opt --isa bench attend --isa scalar,avx2,scalar,sse9
bad_opt --huge-pages bench attend --huge-pages maybe
bad_opt --huge-pages bench attend --huge-pages
bad_opt --head-dim bench codecs --head-dim 0
bad_opt --count bench codecs --count 1x
bad_opt --reps bench codecs --reps 0
bad_opt --isa bench codecs --isa sse9

# ---- the JSON of one small run ----
run 0 "attend json" bench attend --context 256 --codec int8 --json
check_json "attend json fields" '
def num(x, k):
    v = x[k]
    assert isinstance(v, (int, float)) and not isinstance(v, bool), (k, v)
    assert v > 0, (x.get("codec"), k, v)
    return v
assert isinstance(d["cpu"], str) and d["cpu"] and isinstance(d["isa"], str) and d["isa"]
assert d["huge_pages"] is True and isinstance(d["thp"], str) and d["thp"]
bw1, bw2 = num(d, "read_gbps_1t"), num(d, "read_gbps_2t")
assert d["threads"] == 1 and d["thread_counts"] == [1] and d["floor_gbps"] == bw1
assert num(d, "bandwidth_buffer_bytes") >= 256 << 20
if d["llc_bytes"]:
    assert d["bandwidth_buffer_bytes"] >= 4 * d["llc_bytes"]
r = d["results"]
names = [x["codec"] for x in r]
assert names == ["f32", "f16", "int8", "dense:f32", "llama.cpp:q8_0", "llama.cpp:q4_0"], names
f32, dense = r[0], r[3]
for x in r:
    assert x["context"] == 256 and x["threads"] == 1 and "error" not in x, x
    assert "speedup_vs_1t" not in x
    for k in ("step_us", "bytes_read", "floor_us", "x_floor", "ratio_vs_f32", "ratio_vs_dense",
              "round_gbps", "x_floor_round"):
        num(x, k)
    assert x["kind"] == ("baseline" if x["codec"] in ("dense:f32", "llama.cpp:q8_0", "llama.cpp:q4_0") else "kvq")
    # the identities, to the 6 significant digits the JSON carries
    close = lambda a, b: abs(a - b) <= 1e-4 * abs(b)
    assert close(x["floor_us"], x["bytes_read"] / (bw1 * 1e3)), x
    assert close(x["x_floor"], x["step_us"] / x["floor_us"]), x
    assert close(x["ratio_vs_f32"], x["step_us"] / f32["step_us"]), x
    assert close(x["ratio_vs_dense"], x["step_us"] / dense["step_us"]), x
    assert x["step_min_us"] <= x["step_us"]
    if x["kind"] == "baseline":
        assert 0 <= x["check_rel_err"] < 1e-3, x
assert f32["ratio_vs_f32"] == 1 and dense["ratio_vs_dense"] == 1
# bytes from the formats: 256 tokens x 8 KV heads x 128 values, K and V
n = 2 * 256 * 8 * 128
assert f32["bytes_read"] == 4 * n and dense["bytes_read"] == 4 * n, (f32, dense)
assert r[4]["bytes_read"] == n // 32 * 34 and r[5]["bytes_read"] == n // 32 * 18, r[4:]
assert r[2]["bytes_read"] < f32["bytes_read"] / 3
'

# ---- one round: x_floor_round is the step over bytes / that round's bandwidth ----
run 0 "attend json one round" bench attend --context 256 --codec int8 --baselines none --reps 1 --json
check_json "attend one round" '
for x in d["results"]:
    assert x["rounds"] == 1 and x["round_gbps"] > 0, x
    want = x["step_us"] * x["round_gbps"] * 1e3 / x["bytes_read"]
    assert abs(x["x_floor_round"] - want) <= 1e-4 * want, x
'

# ---- one and two threads in one run: each floor uses its own bandwidth ----
run 0 "attend json threads 2,1" bench attend --context 256 --codec int8 --threads 2,1 \
    --baselines dense:f32 --reps 2 --json
check_json "attend threads 1,2" '
assert d["threads"] == 2 and d["baseline_threads"] == 2 and d["thread_counts"] == [1, 2]
assert d["floor_gbps"] == d["read_gbps_2t"] > 0
r = d["results"]
names = ["f32", "f16", "int8", "dense:f32"]
assert [(x["codec"], x["threads"]) for x in r] == [(c, 1) for c in names] + [(c, 2) for c in names], r
for x in r:
    bw = d["read_gbps_%dt" % x["threads"]]
    assert abs(x["floor_us"] - x["bytes_read"] / (bw * 1e3)) <= 1e-4 * x["floor_us"], x
    assert x["x_floor"] > 0 and x["ratio_vs_dense"] > 0
    assert x["round_gbps"] > 0 and x["x_floor_round"] > 0, x
for a, b in zip(r[:4], r[4:]):
    # one build per codec, timed at both counts in the same 2 rounds
    assert a["rounds"] == b["rounds"] == 2 and a["bytes_read"] == b["bytes_read"], (a, b)
    if a["kind"] == "kvq":
        assert a["append_ns_per_token"] == b["append_ns_per_token"] > 0, (a, b)
    s = a["step_us"] / b["step_us"]
    assert abs(b["speedup_vs_1t"] - s) <= 1e-4 * s, (a, b)
    assert "speedup_vs_1t" not in a
# ratios against the f32 / dense rows of the same thread count
assert r[4]["ratio_vs_f32"] == 1 and r[7]["ratio_vs_dense"] == 1
'

# ---- two kernel paths in one run: every codec on each, in the same rounds ----
run 0 "attend json isa scalar,auto" bench attend --context 256 --codec int8 --isa scalar,auto,scalar \
    --baselines dense:f32 --reps 2 --json
check_json "attend isa scalar,auto" '
best = d["isas"][1]
assert d["isa"] == "scalar" and d["isa_forced"] is True and len(d["isas"]) == 2, d["isas"]
assert best in ("scalar", "avx2", "avxvnni", "avx512")
r = d["results"]
kvq = [(x["codec"], x["isa"]) for x in r if x["kind"] == "kvq"]
assert kvq == [(c, p) for p in d["isas"] for c in ("f32", "f16", "int8")], kvq
assert [x["codec"] for x in r if x["kind"] == "baseline"] == ["dense:f32"]
f32 = {x["isa"]: x for x in r if x["codec"] == "f32"}
for x in r:
    assert x["rounds"] == 2 and "error" not in x, x
    ref = f32[x.get("isa", "scalar")]
    assert abs(x["ratio_vs_f32"] - x["step_us"] / ref["step_us"]) <= 1e-4 * x["ratio_vs_f32"], x
# the same bytes read on either path
by = {}
for x in r:
    by.setdefault(x["codec"], set()).add(x["bytes_read"])
assert all(len(v) == 1 for v in by.values()), by
'
run 0 "attend table isa" bench attend --context 128 --codec int8 --isa scalar,auto --baselines none --reps 1
expect_in "$TMP/out" "int8@scalar" "the table names each row's path"

# ---- prefill only ----
run 0 "attend prefill" bench attend --context none --prefill 48 --codec int8 --baselines none --json
check_json "attend prefill" '
assert d["results"] == []
p = d["prefill"]
assert [x["codec"] for x in p] == ["f32", "f16", "int8"], p
for x in p:
    assert x["tokens"] == 48 and x["threads"] == 1
    for k in ("prefill_us", "append_us", "attend_us", "ratio_vs_f32"):
        assert isinstance(x[k], (int, float)) and x[k] > 0, (x, k)
    assert abs(x["prefill_us"] - x["append_us"] - x["attend_us"]) <= 1e-3 * x["prefill_us"] + 1
assert p[0]["ratio_vs_f32"] == 1
'

# ---- bench codecs: encode next to ggml's quantizers of the same bits ----
run 0 "codecs encode_vs_ggml" bench codecs --count 2048 --head-dim 128 --codec int8,int4:g=32,tq3 \
    --reps 1 --json
check_json "codecs encode_vs_ggml" '
r = {x["codec"]: x for x in d["results"]}
p = d["peers"]
for c, peer in (("int8", "q8_0"), ("int4:g=32", "q4_0")):
    x = r[c]
    assert x["ggml_peer"] == peer, x
    # paired rounds: kvq and ggml each timed once a round, back to back
    assert x["ggml_pair_rounds"] == 15 and p[peer + "_quantize_gbps"] > 0, x
    assert 0 < x["encode_vs_ggml"] < 100 and 0 < x["encode_hot_vs_ggml"] < 100, x
assert "encode_vs_ggml" not in r["tq3"]
'

# ---- the table ----
run 0 "attend table" bench attend --context 128 --codec int8 --baselines none --reps 1
expect_in "$TMP/out" "read bandwidth" "table header: bandwidth"
expect_in "$TMP/out" "kvq path" "table header: kernel path"
expect_in "$TMP/out" "x floor" "table columns"
expect_in "$TMP/out" "^  int8 *128 " "table int8 row"
expect_in "$TMP/out" "page blocks: huge-page regions" "table header: page blocks"

# ---- --huge-pages off: the caches on posix_memalign ----
run 0 "attend huge-pages off" bench attend --context 128 --codec int8 --baselines none --reps 1 \
    --huge-pages off --json
check_json "attend huge-pages off" '
assert d["huge_pages"] is False
assert [x["codec"] for x in d["results"]] == ["f32", "f16", "int8"]
assert all(x["step_us"] > 0 and "error" not in x for x in d["results"])
'

finish
