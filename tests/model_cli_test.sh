#!/bin/sh
# model_cli_test.sh - the model commands of the kvq tool on the real
# stories260K model: generate (greedy sample), eval --json (the data
# README's reference NLL over its 19 stories, decoding through an f32 cache,
# the exact JSON keys, the figures beside the mean, --prefill, --budget-ratio,
# KL of int8 keys and int4 values against each alone and int4 keys,
# --save-logits / --base-logits and their checks, --skip / --max-lines, the
# eviction policies), calibrate on a small budget of tokens,
# eval --alloc of the result, sweep (CSV and SVG), and bad arguments: issue
# 12's list (--help, strict numbers, exit codes, --text that is no text,
# model-load errors, sweep and calibrate checks before any work, generate
# -n / --stats / a prompt longer than the context).
# Usage: sh tests/model_cli_test.sh path/to/kvq   (data: $KVQ_DATA or ../shared/data)
# Prints "N passed, N failed"; exits 1 on failure.

KVQ=$1
DATA=${KVQ_DATA:-../shared/data}
PY=${PYTHON:-/usr/bin/python3}
M=$DATA/stories260K/stories260K.bin
T=$DATA/stories260K/tok512.bin
TXT=$DATA/text/tinystories-valid-sample.txt
. "$(dirname "$0")/clilib.sh"
if [ ! -r "$M" ] || [ ! -r "$T" ] || [ ! -r "$TXT" ]; then
    echo "FAIL: the model data is missing under $DATA (set KVQ_DATA)" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_model_cli.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
head -n 2 "$TXT" > "$TMP/two.txt"
awk 'length($0) > 0 && length($0) < 700' "$TXT" | head -n 1 > "$TMP/short.txt"
sed -n 3,4p "$TXT" > "$TMP/other.txt"

out=$("$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 --steps 60 2>/dev/null)
# --steps keeps llama2.c's meaning (positions, the prompt's tokens included): after the BOS
# token alone, whose position is the first decode step's, -n 60 is the same text
out2=$("$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 -n 60 2>/dev/null)
[ "$out" = "$out2" ] && ok || bad "generate -n 60 differs from --steps 60 after BOS"
case "$out" in
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."*) ok ;;
    *) bad "generate greedy: $out" ;;
esac

# ---- eval: decode semantics, the figures beside the mean, the reference file
E="eval --model $M --tokenizer $T"
KEYS='["nll_f32", "nll", "ppl_f32", "ppl", "kl", "top1_agree", "bits_per_value", "tokens",
 "delta_nll", "delta_nll_stderr", "kl_stderr", "kl_median", "kl_p99", "kl_max", "dp_top_mean_abs",
 "asymptotic_bits_per_value", "fixed_bytes_per_sequence", "tokens_kept_mean", "sequences", "prefill"]'
run 0 "eval f32" $E --text "$TXT" --json
# The data README's reference (an independent implementation, fp32): 19
# stories, 9,136 predicted tokens, mean NLL 1.6438 nats (perplexity 5.175),
# given to 4 decimals (+-5e-5; float summation orders add ~1e-6).
# Decoding token by token through an f32 cache differs from the f32 prefill
# only in float summation order (~1e-7 relative on the logits): a log-prob
# moves by far less than 1e-4, and each 16-bit code that flips adds at most
# step^2 / 2 = 1.2e-7 (times the token's probability) to KL.
check_json "eval --json keys, the reference NLL and the f32 cache decoding" "
assert list(d) == $KEYS, list(d)
assert d['sequences'] == 19 and d['tokens'] == 9136 and d['prefill'] == 0, d
assert abs(d['nll_f32'] - 1.6438) <= 6e-5 and abs(d['ppl_f32'] - 5.175) <= 6e-4, d
assert abs(d['nll'] - 1.6438) <= 6e-5, d
assert abs(d['delta_nll']) <= 1e-4 and abs(d['nll'] - d['nll_f32']) <= 1e-4, d
assert 0 <= d['kl'] <= 1e-6 and d['kl_max'] <= 1e-6 and d['dp_top_mean_abs'] <= 1e-4, d
assert d['asymptotic_bits_per_value'] == 32, d
"
# a prefill covering each story is the reference's own forward call: identical
run 0 "eval f32 --prefill 512" $E --text "$TMP/two.txt" --json --prefill 512
check_json "eval f32 with a whole-story prefill is exact" "
assert d['kl'] == 0 and d['kl_max'] == 0 and d['kl_median'] == 0 and d['kl_stderr'] == 0, d
assert d['nll'] == d['nll_f32'] and d['delta_nll'] == 0 and d['top1_agree'] == 1, d
assert d['dp_top_mean_abs'] == 0, d
# the stories are 409 and 408 tokens: --prefill 512 prefills each whole, and says so
assert d['prefill'] == 409 and d['tokens'] == 408 + 407, d
"
expect_in "$TMP/err" "--prefill 512 is longer than every sequence (the longest is 409 tokens)" "--prefill past every story: the note"
# the header says what was done, not the number given (it said 'prefill 100000')
run 0 "eval --prefill 100000 on a 408-token story" $E --text "$TMP/two.txt" --skip 1 --prefill 100000
expect_in "$TMP/out" "prefill 408: every sequence whole in one chunk, nothing decoded" "--prefill 100000 header"
expect_not_in "$TMP/out" "100000" "--prefill 100000 is not reported as done"
expect_in "$TMP/err" "--prefill 100000 is longer than every sequence (the longest is 408 tokens)" "--prefill 100000 note"
run 0 "eval --prefill 408 on stories of 409 and 408 tokens" $E --text "$TMP/two.txt" --prefill 408
expect_in "$TMP/out" "prefill 408 then decoding (1 of the sequences no longer than that: prefilled whole)" "--prefill 408 header"
expect_not_in "$TMP/err" "longer than every" "--prefill 408: no note"
# one story of n tokens without a policy: prediction t attends to t + 1 tokens
run 0 "eval one story" $E --text "$TXT" --max-lines 1 --json
check_json "tokens_kept_mean without a policy" "
n = d['tokens'] + 1
assert d['sequences'] == 1 and abs(d['tokens_kept_mean'] - n / 2) <= 5e-4, d
"
KEPT_PY='
import math
n, P = d["tokens"] + 1, d["prefill"]
B = math.ceil(R * (P if 0 < P < n else n))
# the prefill queries see the chunk; a decode step sees what the cache held (at most B) and itself
bound = sum(t + 1 if t < P else min(t, B) + 1 for t in range(n - 1)) / (n - 1)
assert d["tokens_kept_mean"] <= bound + 5e-4 and d["tokens_kept_mean"] < n / 2, (d, bound)
'
run 0 "eval --budget-ratio" $E --text "$TXT" --max-lines 1 --json --policy window --budget-ratio 0.5 --window 32
check_json "--budget-ratio 0.5 keeps at most ceil(0.5 n)" "R = 0.5
$KEPT_PY"
run 0 "eval --prefill --budget-ratio" $E --text "$TXT" --max-lines 1 --json --prefill 64 --policy window --budget-ratio 0.5 --window 32
check_json "--budget-ratio with --prefill 64 keeps at most 32 after it" "R = 0.5
$KEPT_PY
assert d['prefill'] == 64"

