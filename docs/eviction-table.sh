#!/bin/sh
# eviction-table.sh MODEL TOKENIZER [KVQ] - the policy x budget table of
# docs/eviction.md: kvq eval (decode semantics) on the shared text, stories
# 7..19 (--skip 6), f32 K/V, protected window 32, none / window / utility at
# budget ratios 0.75, 0.5, 0.25 of each story. Prints one JSON line per row.
M=$1; T=$2; KVQ=${3:-build/kvq}
TXT=${TXT:-../shared/data/text/tinystories-valid-sample.txt}
BASE=$(mktemp "${TMPDIR:-/tmp}/kvq_base.XXXXXX")
trap 'rm -f "$BASE"' EXIT
run() { "$KVQ" eval --model "$M" --tokenizer "$T" --text "$TXT" --skip 6 --json "$@"; }
echo "{\"policy\": \"none\", \"ratio\": 1, \"eval\": $(run --k-codec f32 --v-codec f32 --save-logits "$BASE")}"
for r in 0.75 0.5 0.25; do
  for p in window utility; do
    echo "{\"policy\": \"$p\", \"ratio\": $r, \"eval\": $(run --k-codec f32 --v-codec f32 --policy $p --budget-ratio $r --window 32 --base-logits "$BASE")}"
  done
done
