#!/bin/sh
# cli_test.sh - tests of the kvq command-line tool: `kvq codecs`, `kvq bench
# codecs` on small inputs (exit codes, the JSON and CSV shapes, spec echo,
# .npy input of float32/float16, rejected .npy files, bad arguments).
# Usage: sh tests/cli_test.sh path/to/kvq   (data: $KVQ_DATA or ../shared/data)
# Needs only a POSIX shell, grep, and python3 (standard library) for JSON and
# for writing .npy files (without it those checks fail, or with
# KVQ_ALLOW_SKIP=1 are skipped: see clilib.sh). Prints "N passed, N failed";
# exits 1 on failure.

KVQ=$1
if [ -z "$KVQ" ] || [ ! -x "$KVQ" ]; then
    echo "usage: sh tests/cli_test.sh path/to/kvq" >&2
    exit 2
fi
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 2>/dev/null)
DATA=${KVQ_DATA:-../shared/data}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_cli_test.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
. "$(dirname "$0")/clilib.sh"

SMALL="--count 512 --head-dim 64 --reps 1"

# ---- kvq codecs ----
run 0 "codecs" codecs
expect_in "$TMP/out" "^nuq3 " "codecs lists nuq3"
expect_in "$TMP/out" "^f32 " "codecs lists f32"
expect_in "$TMP/out" "bits@64" "codecs header"
grep -q "^nuq3 *3.000 *3.000" "$TMP/out" && ok || bad "codecs: nuq3 at 3 bits per value"
grep -q "^f16 *16.000 *16.000" "$TMP/out" && ok || bad "codecs: f16 at 16 bits per value"
run 0 "codecs --head-dim" codecs --head-dim 96
expect_in "$TMP/out" "bits@96" "codecs --head-dim 96 header"
run 0 "codecs --markdown" codecs --markdown
expect_in "$TMP/out" "| \`nuq4\` |" "codecs markdown row"
run 2 "codecs bad head-dim" codecs --head-dim 0
run 2 "codecs missing head-dim" codecs --head-dim
run 2 "codecs unknown option" codecs --bogus

# ---- bench codecs: JSON ----
run 0 "bench json" bench codecs $SMALL --codec f32,f16,bf16,nuq3 --json
check_json "bench json shape" '
for k in ("memcpy_gbps", "head_dim", "count", "data", "threads", "isa", "results"):
    assert k in d, k
assert d["head_dim"] == 64 and d["count"] == 512 and d["threads"] == 1 and d["data"] == "gauss"
assert d["memcpy_gbps"] > 0 and d["memcpy_hot_gbps"] > 0
p = d["peers"]  # q8_0/q4_0 baselines of the same run; their kernels are checked in the tool
assert p["q4_0_dot_rows_per_s"] > 0 and p["q8_0_quantize_gbps"] > 0 and 0.001 < p["q4_0_nmse"] < 0.05
r = d["results"]
assert [x["codec"] for x in r] == ["f32", "f16", "bf16", "nuq3"], r
for x in r:
    for k in ("codec", "head_dim", "bits_per_value", "nmse", "ip_rel_rmse", "ip_bias",
              "encode_vps", "decode_vps", "score_kps"):
        assert k in x, (x["codec"], k)
    assert x["encode_vps"] > 0 and x["decode_vps"] > 0 and x["score_kps"] > 0
    assert x["encode_hot_vps"] > 0 and x["encode_hot_gbps"] > 0
assert r[0]["nmse"] == 0 and r[0]["bits_per_value"] == 32
assert 0 < r[1]["nmse"] < 1e-6 and r[1]["bits_per_value"] == 16
assert r[3]["bits_per_value"] == 3 and 0.02 < r[3]["nmse"] < 0.05
assert abs(r[3]["ip_rel_rmse"] - r[3]["nmse"] ** 0.5) < 0.05
'
# the codec spec is echoed exactly as given, in the order given
run 0 "bench spec echo" bench codecs $SMALL --codec nuq2,f16,f32 --json
check_json "spec echo" 'assert [x["codec"] for x in d["results"]] == ["nuq2", "f16", "f32"]'
# outlier data, forced scalar path, a seed
SEEDRUN="bench codecs $SMALL --codec f32,nuq2,tq3,int4 --data outlier --isa scalar --json"
run 0 "bench outlier scalar" $SEEDRUN --seed 7
check_json "outlier scalar" '
assert d["data"] == "outlier" and d["isa"] == "scalar" and d["seed"] == 7
assert all("error" not in x for x in d["results"])
'
cp "$TMP/out" "$TMP/seed7.json"
# same seed, same data: identical quality figures (every figure that is not
# a time); another seed: other data, other figures
QUALITY='("bits_per_value", "nmse", "ip_rel_rmse", "ip_bias", "ip_slope", "vector_bytes", "state_bytes")'
run 0 "bench seed repeat" $SEEDRUN --seed 7
check_json "seed repeat" "
a = json.loads(open('$TMP/seed7.json').read())
assert a['peers']['q4_0_nmse'] == d['peers']['q4_0_nmse']
assert len(a['results']) == len(d['results']) == 4
for x, y in zip(a['results'], d['results']):
    assert x['codec'] == y['codec']
    for k in $QUALITY:
        assert x[k] == y[k], (x['codec'], k, x[k], y[k])
