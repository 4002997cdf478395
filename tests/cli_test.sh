#!/bin/sh
# cli_test.sh - tests of the kvq command-line tool: `kvq codecs` (the
# README's table), `kvq bench codecs` on small inputs (exit codes, the JSON
# and CSV shapes, spec echo, .npy input of float32/float16, rejected .npy
# files, bad arguments), --help on every command and the overview that
# lists every option, `kvq simulate` (strict options, the f32 cache with the
# same eviction, the data it describes, the cold tier), `kvq inspect` of a
# directory that is not a store. The model commands: model_cli_test.sh.
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

# ---- kvq codecs: the README's table, with the unit of each column ----
run 0 "codecs" codecs
expect_in "$TMP/out" "^nuq3 " "codecs lists nuq3"
expect_in "$TMP/out" "^f32 " "codecs lists f32"
expect_in "$TMP/out" "bits/value d=64" "codecs header names the unit"
expect_in "$TMP/out" "stored bits per value, every byte" "codecs says what bits/value counts"
expect_in "$TMP/out" "state: bytes per codec" "codecs says what the state column is"
grep -q "^nuq3 *3.000 *3.000" "$TMP/out" && ok || bad "codecs: nuq3 at 3 bits per value"
grep -q "^f16 *16.000 *16.000" "$TMP/out" && ok || bad "codecs: f16 at 16 bits per value"
# the README's rows: int8 = 8 bits + an fp16 scale per vector (8 + 16/d), int8:g=32 8 + 16/32,
# tq3:norm=8 3 bits + an 8-bit code per vector (3 + 8/d)
grep -q "^int8 *8.250 *8.125 " "$TMP/out" && ok || bad "codecs: int8 row"
grep -q "^int8:g=32 *8.500 *8.500 " "$TMP/out" && ok || bad "codecs: int8:g=32 row"
grep -q "^tq3:norm=8 *3.125 *3.062 " "$TMP/out" && ok || bad "codecs: tq3:norm=8 row"
# chan:int<b> keys: b bits + an fp16 scale and minimum per channel per page of P tokens: b + 32/P
for b in 1 2 3 4 5 6 7 8; do
    grep -q "^chan:int$b *$((b + 2)).000 *$((b + 2)).000 " "$TMP/out" && ok || bad "codecs: chan:int$b at $b + 32/16 bits"
done
run 0 "codecs --page 32" codecs --page 32
grep -q "^chan:int4 *5.000 *5.000 " "$TMP/out" && ok || bad "codecs --page 32: chan:int4 at 4 + 32/32 bits"
run 0 "codecs --head-dim" codecs --head-dim 96
expect_in "$TMP/out" "bits/value d=96" "codecs --head-dim 96 header"
run 0 "codecs --head-dim 8" codecs --head-dim 8
grep -q "^int4:g=32 *n/a " "$TMP/out" && ok || bad "codecs --head-dim 8: int4:g=32 is n/a"
run 0 "codecs --markdown" codecs --markdown
expect_in "$TMP/out" "| \`nuq4\` |" "codecs markdown row"
expect_in "$TMP/out" "| \`chan:int3\` | 5.000 | 5.000 |" "codecs markdown chan row"
run 0 "codecs --help" codecs --help
expect_in "$TMP/out" "usage: kvq codecs" "codecs help"
run 2 "codecs bad head-dim" codecs --head-dim 0
expect_in "$TMP/err" "--head-dim must be an integer in 1..1024, got '0'" "codecs --head-dim 0 names the range"
run 2 "codecs missing head-dim" codecs --head-dim
run 2 "codecs unknown option" codecs --bogus
run 2 "codecs bad page" codecs --page 5000
expect_in "$TMP/err" "--page must be an integer in 1..4096" "codecs --page names the range"

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
# a --data file that is missing, unreadable or not valid .npy data is a failure (exit 1, as
# every command's files); a name that is no data set and no file is a usage error
run 1 "npy float64" bench codecs --data "$TMP/f64.npy" --codec f32
expect_in "$TMP/err" "<f8" "float64 message names the dtype"
run 1 "npy fortran" bench codecs --data "$TMP/fortran.npy" --codec f32
expect_in "$TMP/err" "Fortran" "fortran message"
run 1 "npy truncated" bench codecs --data "$TMP/trunc.npy" --codec f32
expect_in "$TMP/err" "truncated" "truncated message"
run 1 "npy big-endian" bench codecs --data "$TMP/big.npy" --codec f32
run 1 "npy one vector" bench codecs --data "$TMP/one.npy" --codec f32
run 1 "npy NaN" bench codecs --data "$TMP/nan.npy" --codec f32
expect_in "$TMP/err" "NaN" "NaN message"
run 1 "npy junk" bench codecs --data "$TMP/junk.npy" --codec f32
expect_in "$TMP/err" "magic" "junk message"
run 1 "npy missing" bench codecs --data "$TMP/nope.npy" --codec f32
expect_in "$TMP/err" "--data $TMP/nope.npy: No such file or directory" "npy missing message"
run 1 "npy a directory" bench codecs --data "$TMP" --codec f32
expect_in "$TMP/err" "is a directory" "npy directory message"
: > "$TMP/empty.npy"
run 1 "npy empty" bench codecs --data "$TMP/empty.npy" --codec f32
expect_in "$TMP/err" "the file is empty" "npy empty message"
run 2 "bad data name" bench codecs --data gaussian --codec f32
expect_in "$TMP/err" "--data must be gauss, outlier or a .npy file, got 'gaussian'" "bad data name message"
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
expect_in "$TMP/err" "unknown benchmark 'nothing'" "unknown bench message"
run 2 "bench without a benchmark" bench
run 2 "unknown command" frobnicate
expect_in "$TMP/err" "unknown command 'frobnicate'" "unknown command message"
run 2 "no command"

