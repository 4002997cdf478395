#!/bin/sh
# examples_test.sh BUILD - runs every example program (examples/*.c, built
# as BUILD/examples/NAME by `make examples`) in a scratch folder, as a user
# would, and checks that every C block of README.md is one of them,
# verbatim (a block's first line names the file: "/* NAME.c - ..."), so the
# README's code compiles and runs. Each example checks what it shows and
# exits non-zero when a check fails. Prints "N passed, N failed".
BUILD=${1:-build}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_examples.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
BIN=$(cd "$BUILD/examples" 2>/dev/null && pwd)

for src in examples/*.c; do
    name=$(basename "$src" .c)
    echo "-- example $name"
    if [ -z "$BIN" ] || [ ! -x "$BIN/$name" ]; then
        bad "$name: $BUILD/examples/$name was not built (make examples)"
        continue
    fi
    mkdir -p "$TMP/$name"
    # a second or two each; 120 s leaves room for a loaded machine or ASan
    if (cd "$TMP/$name" && timeout 120 "$BIN/$name"); then ok; else bad "$name exited $?"; fi
done

echo "-- README.md C blocks"
mkdir -p "$TMP/readme"
awk -v dir="$TMP/readme" '
    /^```c[ \t]*$/ { n++; f = sprintf("%s/%03d", dir, n); inb = 1; next }
    inb && /^```/ { inb = 0; close(f); next }
    inb { print > f }' README.md
blocks=0
for b in "$TMP"/readme/*; do
    [ -f "$b" ] || continue
    blocks=$((blocks + 1))
    name=$(sed -n '1s|^/\* \([A-Za-z0-9_]*\.c\) .*|\1|p' "$b")
    if [ -z "$name" ] || [ ! -f "examples/$name" ]; then
        bad "README.md C block $blocks does not start with '/* NAME.c' of a file in examples/: $(head -1 "$b")"
    elif cmp -s "$b" "examples/$name"; then
        echo "README.md C block $blocks is examples/$name verbatim"
        ok
    else
        bad "README.md C block $blocks differs from examples/$name:"
        diff "examples/$name" "$b" | head -20
    fi
done
[ "$blocks" -gt 0 ] && ok || bad "README.md has no C block (the quickstart example belongs there)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