run 0 "eval int8/int4 --save-logits" $E --text "$TMP/two.txt" --json --k-codec int8 --v-codec int4 --save-logits "$TMP/ref.bin"
cp "$TMP/out" "$TMP/e2.json"
check_json "eval int8/int4 figures" "
# head_dim 8: int8 = 8 bits + an fp16 scale per vector (10), int4 = 4 bits + fp16 scale and minimum (8)
assert d['asymptotic_bits_per_value'] == 9 and d['bits_per_value'] >= 9, d
assert d['fixed_bytes_per_sequence'] >= 0 and d['tokens_kept_mean'] > 1, d
assert 0 < d['kl'] <= d['kl_max'] and 0 <= d['kl_median'] <= d['kl_p99'] <= d['kl_max'], d
assert d['kl_stderr'] * d['tokens'] ** 0.5 <= d['kl_max'], d   # sd <= range
assert abs(d['delta_nll'] - (d['nll'] - d['nll_f32'])) <= 2e-6, d
assert 0 < d['dp_top_mean_abs'] < 1 and 0 < d['top1_agree'] <= 1, d
"
# KL of int8 keys with int4 values, against the same text with one of the
# two lossy (the other f32) and with the looser int4 keys. To second order
# KL is a quadratic form in the logits' perturbation (1/2 d^T F d), whose
# root obeys the triangle inequality (Minkowski over the tokens), so with
# key and value errors together sqrt(KL) lies within the sum and the
# difference of the two alone (25 % for the higher orders); and int4's key
# step (range/15 of each key) is >= 127/15 = 8.5x int8's (absmax/127), so
# its error is >= 72x in square: 16x in KL leaves 4.5x for the model.
for kv in int8/f32 f32/int4 int4/f32; do
    run 0 "eval $kv" $E --text "$TMP/two.txt" --json --k-codec "${kv%/*}" --v-codec "${kv#*/}"
    cp "$TMP/out" "$TMP/kl-$(echo "$kv" | tr / -).json"
done
cp "$TMP/e2.json" "$TMP/out"
check_json "int8/int4 KL against its parts and int4 keys" "
k, v, k4 = (json.load(open('$TMP/kl-%s.json' % n))['kl'] for n in ('int8-f32', 'f32-int4', 'int4-f32'))
assert (k ** 0.5 - v ** 0.5) ** 2 / 1.25 <= d['kl'] <= 1.25 * (k ** 0.5 + v ** 0.5) ** 2, (d['kl'], k, v)
assert 0 < 16 * k < k4 and 0 < v, (k, k4, v)
"
# 24 + 2 * 512 bytes per predicted token after a 64-byte header
[ "$(wc -c < "$TMP/ref.bin")" -eq $((64 + $($PY -c "import json; print(json.load(open('$TMP/e2.json'))['tokens'])") * 1048)) ] && ok || bad "--save-logits file size"
ls "$TMP"/ref.bin.tmp.* > /dev/null 2>&1 && bad "--save-logits left its temporary file" || ok
run 0 "eval --base-logits" $E --text "$TMP/two.txt" --json --k-codec int8 --v-codec int4 --base-logits "$TMP/ref.bin"
cmp -s "$TMP/out" "$TMP/e2.json" && ok || bad "--base-logits changes the figures: $(cat "$TMP/out")"
run 1 "--base-logits of another text" $E --text "$TMP/other.txt" --base-logits "$TMP/ref.bin"
expect_in "$TMP/err" "another text" "--base-logits text mismatch"
cp "$M" "$TMP/m2.bin"
printf '\001' | dd of="$TMP/m2.bin" bs=1 seek=$(($(wc -c < "$M") - 1)) conv=notrunc 2>/dev/null
run 1 "--base-logits of another model" eval --model "$TMP/m2.bin" --tokenizer "$T" --text "$TMP/two.txt" --base-logits "$TMP/ref.bin"
expect_in "$TMP/err" "another model" "--base-logits model mismatch"
head -c 5000 "$TMP/ref.bin" > "$TMP/short.bin"
run 1 "truncated --base-logits" $E --text "$TMP/two.txt" --base-logits "$TMP/short.bin"
expect_in "$TMP/err" "truncated" "--base-logits truncated"
cp "$TMP/ref.bin" "$TMP/bad.bin"
printf '\377' | dd of="$TMP/bad.bin" bs=1 seek=3000 conv=notrunc 2>/dev/null
run 1 "corrupt --base-logits" $E --text "$TMP/two.txt" --base-logits "$TMP/bad.bin"
expect_in "$TMP/err" "corrupt" "--base-logits corrupt"
run 1 "--base-logits not a reference" $E --text "$TMP/two.txt" --base-logits "$TXT"
run 1 "--base-logits a directory" $E --text "$TMP/two.txt" --base-logits "$TMP"
expect_in "$TMP/err" "--base-logits $TMP: is a directory, not a file" "--base-logits directory message"
run 1 "--base-logits missing" $E --text "$TMP/two.txt" --base-logits "$TMP/none.bin"
expect_in "$TMP/err" "--base-logits $TMP/none.bin: No such file or directory" "--base-logits missing message"
run 2 "--save-logits with --base-logits" $E --text "$TMP/two.txt" --save-logits "$TMP/x.bin" --base-logits "$TMP/ref.bin"
run 1 "--save-logits into a missing folder" $E --text "$TMP/two.txt" --save-logits "$TMP/no/such/x.bin"