# ---- --help everywhere, the overview lists every command with every option ----
run 0 "kvq --help" --help
cp "$TMP/out" "$TMP/overview"
run 0 "kvq -h" -h
cmp -s "$TMP/out" "$TMP/overview" && ok || bad "kvq -h differs from kvq --help"
run 0 "kvq help" help
cmp -s "$TMP/out" "$TMP/overview" && ok || bad "kvq help differs from kvq --help"
for c in simulate generate eval calibrate sweep inspect codecs "bench codecs" "bench attend" version help; do
    grep -q "^kvq $c" "$TMP/overview" && ok || bad "kvq --help does not list kvq $c"
done
expect_in "$TMP/overview" "exit status" "kvq --help gives the exit codes"
run 0 "kvq bench --help" bench --help
expect_in "$TMP/out" "kvq bench attend" "bench --help lists bench attend"
expect_in "$TMP/out" "kvq bench codecs" "bench --help lists bench codecs"
for c in simulate generate eval calibrate sweep inspect codecs version "bench codecs"; do
    # shellcheck disable=SC2086
    run 0 "kvq $c --help" $c --help
    expect_in "$TMP/out" "usage: kvq $c" "kvq $c --help prints the usage on stdout"
    [ -s "$TMP/err" ] && bad "kvq $c --help wrote to stderr" || ok
    # shellcheck disable=SC2086
    run 0 "kvq $c -h" $c -h
    # every option the command's usage names is in the overview
    for opt in $(grep -o -- '--[a-z][a-z0-9-]*' "$TMP/out" | sort -u); do
        [ "$opt" = --help ] && continue
        grep -q -- "$opt\b" "$TMP/overview" && ok || bad "kvq --help lacks $opt of kvq $c"
    done