"
run 0 "bench other seed" $SEEDRUN --seed 8
check_json "other seed" "
a = json.loads(open('$TMP/seed7.json').read())
assert d['seed'] == 8
for x, y in zip(a['results'][1:], d['results'][1:]):
    assert x['nmse'] != y['nmse'] and x['ip_bias'] != y['ip_bias'], (x['codec'], x['nmse'])
"

# ---- table and CSV ----
run 0 "bench table" bench codecs $SMALL --codec f32,nuq4
expect_in "$TMP/out" "memcpy" "table shows memcpy"
expect_in "$TMP/out" "threads 1" "table shows threads"
expect_in "$TMP/out" "first 256 vectors" "table says fit on the first half"
expect_in "$TMP/out" "^nuq4 " "table row nuq4"
run 0 "bench csv" bench codecs $SMALL --codec f32,f16,nuq2 --csv
lines=$(wc -l <"$TMP/out")
[ "$lines" -eq 4 ] && ok || bad "csv: $lines lines, want 4"
expect_in "$TMP/out" "^codec,head_dim,bits_per_value,nmse" "csv header"
expect_in "$TMP/out" "^nuq2,64,2," "csv nuq2 row"

# ---- the default codec list (every codec), head_dim 8 ----
# every codec works: exit 0, no row carrying an error
run 0 "default list" bench codecs --head-dim 8 --count 256 --reps 1 --json
check_json "default list" '
r = d["results"]
names = [x["codec"] for x in r]
for want in ("f32", "f16", "bf16", "int8", "int4", "int4:g=32", "int2", "int2:g=32", "tq1", "tq4",
             "tq1:nc=0", "tq4:nc=0", "tqp2", "tqp4", "nuq2", "nuq3", "nuq4"):
    assert want in names, want
for x in r:
    assert "error" not in x, x
# g=32 does not divide head_dim 8: skipped (and only those); every other row measured
for x in r:
    assert ("skipped" in x) == x["codec"].endswith(":g=32"), x
    assert "skipped" in x or x["nmse"] >= 0, x
'