# line selection: --skip 2 --max-lines 2 is lines 3 and 4
run 0 "eval --skip --max-lines" $E --text "$TXT" --skip 2 --max-lines 2 --json --k-codec int8 --v-codec int8
cp "$TMP/out" "$TMP/sel.json"
run 0 "eval lines 3-4" $E --text "$TMP/other.txt" --json --k-codec int8 --v-codec int8
cmp -s "$TMP/out" "$TMP/sel.json" && ok || bad "--skip 2 --max-lines 2 differs from lines 3-4"
for v in -1 1x "" " 2" 1e3; do
    run 2 "--skip '$v'" $E --text "$TMP/two.txt" --skip "$v"
done
run 2 "--max-lines 0" $E --text "$TMP/two.txt" --max-lines 0
run 2 "--max-lines -3" $E --text "$TMP/two.txt" --max-lines -3
run 2 "calibrate --skip x" calibrate --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --target-bits 5 -o "$TMP/x.json" --skip x
run 1 "--skip past the end" $E --text "$TMP/two.txt" --skip 2
expect_in "$TMP/err" "0 selected" "--skip past the end names the selection"
run 2 "--k-center without centre values" $E --text "$TMP/two.txt" --k-center
expect_in "$TMP/err" "calibration data" "--k-center message"

# eviction measured as decoding (issue 9): utility keeps the same number of
# tokens as window and loses less, at a fixed budget and at a ratio
for b in "--budget 128" "--budget-ratio 0.5"; do
    run 0 "eval window $b" $E --text "$TXT" --json --policy window $b --window 32
    cp "$TMP/out" "$TMP/win.json"
    run 0 "eval utility $b" $E --text "$TXT" --json --policy utility $b --window 32
    check_json "utility beats window at $b" "
w = json.load(open('$TMP/win.json'))
assert d['kl'] < w['kl'] and d['nll'] != w['nll'], (d, w)
assert d['tokens_kept_mean'] == w['tokens_kept_mean'] < 245, (d, w)
"
done

# calibrate: decoding measurements, the target bounds the asymptotic bits
# (a sum of exact per-unit costs, so it holds to rounding), the fixed cost is
# reported apart, and the allocation loads on text it has not seen
"$KVQ" calibrate --model "$M" --tokenizer "$T" --text "$TMP/short.txt" --target-bits 5 --max-tokens 64 -o "$TMP/a.json" --json > "$TMP/c.json" 2>"$TMP/err" && ok || bad "calibrate: $(cat "$TMP/err")"
$PY - "$TMP/c.json" "$TMP/a.json" <<'PYEOF' && ok || bad "calibrate output"
import json, sys
r = json.load(open(sys.argv[1]))
a = json.load(open(sys.argv[2]))
assert 0 < r["asymptotic_bits_per_value"] <= 5.0 + 1e-9, r
assert r["fixed_bytes_per_sequence"] >= 0 and r["kl"] >= 0 and r["tokens"] > 0, r
assert r["sensitivity_tokens"] <= r["tokens"], r
assert a["kvq_alloc"] == 1 and len(a["overrides"]) == 5 * 4 * 2 and len(a["center"]) == 5 * 4 * 8
assert a["asymptotic_bits_per_value"] == r["asymptotic_bits_per_value"], (a, r)
assert "fixed_bytes_per_sequence" in a and "bits_per_value" in a and "recent" in a
# the unit costs add up to the cache's figure
assert abs(sum(o["bits"] for o in a["overrides"]) / len(a["overrides"]) - a["asymptotic_bits_per_value"]) < 1e-3, a
PYEOF
"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/other.txt" --json --alloc "$TMP/a.json" > "$TMP/e3.json" 2>"$TMP/err" && ok || bad "eval --alloc: $(cat "$TMP/err")"
"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/other.txt" --json --k-codec tq3 --v-codec tq3 > "$TMP/e4.json" 2>"$TMP/err" && ok || bad "eval tq3: $(cat "$TMP/err")"
$PY - "$TMP/e3.json" "$TMP/c.json" "$TMP/e4.json" <<'PYEOF' && ok || bad "eval --alloc on unseen text"
import json, sys
d = json.load(open(sys.argv[1]))
r = json.load(open(sys.argv[2]))
u = json.load(open(sys.argv[3]))
# the asymptotic figure does not depend on the text; the allocation loses
# less than the uniform one of the same asymptotic bits (tq3 keys and
# values: 3 bits + an fp16 scale per 8 values), whose codebook is among
# its candidates for every unit (tq3:norm=8, 4 bits: within the budget)
assert d["asymptotic_bits_per_value"] == r["asymptotic_bits_per_value"] <= 5.0 + 1e-9, (d, r)
assert u["asymptotic_bits_per_value"] == 5.0, u
assert 0 < d["kl"] < u["kl"], (d, u)
PYEOF
# the sensitivity runs are independent: threads give the same allocation
"$KVQ" calibrate --model "$M" --tokenizer "$T" --text "$TMP/short.txt" --target-bits 5 --max-tokens 64 --jobs 2 -o "$TMP/a2.json" > /dev/null 2>"$TMP/err" && cmp -s "$TMP/a.json" "$TMP/a2.json" && ok || bad "calibrate --jobs 2 differs: $(cat "$TMP/err")"
run 2 "calibrate below the cheapest allocation" calibrate --model "$M" --tokenizer "$T" --text "$TMP/short.txt" --target-bits 1 --max-tokens 16 -o "$TMP/x.json"
expect_in "$TMP/err" "cheapest allocation" "calibrate names the cheapest allocation"