done
# --isa: every value a command accepts is in every help text and manual that describes --isa
# (the cache options' help listed auto, scalar, avx2 and avx512; avxvnni was accepted too)
"$KVQ" eval --isa bogus > /dev/null 2>"$TMP/err"
ISAS=$(sed -n "s/.*--isa must be \(.*\), got 'bogus'.*/\1/p" "$TMP/err" | sed 's/,//g; s/ or / /')
[ "$(echo $ISAS | wc -w)" -ge 5 ] && ok || bad "--isa values from the message: '$ISAS'"
"$KVQ" eval --help | awk '/--isa/ {p = 1; print; next} p && /^ *--/ {p = 0} p' > "$TMP/isa-eval"
"$KVQ" bench codecs --help | awk '/--isa P/ {p = 1; print; next} p && /^ *--/ {p = 0} p' > "$TMP/isa-bench"
DOCS=$(dirname "$0")/..
grep -- "--isa" "$DOCS/docs/cli.md" > "$TMP/isa-md"
awk '/isa/ {p = 3} p > 0 {print; p--}' "$DOCS/kvq.1" > "$TMP/isa-man"
for v in $ISAS; do
    "$KVQ" bench codecs --isa "$v" --help > /dev/null 2>&1 && ok || bad "bench codecs --isa $v is refused"
    for f in isa-eval isa-bench isa-md isa-man; do
        grep -q -- "\b$v\b" "$TMP/$f" && ok || bad "--isa $v missing from $f: $(tr '\n' ' ' < "$TMP/$f")"
    done
    grep -q -- "--isa [a-z0-9|]*\b$v\b" "$TMP/overview" && ok || bad "kvq --help: --isa lacks $v"
done
run 0 "kvq help eval" help eval
expect_in "$TMP/out" "usage: kvq eval" "kvq help eval"
run 0 "kvq help bench codecs" help bench codecs
expect_in "$TMP/out" "usage: kvq bench codecs" "kvq help bench codecs"
run 2 "kvq help nothing" help nothing
# bench attend belongs to tools/bench_attend.c: its options must be in the overview
"$KVQ" bench attend --help >"$TMP/out" 2>&1
for opt in $(grep -o -- '--[a-z][a-z0-9-]*' "$TMP/out" | sort -u); do
    [ "$opt" = --help ] && continue
    grep -q -- "$opt\b" "$TMP/overview" && ok || bad "kvq --help lacks $opt of kvq bench attend"
done
run 2 "version with an argument" version extra

# ---- kvq simulate: options, the f32 cache with the same eviction, the data, tiers ----
S="simulate --layers 1 --kv-heads 2 --q-heads 4 --head-dim 16 --prompt 64 --decode 8"
# The weight KL of an f32 cache against the exact reference. Without
# eviction it is rounding only: f32 weights off by a few ulps give a KL of
# order 1e-7 (its first-order term is the weights' sum minus 1), so 1e-5.
# With eviction and one query head per KV head, an exact cache's weights are
# the reference's renormalised over the kept tokens, so each sample's KL is
# -log(mass kept) and the mean equals attn_kl_eviction_only, to the same
# rounding. Reading token_attn against positions taken after the attend's
# eviction (simulate before this check) gave 40.2 at budget 200 with 99.9%
# of the mass kept, and 50.3 at budget 64 (31% kept; here 0.0012 and 6.42).
SQ="simulate --layers 1 --kv-heads 2 --q-heads 2 --head-dim 16 --prompt 256 --decode 32 --k-codec f32 --v-codec f32 --json"
run 0 "simulate f32, no eviction" $SQ --policy none
check_json "simulate f32 without eviction: weight KL 0, all mass kept" \
    "q = d['quality']; assert q['attn_kl'] <= 1e-5 and abs(q['attn_mass_kept'] - 1) <= 1e-6, q"
for b in 200 64; do
    run 0 "simulate f32, utility eviction to $b" $SQ --policy utility --budget $b
    check_json "simulate f32, budget $b: weight KL = mean -log(mass kept)" \
        "q = d['quality']; assert q['attn_mass_kept'] < 1 and abs(q['attn_kl'] - q['attn_kl_eviction_only']) <= 1e-5 * (1 + q['attn_kl']), q"
done
run 2 "simulate --threads 0" $S --threads 0
expect_in "$TMP/err" "--threads must be an integer in 1..256, got '0'" "simulate --threads 0 names the option and range"
expect_not_in "$TMP/err" "shape" "simulate --threads 0 does not talk about shapes"
run 2 "simulate --q-heads not a multiple" $S --q-heads 6 --kv-heads 4
expect_in "$TMP/err" "--q-heads 6 must be a multiple of --kv-heads 4" "simulate --q-heads message"
for bad_arg in "--layers 0" "--layers -1" "--head-dim 1025" "--prompt 1x" "--prompt ' 8'" \
               "--decode abc" "--seed abc" "--seed -1" "--page 0" "--page 4097" \
               "--quality-every 0" "--budget-ratio 0" "--budget-ratio 1.5" "--budget-ratio nan"; do
    eval "run 2 \"simulate $bad_arg\" $S $bad_arg"
    expect_in "$TMP/err" "must be a\(n integer\| number\) in" "simulate $bad_arg names the range"