# ---- .npy input (written by python3) ----
if need_py ".npy input"; then
"$PY" - "$TMP" <<'EOF'
import struct, sys, random
d = sys.argv[1]
def npy(path, descr, shape, payload, fortran=False, version=1):
    h = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False",
        "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")")
    pre = 10 if version == 1 else 12
    h += " " * ((64 - (pre + len(h) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY" + bytes([version, 0]))
        f.write(struct.pack("<H" if version == 1 else "<I", len(h)))
        f.write(h.encode("latin1"))
        f.write(payload)
random.seed(3)
vals = [random.gauss(0, 1) for _ in range(3 * 50 * 16)]
npy(d + "/f32.npy", "<f4", (3, 50, 16), struct.pack("<%df" % len(vals), *vals))
npy(d + "/f32v2.npy", "<f4", (150, 16), struct.pack("<%df" % len(vals), *vals), version=2)
npy(d + "/f16.npy", "<f2", (100, 24), struct.pack("<%de" % 2400, *vals[:2400]))
npy(d + "/f64.npy", "<f8", (10, 8), struct.pack("<80d", *vals[:80]))
npy(d + "/fortran.npy", "<f4", (10, 8), struct.pack("<80f", *vals[:80]), fortran=True)
npy(d + "/trunc.npy", "<f4", (10, 8), struct.pack("<70f", *vals[:70]))
npy(d + "/big.npy", ">f4", (10, 8), struct.pack(">80f", *vals[:80]))
npy(d + "/one.npy", "<f4", (8,), struct.pack("<8f", *vals[:8]))
nan = vals[:80]; nan[5] = float("nan")
npy(d + "/nan.npy", "<f4", (10, 8), struct.pack("<80f", *nan))
open(d + "/junk.npy", "wb").write(b"not an npy file at all")
EOF
[ $? -eq 0 ] && ok || bad "writing .npy files"

run 0 "npy f32" bench codecs --data "$TMP/f32.npy" --codec f32,nuq3 --reps 1 --json
check_json "npy f32" '
assert d["head_dim"] == 16 and d["count"] == 150, (d["head_dim"], d["count"])
assert d["data"].endswith("f32.npy")
assert d["results"][0]["nmse"] == 0
'
run 0 "npy v2 header" bench codecs --data "$TMP/f32v2.npy" --codec f32 --reps 1 --json
check_json "npy v2" 'assert d["head_dim"] == 16 and d["count"] == 150'
run 0 "npy f16" bench codecs --data "$TMP/f16.npy" --codec f32,f16 --reps 1 --json
check_json "npy f16" '
assert d["head_dim"] == 24 and d["count"] == 100
assert d["results"][1]["nmse"] == 0  # float16 data is exact in f16
'
run 0 "npy --count" bench codecs --data "$TMP/f32.npy" --count 40 --codec f32 --reps 1 --json
check_json "npy --count" 'assert d["count"] == 40'
run 2 "npy --count too large" bench codecs --data "$TMP/f32.npy" --count 151 --codec f32
run 2 "npy --head-dim mismatch" bench codecs --data "$TMP/f32.npy" --head-dim 32 --codec f32
run 2 "npy float64" bench codecs --data "$TMP/f64.npy" --codec f32
expect_in "$TMP/err" "<f8" "float64 message names the dtype"
run 2 "npy fortran" bench codecs --data "$TMP/fortran.npy" --codec f32
expect_in "$TMP/err" "Fortran" "fortran message"
run 2 "npy truncated" bench codecs --data "$TMP/trunc.npy" --codec f32
expect_in "$TMP/err" "truncated" "truncated message"
run 2 "npy big-endian" bench codecs --data "$TMP/big.npy" --codec f32
run 2 "npy one vector" bench codecs --data "$TMP/one.npy" --codec f32
run 2 "npy NaN" bench codecs --data "$TMP/nan.npy" --codec f32
expect_in "$TMP/err" "NaN" "NaN message"
run 2 "npy junk" bench codecs --data "$TMP/junk.npy" --codec f32
expect_in "$TMP/err" "magic" "junk message"
run 2 "npy missing" bench codecs --data "$TMP/nope.npy" --codec f32
run 2 "bad data name" bench codecs --data gaussian --codec f32
if [ -f "$DATA/stories260K/kv-story1/k.npy" ]; then
    run 0 "real keys" bench codecs --data "$DATA/stories260K/kv-story1/k.npy" --codec f32,nuq3,nuq4 --reps 1 --json
    check_json "real keys" '
assert d["head_dim"] == 8 and d["count"] == 5 * 408 * 4
r = d["results"]
assert r[2]["nmse"] < r[1]["nmse"] < 0.2, r
'
else
    cannot_run "real keys" "$DATA/stories260K/kv-story1/k.npy not found"
fi
fi # need_py

# ---- bad arguments ----
run 2 "unknown codec" bench codecs $SMALL --codec f32,nope
expect_in "$TMP/err" "unknown codec" "unknown codec message"
run 2 "bad codec option" bench codecs $SMALL --codec nuq3:g=8
expect_in "$TMP/err" "no option" "bad option message"
run 2 "group does not divide" bench codecs $SMALL --codec int4:g=48
run 2 "empty codec" bench codecs $SMALL --codec f32,,f16
run 2 "count 1" bench codecs --count 1 --codec f32
run 2 "count junk" bench codecs --count 12x --codec f32
run 2 "head-dim 0" bench codecs --head-dim 0 --codec f32
run 2 "head-dim 1025" bench codecs --head-dim 1025 --codec f32
run 2 "head-dim negative" bench codecs --head-dim -8 --codec f32
run 2 "reps 0" bench codecs --reps 0 --codec f32
run 2 "bad isa" bench codecs --isa sse9 --codec f32
run 2 "json and csv" bench codecs $SMALL --codec f32 --json --csv
run 2 "missing value" bench codecs --count
run 2 "unknown flag" bench codecs --frobnicate
run 0 "bench help" bench codecs --help
expect_in "$TMP/out" "usage: kvq bench codecs" "bench help text"
run 2 "unknown bench" bench nothing
run 2 "unknown command" frobnicate
run 2 "no command"

finish