# sweep: decoding evals on the lines after --calib-lines, one marker per
# configuration (calibrated ones apart), a legend
"$KVQ" sweep --model "$M" --tokenizer "$T" --text "$TXT" --max-lines 2 --calib-lines 1 --calib-tokens 32 --configs "int8,int4/tq3,alloc:$TMP/a.json,calib:4" -o "$TMP/sw" > /dev/null 2>"$TMP/err" && ok || bad "sweep: $(cat "$TMP/err")"
[ "$(wc -l < "$TMP/sw/sweep.csv")" -eq 5 ] && ok || bad "sweep.csv rows"
grep -q "<svg" "$TMP/sw/sweep.svg" && [ "$(grep -c 'class="point"' "$TMP/sw/sweep.svg")" -eq 4 ] && ok || bad "sweep.svg points"
grep -q "calibrated in this run" "$TMP/sw/sweep.svg" && grep -q "saved allocation" "$TMP/sw/sweep.svg" && ok || bad "sweep.svg legend"
$PY - "$TMP/sw/sweep.csv" "$TMP/sw/alloc-4.json" <<'PYEOF' && ok || bad "sweep.csv figures"
import csv, json, sys
rows = {r["config"]: r for r in csv.DictReader(open(sys.argv[1]))}
a = json.load(open(sys.argv[2]))
assert rows["calib:4"]["kind"] == "calibrated" and rows["int8"]["kind"] == "fixed", rows
assert float(rows["calib:4"]["asymptotic_bits_per_value"]) <= 4 + 1e-9, rows
assert float(rows["calib:4"]["asymptotic_bits_per_value"]) == a["asymptotic_bits_per_value"]
# int8 keys and values: 8 bits + an fp16 scale per 8 values = 10 bits. Its
# error is 2^-4 of int4's and 2^-5 of tq3's; KL, second order in the
# error, is well over 10x below that of int4 keys with tq3 values
assert abs(float(rows["int8"]["asymptotic_bits_per_value"]) - 10.0) < 1e-9, rows
assert 10 * float(rows["int8"]["kl"]) < float(rows["int4/tq3"]["kl"]), rows
PYEOF
run 2 "sweep calib: without --calib-lines" sweep --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --configs "calib:4" -o "$TMP/sw2"
run 2 "sweep --calib-lines past the text" sweep --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --calib-lines 2 --configs "int8" -o "$TMP/sw2"

# prefix caching: the second run loads the prompt's full pages and prints the same text
P="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her dog."
"$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 --steps 100 --prompt "$P" --k-codec int8 --v-codec int8 > "$TMP/g0.txt" 2>/dev/null
"$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 --steps 100 --prompt "$P" --k-codec int8 --v-codec int8 --prefix-store "file:$TMP/pfx" > "$TMP/g1.txt" 2>"$TMP/e1"
"$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 --steps 100 --prompt "$P" --k-codec int8 --v-codec int8 --prefix-store "file:$TMP/pfx" > "$TMP/g2.txt" 2>"$TMP/e2"
cmp -s "$TMP/g0.txt" "$TMP/g1.txt" && cmp -s "$TMP/g0.txt" "$TMP/g2.txt" && ok || bad "prefix-store changes the generated text"
grep -q "prefix store: 0 of" "$TMP/e1" && grep -q "prefix store: 32 of" "$TMP/e2" && ok || bad "prefix-store did not load the prompt pages: $(cat "$TMP/e2")"
# kvq inspect: a junk file among a store's segments is named and the status is 1; the
# store's records are still listed
cp -r "$TMP/pfx" "$TMP/pfxj"
printf 'this is not a segment' > "$TMP/pfxj/seg-000009.log"
run 1 "inspect a store with a junk segment" inspect "$TMP/pfxj"
expect_in "$TMP/err" "seg-000009.log is not a kvq segment" "junk segment named"
expect_in "$TMP/out" "^kvqp/.*value ok" "the good segment is still listed"
run 0 "inspect the store without it" inspect "$TMP/pfx"
# --prefix-store of a scheme kvq has no store for: a usage error, nothing created
run 2 "generate --prefix-store bogus:/x" generate --model "$M" --tokenizer "$T" -n 2 --prefix-store "bogus:$TMP/x"
expect_in "$TMP/err" "--prefix-store bogus:$TMP/x: unknown store 'bogus:' (known: DIR, file:DIR, redis://" "--prefix-store bogus: message"
[ -e "bogus:$TMP" ] && bad "--prefix-store bogus: created a directory" || ok

