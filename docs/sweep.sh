#!/bin/sh
# sweep.sh NAME MODEL TOKENIZER [KVQ] - makes docs/sweep-NAME.svg and
# docs/sweep-NAME.csv (docs/sweeps.md): kvq sweep on the shared text,
# calibrated on its first 6 stories (--calib-lines 6) and evaluated, as
# inference runs (decoding token by token), on the other 13. The fixed
# configurations use one codec for all keys and one for all values; the
# calib: ones are allocations calibrated in the run for that many asymptotic
# bits per value, with the default page (32) and no recent window, then with
# pages of 64 and a recent window of 8 tokens (the two settings that trade
# fixed bytes per sequence for accuracy at the same asymptotic bits).
NAME=$1; M=$2; T=$3; KVQ=${4:-build/kvq}
TXT=${TXT:-../shared/data/text/tinystories-valid-sample.txt}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/kvq_sweep.XXXXXX") || exit 2
trap 'rm -rf "$OUT"' EXIT
FIXED="f16,int8,int4,tq4,tq3,tq2,int8/tq3,chan:int4/tq4:norm=8+prerope,chan:int3/tq3:norm=8+prerope,chan:int2/tq2:norm=8+prerope"
CALIB="calib:3,calib:3.5,calib:4,calib:4.5,calib:5,calib:6,calib:3.5+page=64,calib:4.5+page=64,calib:3.5+recent=8,calib:4.5+recent=8"
"$KVQ" sweep --model "$M" --tokenizer "$T" --text "$TXT" --calib-lines 6 \
    --configs "$FIXED,$CALIB" -o "$OUT" || exit 1
cp "$OUT/sweep.svg" "docs/sweep-$NAME.svg" && cp "$OUT/sweep.csv" "docs/sweep-$NAME.csv"