done
run 2 "simulate --budget without a policy" $S --budget 32
expect_in "$TMP/err" "--budget needs an eviction policy" "simulate budget without policy"
run 2 "simulate --budget-ratio without a policy" $S --budget-ratio 0.5
run 2 "simulate --window without a policy" $S --window 8
run 2 "simulate a policy without a budget" $S --policy utility
expect_in "$TMP/err" "--policy utility needs a budget" "simulate policy without budget"
run 2 "simulate --budget and --budget-ratio" $S --policy window --budget 32 --budget-ratio 0.5
run 2 "simulate unknown policy" $S --policy lru
expect_in "$TMP/err" "--policy must be none, window, fifo or utility, got 'lru'" "simulate policy message"
run 2 "simulate --cold without tiers" $S --cold "file:$TMP/nocold"
expect_in "$TMP/err" "--cold needs tiers" "simulate --cold without tiers"
[ -e "$TMP/nocold" ] && bad "simulate --cold refused, but it created the store" || ok
run 2 "simulate unknown codec" $S --v-codec bogus
expect_in "$TMP/err" "unknown codec 'bogus'" "simulate unknown codec"
run 2 "simulate missing value" $S --k-codec
run 2 "simulate unknown option" $S --frobnicate
run 0 "simulate text" $S --policy window --budget 32 --window 8
expect_in "$TMP/out" "^data: synthetic" "simulate says what the synthetic data is"
expect_in "$TMP/out" "heavy hitters" "simulate describes the synthetic queries"
expect_in "$TMP/out" "f32 same eviction" "simulate shows the f32 cache with the same eviction"
# the f32 cache with the same eviction is the kvq cache with f32 codecs: the same figures
run 0 "simulate f32 codecs" $S --k-codec f32 --v-codec f32 --policy window --budget 32 --window 8 --json
check_json "the f32 column is the same eviction" '
q = d["quality"]
f = q["f32_same_eviction"]
for k in ("attn_rel_err", "attn_kl", "attn_mass_kept"):
    assert q[k] == f[k], (k, q, f)
assert q["attn_mass_kept"] < 1 and f["tokens_evicted"] > 0, q
'
run 0 "simulate int4 json" $S --k-codec int4 --v-codec int4 --json
check_json "simulate json: without eviction the f32 column is exact up to rounding" '
q, f = d["quality"], d["quality"]["f32_same_eviction"]
# an f32 cache over 72 tokens against double-precision attention: float rounding only (~1e-7)
assert f["attn_rel_err"] < 1e-5 and f["attn_mass_kept"] == 1 and f["tokens_evicted"] == 0, f
assert q["attn_rel_err"] > 100 * f["attn_rel_err"], q   # int4 costs far more than rounding
assert "heavy hitters" in d["config"]["data_description"] and d["config"]["seed"] == 1, d["config"]
a = d["accounting"]
assert a["tokens_cold"] == 0 and a["tokens"] == 72, a
'
# 256 tokens, the newest 16 protected: most pages go cold
T="simulate --layers 1 --kv-heads 2 --q-heads 4 --head-dim 16 --prompt 256 --decode 8 --window 16"
run 0 "simulate tiers" $T --hot-tokens 32 --cold "file:$TMP/cold" --json
check_json "simulate counts the cold tier" '
a, t = d["accounting"], d["stats"]["tiers"]
assert a["tokens_cold"] > 0 and a["cold_record_bytes"] > 0, a
assert a["tokens"] == 264 and a["bits_per_value_resident"] > 0 and a["bits_per_value_cold_records"] > 0, a
assert a["tokens_cold"] == t["cold"]["tokens"], (a, t)
assert t["hot"]["tokens"] + t["warm"]["tokens"] + t["cold"]["tokens"] == a["tokens"], (a, t)
'
run 0 "simulate tiers text" $T --hot-tokens 32 --cold "file:$TMP/cold2"
expect_in "$TMP/out" "of which in the cold tier" "simulate labels the cold-tier tokens"
expect_in "$TMP/out" "cold tier records MiB" "simulate labels the cold-tier bytes"
expect_in "$TMP/out" "bits per value (hot and warm)" "simulate says which tokens bits per value covers"
if [ -f "$DATA/stories260K/kv-story1/k.npy" ]; then
    # head_dim 8: the default V codec must fit (int4:g=32 does not divide 8)
    run 0 "simulate real K/V, default codecs" simulate --data "$DATA/stories260K/kv-story1" --decode 16 --json
    check_json "simulate real K/V" '