"$KVQ" eval --model "$M" --tokenizer "$T" > /dev/null 2>&1; [ $? -eq 2 ] && ok || bad "eval without --text exits 2"
"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --k-codec nope > /dev/null 2>"$TMP/err"; [ $? -eq 2 ] && grep -q "unknown codec" "$TMP/err" && ok || bad "eval with a bad codec exits 2"
"$KVQ" eval --model /nonexistent --tokenizer "$T" --text "$TMP/two.txt" > /dev/null 2>&1; [ $? -eq 1 ] && ok || bad "eval with a missing model"
echo '{"kvq_alloc": 2}' > "$TMP/bad.json"
# a file that is missing, not an allocation or a directory is a failure (exit 1), not a usage error
run 1 "eval with a bad alloc file" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --alloc "$TMP/bad.json"
expect_in "$TMP/err" "--alloc $TMP/bad.json: not a kvq allocation file" "bad alloc file message"
run 1 "eval --alloc missing" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --alloc "$TMP/none.json"
expect_in "$TMP/err" "--alloc $TMP/none.json: No such file or directory" "missing alloc message"
run 1 "generate --alloc a directory" generate --model "$M" --tokenizer "$T" -n 4 --alloc "$TMP"
expect_in "$TMP/err" "is a directory" "alloc directory message"
: > "$TMP/empty.json"
run 1 "eval --alloc empty" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --alloc "$TMP/empty.json"
expect_in "$TMP/err" "the file is empty" "empty alloc message"
# usage errors come before the file is read
run 2 "eval --alloc missing, no --text" eval --model "$M" --tokenizer "$T" --alloc "$TMP/none.json"
# --alloc sets every head's codecs: --k-codec / --v-codec / --k-layout beside it are refused
# (they were ignored, and the header named the file's fallback codecs)
for o in "--k-codec int8" "--v-codec int4" "--k-layout channel" "--k-codec int8 --v-codec int8"; do
    run 2 "eval --alloc with $o" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" $o --alloc "$TMP/a.json"
    expect_in "$TMP/err" "sets the codecs of every layer and head" "--alloc with $o message"
    run 2 "generate $o after --alloc" generate --model "$M" --tokenizer "$T" -n 4 --alloc "$TMP/a.json" $o
done
# the header says what the cache uses: the per-head codecs, and --page over the file's
run 0 "eval --alloc header" eval --model "$M" --tokenizer "$T" --text "$TMP/other.txt" --max-lines 1 --alloc "$TMP/a.json"
expect_in "$TMP/out" "cache K per head .*; V per head .*; keys pre-RoPE centred;.* page 32, alloc $TMP/a.json" "eval --alloc header names the per-head codecs"
expect_not_in "$TMP/out" "cache K f16" "eval --alloc header does not name the fallback as the codec"
run 0 "eval --alloc --page 16" eval --model "$M" --tokenizer "$T" --text "$TMP/other.txt" --max-lines 1 --alloc "$TMP/a.json" --page 16 --json
check_json "--page over --alloc's page" "
a = json.load(open('$TMP/e3.json'))
assert d['asymptotic_bits_per_value'] > a['asymptotic_bits_per_value'], (d, a)  # chan:int's per-page scales cost more
"
run 1 "sweep alloc: not an allocation" sweep --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --configs "int8,alloc:$TMP/bad.json" -o "$TMP/sw4"
[ -e "$TMP/sw4" ] && bad "a sweep with a bad alloc: created its directory" || ok

# a tokenizer whose size is not the model's vocabulary is refused by every model command
# (the stories15M tokenizer with stories260K: 32000 tokens against 512; the loader read the
# first 512 and the text came out as gibberish)
T15=$DATA/stories15M/tokenizer.bin
if [ -r "$T15" ]; then
    for c in "generate -n 4" "eval --text $TMP/two.txt" "calibrate --text $TMP/short.txt --target-bits 5 -o $TMP/x.json" "sweep --text $TMP/two.txt --configs int8 -o $TMP/sw5"; do
        run 1 "${c%% *} with a tokenizer of another vocabulary" $c --model "$M" --tokenizer "$T15"
        expect_in "$TMP/err" "--tokenizer $T15: a tokenizer of 32000 tokens, but the model's vocabulary is 512 tokens" "${c%% *} tokenizer size message"
        [ -s "$TMP/out" ] && bad "${c%% *} with the wrong tokenizer printed: $(head -c 100 "$TMP/out")" || ok
    done
    [ -e "$TMP/sw5" ] && bad "sweep with the wrong tokenizer created its directory" || ok
    M15=$DATA/stories15M/stories15M.bin
    if [ -r "$M15" ]; then
        run 1 "generate: a tokenizer smaller than the vocabulary" generate --model "$M15" --tokenizer "$T" -n 4
        expect_in "$TMP/err" "a tokenizer of 512 tokens, but the model's vocabulary is 32000 tokens" "small tokenizer message"
    fi
else
    cannot_run "tokenizer of another vocabulary" "no $T15"
fi
cp "$T" "$TMP/tok-tail.bin"
printf 'abc' >> "$TMP/tok-tail.bin"
run 1 "a tokenizer with bytes after its tokens" generate --model "$M" --tokenizer "$TMP/tok-tail.bin" -n 4
expect_in "$TMP/err" "not a whole token" "tokenizer tail message"

# ---- issue 12: the model commands say what is true ----
G="generate --model $M --tokenizer $T"
for c in generate eval calibrate sweep; do
    run 0 "$c --help" $c --help
    expect_in "$TMP/out" "usage: kvq $c" "$c --help prints the usage on stdout"
    run 0 "$c -h" $c -h
