#!/bin/sh
# model_cli_test.sh - the model commands of the kvq tool on the real
# stories260K model: generate (greedy sample), eval --json (f32 reference and
# the exact JSON keys), calibrate on a small budget of tokens, eval --alloc of
# the result, sweep (CSV and SVG), and bad arguments.
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
case "$out" in
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."*) ok ;;
    *) bad "generate greedy: $out" ;;
esac

"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --json > "$TMP/e.json" 2>"$TMP/err" && ok || bad "eval f32"
$PY - "$TMP/e.json" <<'PYEOF' && ok || bad "eval --json keys and f32 identity"
import json, sys
d = json.load(open(sys.argv[1]))
keys = ["nll_f32", "nll", "ppl_f32", "ppl", "kl", "top1_agree", "bits_per_value", "tokens"]
assert list(d.keys()) == keys, d.keys()
assert d["nll"] == d["nll_f32"] and d["kl"] == 0 and d["top1_agree"] == 1, d
assert d["tokens"] > 100
PYEOF

"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --json --k-codec int8 --v-codec int4 > "$TMP/e2.json" 2>/dev/null && ok || bad "eval int8/int4"
$PY - "$TMP/e2.json" <<'PYEOF' && ok || bad "eval int8/int4 figures"
import json, sys
d = json.load(open(sys.argv[1]))
assert 0 < d["kl"] < 0.05 and 0.9 < d["top1_agree"] <= 1, d
assert 8.5 < d["bits_per_value"] < 9.5, d   # (10 + 8) / 2 plus page slack
PYEOF

"$KVQ" calibrate --model "$M" --tokenizer "$T" --text "$TMP/short.txt" --target-bits 5 --max-tokens 64 -o "$TMP/a.json" --json > "$TMP/c.json" 2>"$TMP/err" && ok || bad "calibrate: $(cat "$TMP/err")"
$PY - "$TMP/c.json" "$TMP/a.json" <<'PYEOF' && ok || bad "calibrate output"
import json, sys
r = json.load(open(sys.argv[1]))
a = json.load(open(sys.argv[2]))
assert r["bits_per_value"] <= 5.0 + 1e-9, r
assert a["kvq_alloc"] == 1 and len(a["overrides"]) == 5 * 4 * 2 and len(a["center"]) == 5 * 4 * 8
PYEOF
"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/other.txt" --json --alloc "$TMP/a.json" > "$TMP/e3.json" 2>"$TMP/err" && ok || bad "eval --alloc: $(cat "$TMP/err")"
$PY - "$TMP/e3.json" <<'PYEOF' && ok || bad "eval --alloc on unseen text"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["bits_per_value"] <= 5.5 and d["kl"] < 0.5, d
PYEOF

"$KVQ" sweep --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --configs "int8,int4/tq3,alloc:$TMP/a.json" -o "$TMP/sw" > /dev/null 2>&1 && ok || bad "sweep"
[ "$(wc -l < "$TMP/sw/sweep.csv")" -eq 4 ] && ok || bad "sweep.csv rows"
grep -q "<svg" "$TMP/sw/sweep.svg" && [ "$(grep -c "<circle" "$TMP/sw/sweep.svg")" -eq 3 ] && ok || bad "sweep.svg points"

# prefix caching: the second run loads the prompt's full pages and prints the same text
P="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her dog."
"$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 --steps 100 --prompt "$P" --k-codec int8 --v-codec int8 > "$TMP/g0.txt" 2>/dev/null
"$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 --steps 100 --prompt "$P" --k-codec int8 --v-codec int8 --prefix-store "file:$TMP/pfx" > "$TMP/g1.txt" 2>"$TMP/e1"
"$KVQ" generate --model "$M" --tokenizer "$T" --temperature 0 --steps 100 --prompt "$P" --k-codec int8 --v-codec int8 --prefix-store "file:$TMP/pfx" > "$TMP/g2.txt" 2>"$TMP/e2"
cmp -s "$TMP/g0.txt" "$TMP/g1.txt" && cmp -s "$TMP/g0.txt" "$TMP/g2.txt" && ok || bad "prefix-store changes the generated text"
grep -q "prefix store: 0 of" "$TMP/e1" && grep -q "prefix store: 32 of" "$TMP/e2" && ok || bad "prefix-store did not load the prompt pages: $(cat "$TMP/e2")"

"$KVQ" eval --model "$M" --tokenizer "$T" > /dev/null 2>&1; [ $? -eq 2 ] && ok || bad "eval without --text exits 2"
"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --k-codec nope > /dev/null 2>"$TMP/err"; [ $? -ne 0 ] && grep -q "unknown codec" "$TMP/err" && ok || bad "eval with a bad codec"
"$KVQ" eval --model /nonexistent --tokenizer "$T" --text "$TMP/two.txt" > /dev/null 2>&1; [ $? -eq 1 ] && ok || bad "eval with a missing model"
echo '{"kvq_alloc": 2}' > "$TMP/bad.json"
"$KVQ" eval --model "$M" --tokenizer "$T" --text "$TMP/two.txt" --alloc "$TMP/bad.json" > /dev/null 2>&1; [ $? -eq 2 ] && ok || bad "eval with a bad alloc file"

finish