c = d["config"]
assert c["head_dim"] == 8 and c["v_codec"] == "int4" and c["data_description"].startswith("real"), c
'
    run 2 "simulate real K/V, a group that does not divide 8" simulate --data "$DATA/stories260K/kv-story1" --v-codec int4:g=32
    expect_in "$TMP/err" "does not divide head_dim 8" "simulate names the group rule"
else
    cannot_run "simulate real K/V" "$DATA/stories260K/kv-story1 not found"
fi
run 1 "simulate --data missing" simulate --data "$TMP/nothing"

# ---- kvq inspect: a directory that is not a store ----
mkdir -p "$TMP/notastore" "$TMP/emptydir"
echo hello > "$TMP/notastore/readme.txt"
run 1 "inspect a directory that is not a store" inspect "$TMP/notastore"
expect_in "$TMP/err" "is not a kvq store" "inspect not-a-store message"
run 1 "inspect an empty directory" inspect "$TMP/emptydir"
expect_in "$TMP/err" "is not a kvq store" "inspect empty directory message"
run 1 "inspect a file" inspect "$TMP/notastore/readme.txt"
expect_in "$TMP/err" "is not a directory" "inspect file message"
run 0 "inspect a store" inspect "$TMP/cold"
# a segment file that does not begin as a segment does is no store's data: exit 1, named
# (a short one was a torn tail, a longer one a corrupt entry: the status was 0 or 1 and
# stderr said nothing); an empty segment, a cut header and zero bytes are a crash's leftovers
mkdir "$TMP/junkstore"
for c in "junkjunk" "hello world, this is not a kvq segment"; do
    printf '%s' "$c" > "$TMP/junkstore/seg-000001.log"
    run 1 "inspect a junk segment ($c)" inspect "$TMP/junkstore"
    expect_in "$TMP/err" "seg-000001.log is not a kvq segment: it begins with the bytes 6[a8] " "junk segment message"
    expect_in "$TMP/err" "is not sound: .*1 files that are not segments" "junk segment summary"
done
run 1 "inspect a junk segment --json" inspect "$TMP/junkstore" --json
check_json "junk segment json" 'assert d["summary"]["ok"] is False and d["summary"]["files_not_segments"] == 1, d'
printf 'KVQE\001' > "$TMP/junkstore/seg-000001.log"
run 0 "inspect a store whose segment is a cut header" inspect "$TMP/junkstore"
expect_in "$TMP/out" "1 torn tails" "a cut header is a torn tail"
head -c 100 /dev/zero > "$TMP/junkstore/seg-000001.log"
run 0 "inspect a store whose segment is zero bytes" inspect "$TMP/junkstore"
: > "$TMP/junkstore/seg-000001.log"
run 0 "inspect a store with an empty segment" inspect "$TMP/junkstore"
# a store URL of a scheme kvq has no store for is named as such, not as a missing directory
for u in "http://x" "bogus:/x"; do
    run 1 "inspect $u" inspect "$u"
    expect_in "$TMP/err" "$u: unknown store '${u%%:*}:' (known: DIR, file:DIR, redis://HOST\[:PORT\]\[/NAMESPACE\]" "inspect $u message"
    expect_not_in "$TMP/err" "directory:" "inspect $u does not blame a directory"
done
run 1 "inspect redis:x" inspect "redis:x"
expect_in "$TMP/err" "a Redis store is redis://HOST" "inspect redis:x message"
run 2 "inspect two stores" inspect "$TMP/cold" "$TMP/cold2"
run 2 "inspect --prefix without a value" inspect "$TMP/cold" --prefix

finish