done
# strict numbers: each error names the option and the accepted range, exit 2
run 2 "generate --steps -3" $G --steps -3
expect_in "$TMP/err" "--steps must be an integer in 1..1073741824, got '-3'" "--steps -3 message"
run 2 "generate --steps abc" $G --steps abc
expect_in "$TMP/err" "--steps must be an integer" "--steps abc message"
run 2 "generate --temperature abc" $G --temperature abc
expect_in "$TMP/err" "--temperature must be a number in \[0, 100\], got 'abc'" "--temperature abc message"
run 2 "generate --temperature -1" $G --temperature -1
expect_in "$TMP/err" "--temperature must be a number in \[0, 100\], got '-1'" "--temperature -1 message"
run 2 "generate --seed abc" $G --seed abc
expect_in "$TMP/err" "--seed must be an integer in 0..18446744073709551615, got 'abc'" "--seed abc message"
run 2 "generate --threads 0" $G --threads 0
expect_in "$TMP/err" "--threads must be an integer in 1..256, got '0'" "--threads 0 message"
run 2 "generate -n -1" $G -n -1
run 2 "generate -n and --steps" $G -n 5 --steps 10
expect_in "$TMP/err" "not both" "-n with --steps message"
run 2 "generate -n without a value" $G -n
expect_in "$TMP/err" "-n needs a value" "-n without a value message"
run 2 "generate a stray argument" $G hello
expect_in "$TMP/err" "unexpected argument 'hello'" "stray argument message"
run 2 "generate without --model" generate --tokenizer "$T"
expect_in "$TMP/err" "--model FILE is required" "missing --model message"
# -n counts generated tokens; --steps counting the prompt refuses to generate nothing
P38="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her"
run 0 "generate -n 5 after a long prompt" $G --prompt "$P38" -n 5 --temperature 0
expect_in "$TMP/err" "(5 tokens generated" "-n 5 generates 5 tokens"
run 2 "generate --steps below the prompt" $G --prompt "$P38" --steps 10
expect_in "$TMP/err" "nothing would be generated" "--steps below the prompt message"
# a prompt longer than the context is refused with both numbers
LONG=$(head -c 4000 "$TXT" | tr '\n' ' ')
run 2 "generate a prompt longer than the context" $G --prompt "$LONG"
expect_in "$TMP/err" "longer than the model's context of 512 tokens" "long prompt names the context"
expect_in "$TMP/err" "the prompt is [0-9]* tokens" "long prompt names its length"
# the cache statistics are opt-in, and the text is out before stderr is written
run 0 "generate without --stats" $G -n 8 --temperature 0
expect_not_in "$TMP/err" "cache stats" "no statistics without --stats"
run 0 "generate --stats" $G -n 8 --temperature 0 --stats
expect_in "$TMP/err" "^cache stats: {" "--stats prints the statistics"
"$KVQ" $G -n 8 --temperature 0 --stats > "$TMP/both" 2>&1
sed -n 2p "$TMP/both" | grep -q "^achieved tok/s" && ok || bad "stdout is not flushed before stderr: $(head -c 200 "$TMP/both")"
# --stats-json FILE: the same statistics as clean JSON, alone in a file; - : on stdout, as the
# line after the text; --stats keeps its stderr line
run 0 "generate --stats-json FILE" $G -n 8 --temperature 0 --stats-json "$TMP/stats.json"
if need_py "--stats-json FILE parses"; then
    "$PY" -m json.tool "$TMP/stats.json" > /dev/null 2>&1 && ok || bad "--stats-json FILE is not JSON: $(head -c 200 "$TMP/stats.json")"
fi
expect_in "$TMP/stats.json" '^{"total": {"tokens": 40,' "--stats-json FILE holds the statistics (5 layers x 8 positions)"
expect_not_in "$TMP/err" "cache stats" "--stats-json FILE leaves stderr alone"
ls "$TMP"/stats.json.tmp.* > /dev/null 2>&1 && bad "--stats-json left its temporary file" || ok
run 0 "generate --stats-json -" $G -n 8 --temperature 0 --stats-json -
sed -n 1p "$TMP/out" | grep -q "^Once upon a time" && ok || bad "--stats-json -: the text first: $(head -c 100 "$TMP/out")"
[ "$(wc -l < "$TMP/out")" -eq 2 ] && ok || bad "--stats-json -: the text, then one JSON line"
if need_py "--stats-json - parses"; then
    tail -n 1 "$TMP/out" | "$PY" -m json.tool > /dev/null 2>&1 && ok || bad "--stats-json - is not JSON: $(tail -n 1 "$TMP/out" | head -c 200)"
