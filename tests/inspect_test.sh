#!/bin/sh
# inspect_test.sh - tests of `kvq inspect`: a demo store written by
# tests/inspect_demo.c (built by the Makefile as BUILD/tests/inspect_demo)
# is listed in text and JSON, filtered by prefix, read with a torn tail
# (reported, not an error, not cut off by the readonly open), with a corrupt
# entry on disk and with corrupt / unsupported records (exit 1); bad
# arguments. With redis-server installed and hiredis built in, the same
# store goes through a Redis server started on a free-looking port.
# Usage: sh tests/inspect_test.sh BUILD_DIR. Needs a POSIX shell, grep, dd,
# od, and python3 to check that --json prints one valid JSON object (without
# it those checks fail, or with KVQ_ALLOW_SKIP=1 are skipped: clilib.sh).
# Prints "N passed, N failed"; exits 1 on failure.

B=$1
KVQ=$B/kvq
DEMO=$B/tests/inspect_demo
if [ -z "$B" ] || [ ! -x "$KVQ" ] || [ ! -x "$DEMO" ]; then
    echo "usage: sh tests/inspect_test.sh BUILD_DIR (with BUILD_DIR/kvq and BUILD_DIR/tests/inspect_demo)" >&2
    exit 2
fi
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 2>/dev/null)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_inspect_test.XXXXXX") || exit 2
REDIS_PID=
cleanup() {
    [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM
. "$(dirname "$0")/clilib.sh"

file_size() { wc -c <"$1" | tr -d ' '; }

# ---- a clean store ----
ST=$TMP/store
if "$DEMO" "file:$ST"; then ok; else bad "inspect_demo could not write $ST"; fi
run 0 "clean store" inspect "$ST"
expect_in "$TMP/out" "^page/0/0  373 bytes  record ok: layer 0, 16/16 tokens, positions 0..15" "record line"
expect_in "$TMP/out" "page/0/1  373 bytes  record ok: layer 0, 10/16 tokens, positions 16..25, 2 heads x 64" "second record"
expect_in "$TMP/out" "page/1/0 .*0/16 tokens, positions none" "empty page"
expect_in "$TMP/out" 'layout "k=int8,v=tq3;k=int8,v=tq3"' "layout"
expect_in "$TMP/out" "prefix 0x1234abcd5678ef01" "prefix hash"
expect_in "$TMP/out" "^snap/meta  18 bytes  value ok" "plain value"
expect_in "$TMP/out" "^4 keys: 3 records ok, 0 corrupt, 0 unsupported, 1 other values, 0 read errors; store: 0 torn tails, 0 corrupt entries skipped at open" "summary"
run 0 "file: URL" inspect "file:$ST"
expect_in "$TMP/out" "^4 keys: 3 records ok" "file: URL summary"

run 0 "json" inspect "$ST" --json
check_json "json shape" '
s = d["summary"]
assert s["keys"] == 4 and s["records_ok"] == 3 and s["corrupt"] == 0 and s["other_values"] == 1, s
assert s["ok"] is True and s["torn_tails"] == 0
k = {e["key"]: e for e in d["keys"]}
r = k["page/0/1"]["record"]
assert (r["layer"], r["n_tokens"], r["pos_min"], r["pos_max"]) == (0, 10, 16, 25), r
assert r["layout"] == "k=int8,v=tq3;k=int8,v=tq3" and r["head_dim"] == 64 and r["n_kv_heads"] == 2
assert r["prefix_hash"] == "0x1234abcd5678ef00" and r["block_bytes"] == 200
assert k["page/1/0"]["record"]["pos_min"] == -1
assert k["snap/meta"]["kind"] == "value" and k["snap/meta"]["size"] == 18
'
run 0 "prefix" inspect "$ST" --prefix page/0/
expect_in "$TMP/out" "^2 keys: 2 records ok" "prefix summary"
expect_not_in "$TMP/out" "snap/meta" "prefix filters"

# ---- a torn tail: reported, not an error, left in place by the readonly open ----
SEG=$ST/seg-000001.log
before=$(file_size "$SEG")
printf 'KVQE\001\001' >>"$SEG"
after=$(file_size "$SEG")
run 0 "torn tail" inspect "$ST"
expect_in "$TMP/out" "^4 keys: 3 records ok, 0 corrupt.* 1 torn tails, 0 corrupt entries" "torn summary"
if [ "$(file_size "$SEG")" -eq "$after" ] && [ "$after" -gt "$before" ]; then ok; else bad "readonly inspect changed the segment"; fi

# ---- a corrupt entry on disk (offset 100 is inside the first record) ----
printf '\377' | dd of="$SEG" bs=1 seek=100 conv=notrunc 2>/dev/null
run 1 "corrupt entry" inspect "$ST"
expect_in "$TMP/out" "1 corrupt entries skipped at open" "corrupt entry summary"
expect_not_in "$TMP/out" "^page/0/0 " "corrupt entry not listed"
run 1 "corrupt entry json" inspect "$ST" --json
check_json "corrupt json" 'assert d["summary"]["ok"] is False and d["summary"]["corrupt_skipped_at_open"] == 1'

# ---- corrupt and unsupported records (the store itself is fine) ----
ST2=$TMP/store2
if "$DEMO" "file:$ST2" --bad-record; then ok; else bad "inspect_demo --bad-record"; fi
run 1 "bad records" inspect "$ST2"
expect_in "$TMP/out" "^page/9/bad  373 bytes  record corrupt" "corrupt record"
expect_in "$TMP/out" "^page/9/v3  373 bytes  record unsupported: record format version 3" "unsupported record"
expect_in "$TMP/out" "^6 keys: 3 records ok, 1 corrupt, 1 unsupported, 1 other values" "bad summary"
run 1 "bad records json" inspect "$ST2" --json
check_json "bad json" '
k = {e["key"]: e for e in d["keys"]}
assert k["page/9/bad"]["status"] == "corrupt" and "error" in k["page/9/bad"]
assert k["page/9/v3"]["status"] == "unsupported"
assert d["summary"]["corrupt"] == 1 and d["summary"]["ok"] is False
'

# ---- arguments ----
run 2 "no store" inspect
run 2 "unknown option" inspect "$ST" --frobnicate
run 1 "missing directory" inspect "$TMP/missing"
expect_in "$TMP/err" "missing" "missing directory message"
run 1 "bad URL" inspect "s3://bucket"
run 0 "help" inspect --help
expect_in "$TMP/out" "usage: kvq inspect" "help text"

# ---- Redis (optional) ----
if ! command -v redis-server >/dev/null 2>&1; then
    echo "SKIP redis: redis-server not found"
else
    port=$((20000 + $$ % 30000))
    redis-server --port "$port" --save '' --appendonly no --bind 127.0.0.1 --daemonize no >/dev/null 2>&1 &
    REDIS_PID=$!
    tries=0
    rc=1
    while [ $tries -lt 50 ]; do
        "$DEMO" "redis://127.0.0.1:$port/inspect" --bad-record 2>"$TMP/derr"
        rc=$?
        [ $rc -eq 0 ] && break
        grep -q "hiredis not found" "$TMP/derr" && break
        tries=$((tries + 1))
        sleep 0.1 2>/dev/null || sleep 1
    done
    if grep -q "hiredis not found" "$TMP/derr"; then
        echo "SKIP redis: built without hiredis"
    elif [ $rc -ne 0 ]; then
        echo "SKIP redis: could not start redis-server on port $port"
    else
        run 1 "redis" inspect "redis://127.0.0.1:$port/inspect"
        expect_in "$TMP/out" "^page/0/1  373 bytes  record ok: layer 0, 10/16 tokens" "redis record"
        expect_in "$TMP/out" "^6 keys: 3 records ok, 1 corrupt, 1 unsupported, 1 other values" "redis summary"
        run 0 "redis prefix" inspect "redis://127.0.0.1:$port/inspect" --prefix page/0/ --json
        check_json "redis json" 'assert d["summary"]["keys"] == 2 and d["summary"]["ok"] is True'
        run 0 "redis other namespace" inspect "redis://127.0.0.1:$port/empty"
        expect_in "$TMP/out" "^0 keys" "empty namespace"
    fi
    kill "$REDIS_PID" 2>/dev/null
    wait "$REDIS_PID" 2>/dev/null
    REDIS_PID=
fi
run 1 "redis down" inspect "redis://127.0.0.1:1"

finish
