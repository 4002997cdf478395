#!/bin/sh
# cli-errors.sh [KVQ] [DATA] - the table of docs/cli.md: kvq run with bad
# input (issue 12's list and more), each row the command, the first line it
# prints (stderr, else stdout) and its exit code, in markdown.
# Paths are shown short: M and T are the stories260K model and tokenizer,
# T15 the stories15M tokenizer (32000 tokens), TXT the shared text, $TMP a
# scratch folder with the files made below.
KVQ=${1:-build/kvq}
DATA=${2:-../shared/data}
M=$DATA/stories260K/stories260K.bin
T=$DATA/stories260K/tok512.bin
T15=$DATA/stories15M/tokenizer.bin
TXT=$DATA/text/tinystories-valid-sample.txt
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_cli_errors.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM
: > "$TMP/empty.txt"
head -c 3000 "$M" > "$TMP/binary.txt"
printf 'Once upon a time \377\376 there was\n' > "$TMP/garbage.txt"
head -c 100000 "$M" > "$TMP/cut.bin"
head -n 2 "$TXT" > "$TMP/two.txt"
echo "keep me" > "$TMP/file"
mkdir -p "$TMP/notastore" && echo hi > "$TMP/notastore/readme.txt"
mkdir -p "$TMP/junkstore" && echo "not a segment" > "$TMP/junkstore/seg-000001.log"
echo '{"kvq_alloc": 1, "k_codec": "int8", "v_codec": "int8"}' > "$TMP/a.json"
cp "$TMP/two.txt" "$TMP/locked.txt" && chmod 000 "$TMP/locked.txt"
P38="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her"
LONG=$(head -c 4000 "$TXT" | tr '\n' ' ')