fi
run 0 "generate --stats --stats-json" $G -n 8 --temperature 0 --stats --stats-json "$TMP/stats2.json"
expect_in "$TMP/err" "^cache stats: {" "--stats with --stats-json keeps its line"
cmp -s "$TMP/stats.json" "$TMP/stats2.json" && ok || bad "--stats-json differs with --stats"
run 1 "generate --stats-json into a missing folder" $G -n 8 --stats-json "$TMP/no/such/s.json"
expect_in "$TMP/err" "--stats-json $TMP/no/such/s.json: No such file or directory" "--stats-json missing folder message"
[ -s "$TMP/out" ] && bad "--stats-json into a missing folder generated text first" || ok
run 2 "generate --stats-json ''" $G -n 8 --stats-json ""
# exit codes: 2 for every usage error, whichever command
E2="eval --model $M --tokenizer $T --text $TMP/two.txt"
run 2 "eval --k-codec bogus" $E2 --k-codec bogus
expect_in "$TMP/err" "--k-codec bogus: unknown codec" "eval --k-codec bogus names the option"
run 2 "eval --v-codec int4:g=32 (head_dim 8)" $E2 --v-codec int4:g=32
expect_in "$TMP/err" "--v-codec int4:g=32: .*does not divide head_dim 8" "eval group rule"
# a codec the command line cannot use says what to do instead: chan: is for keys only,
# and nuq tables come from kvq calibrate (the library's "load them into a codec first" and
# "unknown codec 'chan'" name no option)
run 2 "eval --v-codec chan:int3" $E2 --v-codec chan:int3
expect_in "$TMP/err" "--v-codec chan:int3: chan: is a key-only layout" "--v-codec chan: message"
expect_in "$TMP/err" "such as int4 or tq3" "--v-codec chan: names per-token codecs"
expect_not_in "$TMP/err" "unknown codec" "--v-codec chan: is not an unknown codec"
run 2 "eval --v-codec chan:int4 with chan:int4 keys" $E2 --k-codec chan:int4 --v-codec chan:int4
expect_in "$TMP/err" "--v-codec chan:int4: chan: is a key-only layout.* such as int4 " "chan:int4 values message"
run 2 "sweep --configs int8/chan:int3" sweep --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --configs int8/chan:int3 -o "$TMP/sw6"
expect_in "$TMP/err" "--configs int8/chan:int3: chan: is a key-only layout" "sweep chan: values message"
run 2 "eval --k-codec nuq4" $E2 --k-codec nuq4
expect_in "$TMP/err" "--k-codec nuq4: nuq4 needs per-channel tables fitted to calibration data" "--k-codec nuq4 message"
expect_in "$TMP/err" "kvq calibrate --codecs nuq4 --target-bits 4 -o FILE fits them for every head, and --alloc FILE" "--k-codec nuq4 names the CLI way"
expect_not_in "$TMP/err" "load them into a codec" "--k-codec nuq4 does not point at the C API"
run 2 "eval --v-codec nuq8" $E2 --v-codec nuq8
expect_in "$TMP/err" "candidates are nuq2..nuq6" "--v-codec nuq8 message"
# the way the message gives works
run 0 "calibrate --codecs nuq4 --target-bits 4 (the message's way)" calibrate --model "$M" --tokenizer "$T" --text "$TMP/short.txt" --codecs nuq4 --target-bits 4 --max-tokens 16 -o "$TMP/nuq4.json"
run 0 "eval --alloc of nuq4 tables" $E2 --alloc "$TMP/nuq4.json"
expect_in "$TMP/out" "K per head nuq4 x20; V per head nuq4 x20" "nuq4 allocation header"
run 2 "eval --isa bogus" $E2 --isa bogus
expect_in "$TMP/err" "--isa must be auto, scalar, avx2, avxvnni or avx512, got 'bogus'" "eval --isa message"
run 0 "eval --isa scalar" $E2 --isa scalar --k-codec int8 --v-codec int8
run 2 "eval --policy lru" $E2 --policy lru
expect_in "$TMP/err" "--policy must be none, window, fifo or utility, got 'lru'" "eval --policy message"
run 2 "eval --page 0" $E2 --page 0
expect_in "$TMP/err" "--page must be an integer in 1..4096, got '0'" "eval --page 0 names one rule"
expect_not_in "$TMP/err" "NULL pointer" "eval --page 0 does not list every rule"
run 2 "eval --budget without a policy" $E2 --budget 64
expect_in "$TMP/err" "--budget needs an eviction policy" "eval budget without policy"
run 2 "eval a policy without a budget" $E2 --policy window
expect_in "$TMP/err" "--policy window needs a budget" "eval policy without budget"
run 2 "eval --budget-ratio 2" $E2 --policy window --budget-ratio 2
run 2 "eval --prefill x" $E2 --prefill x
run 2 "eval unknown option" $E2 --frobnicate
expect_in "$TMP/err" "unknown option '--frobnicate'" "eval unknown option message"
run 2 "eval without --text" eval --model "$M" --tokenizer "$T"
expect_in "$TMP/err" "--text FILE is required" "eval missing --text message"
run 2 "eval --prefix-store ''" $E2 --prefix-store ""
# --text: empty, binary, not UTF-8, a directory, missing: errors (exit 1), never a perplexity
: > "$TMP/empty.txt"
printf '\n\n\r\n' > "$TMP/blank.txt"
head -c 3000 "$M" > "$TMP/binary.txt"
printf 'Once upon a time \377\376 there was\n' > "$TMP/latin.txt"
printf 'Once upon a time\001 there was\n' > "$TMP/ctrl.txt"
for f in empty:empty blank:"no line holds any text" binary:"not a text file" latin:"not UTF-8" ctrl:"control character"; do
    run 1 "eval --text ${f%%:*}" eval --model "$M" --tokenizer "$T" --text "$TMP/${f%%:*}.txt" --json
    expect_in "$TMP/err" "${f#*:}" "eval --text ${f%%:*} message"
    [ -s "$TMP/out" ] && bad "eval --text ${f%%:*} printed figures" || ok
done
run 1 "eval --text a directory" eval --model "$M" --tokenizer "$T" --text "$TMP"
expect_in "$TMP/err" "is a directory" "eval --text directory message"
run 1 "eval --text missing" eval --model "$M" --tokenizer "$T" --text "$TMP/none.txt"
expect_in "$TMP/err" "No such file or directory" "eval --text missing message"
cp "$TMP/two.txt" "$TMP/locked.txt"
chmod 000 "$TMP/locked.txt"
if [ -r "$TMP/locked.txt" ]; then
    echo "note: eval --text unreadable not checked: a mode-000 file is readable here (root)" >&2
else
    run 1 "eval --text unreadable" eval --model "$M" --tokenizer "$T" --text "$TMP/locked.txt"
    expect_in "$TMP/err" "Permission denied" "eval --text unreadable message"
