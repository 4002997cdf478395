#!/bin/sh
# tier_restart_test.sh - end to end: a tiered `kvq simulate` whose cold tier
# is a private redis-server without persistence (--save "" --appendonly no)
# that is restarted in the middle of the run. The run is frozen (SIGSTOP)
# once the server holds cold records, the server is stopped and started
# again empty on the same port, and the run goes on (SIGCONT). It must
# finish normally and report the loss: lost_pages > 0, every lost token
# counted once (with no eviction policy, the only tokens evicted are the
# lost ones), every other token still there, attention samples taken to
# the end. Prints "N passed, N failed"; SKIP without redis-server or
# python3.
# Usage: sh tests/tier_restart_test.sh path/to/kvq
KVQ=${1:-build/kvq}
PY=${PYTHON:-/usr/bin/python3}
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "SKIP: redis-server or redis-cli not installed"
    exit 0
fi
# a kvq built without hiredis says so before it connects (nothing listens on
# port 1): then the test skips, as every Redis test does for that build
if "$KVQ" inspect redis://127.0.0.1:1/probe 2>&1 | grep -q "hiredis not found"; then
    echo "SKIP: $KVQ was built without hiredis"
    exit 0
fi
if ! "$PY" -c 'import json' 2>/dev/null; then
    echo "SKIP: no python3 to read the JSON"
    exit 0
fi
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_restart.XXXXXX")
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
SRV=
SIM=
cleanup() {
    [ -n "$SIM" ] && kill -CONT "$SIM" 2>/dev/null && kill "$SIM" 2>/dev/null
    [ -n "$SRV" ] && kill "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

start_server() {
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
        --daemonize no --loglevel warning >>"$TMP/redis.log" 2>&1 &
    SRV=$!
    i=0
    while [ $i -lt 100 ]; do
        redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
records() { redis-cli -p "$PORT" dbsize 2>/dev/null || echo 0; }

start_server || { bad "redis-server did not start on port $PORT"; echo "$pass passed, $fail failed"; exit 1; }
ok
# about 5 s of work, most of it waiting on Redis: time to catch it mid-run
"$KVQ" simulate --layers 4 --kv-heads 2 --q-heads 8 --head-dim 64 --prompt 1024 --decode 256 \
    --hot-tokens 128 --warm-tokens 128 --verify --cold "redis://127.0.0.1:$PORT/restart" --json \
    >"$TMP/out" 2>"$TMP/err" &
SIM=$!
# wait for cold records (the prefill has demoted pages), then freeze the run
n=0
i=0
while [ $i -lt 600 ] && kill -0 "$SIM" 2>/dev/null; do
    n=$(records)
    [ "${n:-0}" -gt 20 ] && break
    sleep 0.02
    i=$((i + 1))
done
if kill -STOP "$SIM" 2>/dev/null && [ "${n:-0}" -gt 20 ]; then
    ok
    before=$(records)
    kill "$SRV"
    wait "$SRV" 2>/dev/null
    SRV=
    if start_server; then ok; else bad "redis-server did not come back"; fi
    after=$(records)
    echo "redis restarted mid-run: $before records before, $after after"
    [ "$after" -eq 0 ] && ok || bad "the restarted server still holds $after records"
    kill -CONT "$SIM"
else
    bad "kvq simulate ended before it could be stopped mid-run (records seen: $n)"
fi
wait "$SIM"
rc=$?
SIM=
[ "$rc" -eq 0 ] && ok || {
    bad "kvq simulate exited $rc"
    sed 's/^/    stderr: /' "$TMP/err" | head -5 >&2
}
if "$PY" - "$TMP/out" <<'PYEOF'
import json, sys
d = json.loads(open(sys.argv[1]).read())
q, t, tot = d["quality"], d["stats"]["tiers"], d["stats"]["total"]
print("lost_pages %d, lost_tokens %d, store_retries %d; tokens %d of %d appended, %d evicted; "
      "attention samples %d, rel. error vs f32 %.4f, vs the all-hot cache %.4f, f32 mass kept %.4f"
      % (q["lost_pages"], q["lost_tokens"], q["store_retries"], tot["tokens"],
         tot["tokens_appended"], tot["tokens_evicted"], q["samples"], q["attn_rel_err"],
         q["attn_rel_err_vs_all_hot"], q["attn_mass_kept"]))
assert q["lost_pages"] > 0, "no page lost"
assert t["lost_pages"] == q["lost_pages"]
assert q["lost_tokens"] > 0
# nothing else lost: no policy evicts here, so every evicted token is a lost one
assert tot["tokens_evicted"] == q["lost_tokens"], "tokens evicted beyond the lost ones"
assert tot["tokens"] + q["lost_tokens"] == tot["tokens_appended"]
assert tot["tokens_appended"] == 4 * (1024 + 256)
# attention went on to the end: every 16th decode step and the last, on 4 layers x 2 heads
# (a step whose attend found a page lost is counted apart: its token
# attention covers fewer tokens; such steps exist only with a loss)
assert q["samples"] + q["samples_skipped_lost"] == 4 * 2 * (256 // 16 + 1), q["samples"]
assert q["attn_mass_kept"] < 1.0  # the lost tokens' share of the f32 attention is missing
assert t["verify_mismatches"] == 0
PYEOF
then ok; else bad "the JSON of kvq simulate does not show the loss as it should"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