echo "| command | what it prints (first line) | exit code |"
echo "|---|---|---|"
# row DISPLAY ARGS...: runs kvq ARGS, prints the row
row() {
    shown=$1
    shift
    "$KVQ" "$@" >"$TMP/o" 2>"$TMP/e"
    rc=$?
    if [ -s "$TMP/e" ]; then line=$(head -n 1 "$TMP/e"); else line=$(head -n 1 "$TMP/o"); fi
    line=$(printf '%s' "$line" | sed -e "s|$TMP|\$TMP|g" -e "s|$DATA|DATA|g" -e 's/|/\\|/g' | cut -c1-160)
    printf '| `kvq %s` | %s | %s |\n' "$shown" "$line" "$rc"
}
G="--model M --tokenizer T"
row "generate --help" generate --help
row "eval --help" eval --help
row "calibrate --help" calibrate --help
row "sweep --help" sweep --help
row "bench --help" bench --help
row "bench attend --help" bench attend --help
row "--help" --help
row "generate $G --steps -3" generate --model "$M" --tokenizer "$T" --steps -3
row "generate $G --steps abc" generate --model "$M" --tokenizer "$T" --steps abc
row "generate $G --temperature abc" generate --model "$M" --tokenizer "$T" --temperature abc
row "generate $G --temperature -1" generate --model "$M" --tokenizer "$T" --temperature -1
row "generate $G --seed abc" generate --model "$M" --tokenizer "$T" --seed abc
row "generate $G --threads 0" generate --model "$M" --tokenizer "$T" --threads 0
row "eval $G --text TXT --k-codec bogus" eval --model "$M" --tokenizer "$T" --text "$TXT" --k-codec bogus
row "eval $G --text TXT --policy lru" eval --model "$M" --tokenizer "$T" --text "$TXT" --policy lru
row "eval $G --text TXT --page 0" eval --model "$M" --tokenizer "$T" --text "$TXT" --page 0
row "simulate --threads 0" simulate --threads 0
row "eval $G --text \$TMP/empty.txt" eval --model "$M" --tokenizer "$T" --text "$TMP/empty.txt"
row "eval $G --text \$TMP/locked.txt (mode 000; root reads it)" eval --model "$M" --tokenizer "$T" --text "$TMP/locked.txt"
row "eval $G --text \$TMP/binary.txt" eval --model "$M" --tokenizer "$T" --text "$TMP/binary.txt"
row "eval $G --text \$TMP/garbage.txt" eval --model "$M" --tokenizer "$T" --text "$TMP/garbage.txt"
row "eval $G --text \$TMP" eval --model "$M" --tokenizer "$T" --text "$TMP"
row "sweep $G --text TXT --configs int8 -o \$TMP/file" sweep --model "$M" --tokenizer "$T" --text "$TXT" --configs int8 -o "$TMP/file"
row "sweep $G --text TXT --configs '' -o \$TMP/sw" sweep --model "$M" --tokenizer "$T" --text "$TXT" --configs "" -o "$TMP/sw"
row "sweep $G --text TXT --configs int8,bogus -o \$TMP/sw" sweep --model "$M" --tokenizer "$T" --text "$TXT" --configs int8,bogus -o "$TMP/sw"
row "calibrate $G --text TXT --target-bits 4 -o \$TMP/no/a.json" calibrate --model "$M" --tokenizer "$T" --text "$TXT" --target-bits 4 -o "$TMP/no/a.json"
row "calibrate $G --text TXT --target-bits 1 -o \$TMP/a.json" calibrate --model "$M" --tokenizer "$T" --text "$TXT" --target-bits 1 -o "$TMP/a.json"
row "generate $G --prompt '<33 tokens>' --steps 10" generate --model "$M" --tokenizer "$T" --prompt "$P38" --steps 10
row "generate $G --prompt '<4000 characters>'" generate --model "$M" --tokenizer "$T" --prompt "$LONG"
row "simulate --budget 100" simulate --budget 100
row "simulate --data DATA/stories260K/kv-story1 --decode 16" simulate --data "$DATA/stories260K/kv-story1" --decode 16
row "codecs" codecs
row "inspect \$TMP/notastore" inspect "$TMP/notastore"
row "eval --model \$TMP/none.bin --tokenizer T --text TXT" eval --model "$TMP/none.bin" --tokenizer "$T" --text "$TXT"
row "eval --model \$TMP/cut.bin --tokenizer T --text TXT" eval --model "$TMP/cut.bin" --tokenizer "$T" --text "$TXT"
row "eval --model M --tokenizer \$TMP/cut.bin --text TXT" eval --model "$M" --tokenizer "$TMP/cut.bin" --text "$TXT"
# more
row "(no command)"
row "frobnicate" frobnicate
row "help nothing" help nothing
row "eval $G" eval --model "$M" --tokenizer "$T"
row "eval $G --text TXT --budget 64" eval --model "$M" --tokenizer "$T" --text "$TXT" --budget 64
row "eval $G --text TXT --policy window" eval --model "$M" --tokenizer "$T" --text "$TXT" --policy window
row "eval $G --text TXT --v-codec int4:g=32" eval --model "$M" --tokenizer "$T" --text "$TXT" --v-codec int4:g=32
row "eval $G --text TXT --prefill x" eval --model "$M" --tokenizer "$T" --text "$TXT" --prefill x
row "eval $G --text TXT --max-lines 0" eval --model "$M" --tokenizer "$T" --text "$TXT" --max-lines 0
row "eval $G --text TXT --skip -1" eval --model "$M" --tokenizer "$T" --text "$TXT" --skip -1
row "eval $G --text TXT --save-logits a --base-logits b" eval --model "$M" --tokenizer "$T" --text "$TXT" --save-logits a --base-logits b
row "eval $G --text TXT --prefix-store redis://127.0.0.1:1" eval --model "$M" --tokenizer "$T" --text "$TXT" --prefix-store redis://127.0.0.1:1
row "generate $G -n 5 --steps 10" generate --model "$M" --tokenizer "$T" -n 5 --steps 10
row "generate $G hello" generate --model "$M" --tokenizer "$T" hello
row "calibrate $G --text TXT --target-bits 4 -o \$TMP/a.json --codecs bogus" calibrate --model "$M" --tokenizer "$T" --text "$TXT" --target-bits 4 -o "$TMP/a.json" --codecs bogus
row "calibrate $G --text TXT --target-bits 0 -o \$TMP/a.json" calibrate --model "$M" --tokenizer "$T" --text "$TXT" --target-bits 0 -o "$TMP/a.json"
row "calibrate $G --text TXT --target-bits 4 -o \$TMP" calibrate --model "$M" --tokenizer "$T" --text "$TXT" --target-bits 4 -o "$TMP"
row "sweep $G --text TXT --configs int8+page=0 -o \$TMP/sw" sweep --model "$M" --tokenizer "$T" --text "$TXT" --configs int8+page=0 -o "$TMP/sw"
row "sweep $G --text TXT --calib-lines 1 --configs calib:1 -o \$TMP/sw" sweep --model "$M" --tokenizer "$T" --text "$TXT" --calib-lines 1 --configs calib:1 -o "$TMP/sw"
row "sweep $G --text TXT --configs alloc:\$TMP/none.json -o \$TMP/sw" sweep --model "$M" --tokenizer "$T" --text "$TXT" --configs "alloc:$TMP/none.json" -o "$TMP/sw"
row "simulate --q-heads 30" simulate --q-heads 30
row "simulate --policy utility" simulate --policy utility
row "simulate --cold file:\$TMP/cold" simulate --cold "file:$TMP/cold"
row "simulate --seed -1" simulate --seed -1
row "simulate --budget-ratio 1.5 --policy window" simulate --budget-ratio 1.5 --policy window
row "simulate --head-dim 2000" simulate --head-dim 2000
row "inspect" inspect
row "inspect \$TMP/notastore \$TMP" inspect "$TMP/notastore" "$TMP"
row "codecs --page 5000" codecs --page 5000
row "version extra" version extra
# a tokenizer of another size, files that are missing, options that exclude each other
row "generate --model M --tokenizer T15 -n 4" generate --model "$M" --tokenizer "$T15" -n 4
row "eval --model M --tokenizer T15 --text TXT" eval --model "$M" --tokenizer "$T15" --text "$TXT"
row "eval $G --text TXT --alloc \$TMP/a.json --k-codec int8" eval --model "$M" --tokenizer "$T" --text "$TXT" --alloc "$TMP/a.json" --k-codec int8
row "eval $G --text TXT --alloc \$TMP/none.json" eval --model "$M" --tokenizer "$T" --text "$TXT" --alloc "$TMP/none.json"
row "eval $G --text TXT --skip 1 --max-lines 1 --prefill 100000" eval --model "$M" --tokenizer "$T" --text "$TXT" --skip 1 --max-lines 1 --prefill 100000
row "eval $G --text TXT --v-codec chan:int3" eval --model "$M" --tokenizer "$T" --text "$TXT" --v-codec chan:int3
row "eval $G --text TXT --k-codec nuq4" eval --model "$M" --tokenizer "$T" --text "$TXT" --k-codec nuq4
row "eval $G --text TXT --isa bogus" eval --model "$M" --tokenizer "$T" --text "$TXT" --isa bogus
row "generate $G --stats-json \$TMP/no/s.json" generate --model "$M" --tokenizer "$T" --stats-json "$TMP/no/s.json"
row "generate $G --prefix-store bogus:/x" generate --model "$M" --tokenizer "$T" --prefix-store bogus:/x
row "bench codecs --data \$TMP/none.npy" bench codecs --data "$TMP/none.npy"
row "bench codecs --data gaussian" bench codecs --data gaussian
row "simulate --cold bogus:/x --hot-tokens 64" simulate --cold bogus:/x --hot-tokens 64
row "inspect http://x" inspect http://x
row "inspect \$TMP/junkstore" inspect "$TMP/junkstore"