fi
# model-load errors say what is wrong with the file
: > "$TMP/empty.bin"
head -c 100000 "$M" > "$TMP/cut.bin"
run 1 "eval --model missing" eval --model "$TMP/none.bin" --tokenizer "$T" --text "$TMP/two.txt"
expect_in "$TMP/err" "--model $TMP/none.bin: No such file or directory" "missing model message"
run 1 "eval --model a directory" eval --model "$TMP" --tokenizer "$T" --text "$TMP/two.txt"
expect_in "$TMP/err" "is a directory" "model directory message"
run 1 "eval --model empty" eval --model "$TMP/empty.bin" --tokenizer "$T" --text "$TMP/two.txt"
expect_in "$TMP/err" "the file is empty" "empty model message"
run 1 "eval --model truncated" eval --model "$TMP/cut.bin" --tokenizer "$T" --text "$TMP/two.txt"
expect_in "$TMP/err" "not a valid llama2.c checkpoint (100000 bytes)" "truncated model message"
expect_in "$TMP/err" "truncated: the header's shape needs" "truncated model: what the header needs"
expect_in "$TMP/err" "the file has 99972" "truncated model: what the file has"
run 1 "eval --tokenizer a directory" eval --model "$M" --tokenizer "$TMP" --text "$TMP/two.txt"
expect_in "$TMP/err" "--tokenizer $TMP: is a directory" "tokenizer directory message"
run 1 "eval --tokenizer missing" eval --model "$M" --tokenizer "$TMP/none.bin" --text "$TMP/two.txt"
expect_in "$TMP/err" "--tokenizer $TMP/none.bin: No such file or directory" "missing tokenizer message"
run 1 "eval --tokenizer of the wrong file" eval --model "$M" --tokenizer "$TMP/cut.bin" --text "$TMP/two.txt"
expect_in "$TMP/err" "not a valid llama2.c tokenizer" "wrong tokenizer message"
expect_in "$TMP/err" "exceeds the" "wrong tokenizer: the rule broken"
# sweep: a file in the place of -o, empty or bad --configs: refused before any work
SW="sweep --model $M --tokenizer $T --text $TMP/two.txt"
echo "keep me" > "$TMP/out.file"
run 1 "sweep -o an existing file" $SW --configs int8 -o "$TMP/out.file"
expect_in "$TMP/err" "exists and is not a directory" "sweep -o file message"
expect_not_in "$TMP/err" "asym" "sweep -o file fails before any eval"
[ "$(cat "$TMP/out.file")" = "keep me" ] && ok || bad "sweep -o changed the file"
expect_not_in "$TMP/out" "wrote" "sweep -o file says it wrote nothing"
run 2 "sweep --configs ''" $SW --configs "" -o "$TMP/sw3"
expect_in "$TMP/err" "--configs is empty" "sweep empty configs message"
for cfg in "int8,,int4" "int8+page=0" "int8+page=x" "calib:abc" "int8+nope" "int8/" "/int8" "a/b/c"; do
    run 2 "sweep --configs '$cfg'" $SW --calib-lines 1 --configs "$cfg" -o "$TMP/sw3"
done
run 2 "sweep --configs bogus" $SW --configs "int8,bogus" -o "$TMP/sw3"
expect_in "$TMP/err" "bogus: unknown codec" "sweep names the bad entry's codec"
expect_not_in "$TMP/err" "asym" "sweep bad codec fails before any eval"
[ -e "$TMP/sw3" ] && bad "a refused sweep created its directory" || ok
run 1 "sweep alloc: missing" $SW --configs "alloc:$TMP/none.json" -o "$TMP/sw3"
expect_in "$TMP/err" "alloc:$TMP/none.json: $TMP/none.json: No such file or directory" "sweep alloc: missing message"
run 2 "sweep calib: below the cheapest" sweep --model "$M" --tokenizer "$T" --text "$TXT" --max-lines 2 --calib-lines 1 --configs "calib:1" -o "$TMP/sw3"
expect_in "$TMP/err" "below the cheapest allocation" "sweep calib:1 message"
run 2 "sweep without -o" $SW --configs int8
run 2 "sweep --jobs 0" $SW --configs int8 --jobs 0 -o "$TMP/sw3"
# calibrate: every argument and the output are checked before the measurements
C="calibrate --model $M --tokenizer $T --text $TMP/short.txt --max-tokens 16"
run 1 "calibrate -o into a missing directory" $C --target-bits 5 -o "$TMP/no/such/a.json"
expect_in "$TMP/err" "No such file or directory" "calibrate -o missing directory message"
run 1 "calibrate -o a directory" $C --target-bits 5 -o "$TMP"
expect_in "$TMP/err" "is a directory" "calibrate -o directory message"
run 2 "calibrate --codecs bogus" $C --target-bits 5 -o "$TMP/x.json" --codecs bogus
expect_in "$TMP/err" "'bogus' is not a candidate" "calibrate --codecs message"
run 2 "calibrate --codecs without values" $C --target-bits 5 -o "$TMP/x.json" --codecs chan:int3
expect_in "$TMP/err" "no candidate for the values" "calibrate --codecs keys only"
run 2 "calibrate --target-bits 0" $C --target-bits 0 -o "$TMP/x.json"
run 2 "calibrate --target-bits 40" $C --target-bits 40 -o "$TMP/x.json"
run 2 "calibrate --jobs 0" $C --target-bits 5 -o "$TMP/x.json" --jobs 0
run 2 "calibrate without -o" $C --target-bits 5
expect_in "$TMP/err" "-o FILE" "calibrate missing -o message"
[ -e "$TMP/x.json" ] && bad "a refused calibrate wrote its output" || ok

finish
