#!/bin/sh
# with_redis.sh - runs a command with a private redis-server on a free
# loopback port, exported as KVQ_TEST_REDIS=redis://127.0.0.1:PORT/test, and
# the server binary as KVQ_TEST_REDIS_SERVER (tests that restart a server
# start their own on another port); without redis-server the command runs
# with both unset (the tests then print a SKIP line). The server is stopped
# afterwards.
# Usage: sh tests/with_redis.sh command [args...]
if ! command -v redis-server >/dev/null 2>&1; then
    echo "note: redis-server not installed; Redis tests will skip" >&2
    exec "$@"
fi
PY=${PYTHON:-/usr/bin/python3}
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' 2>/dev/null)
[ -n "$PORT" ] || PORT=$((20000 + $$ % 20000))
DIR=$(mktemp -d "${TMPDIR:-/tmp}/kvq_redis.XXXXXX")
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" \
    --daemonize no --loglevel warning > "$DIR/log" 2>&1 &
PID=$!
i=0
while [ $i -lt 50 ]; do
    if command -v redis-cli >/dev/null 2>&1; then
        redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break
    else
        sleep 0.2
        break
    fi
    sleep 0.1
    i=$((i + 1))
done
KVQ_TEST_REDIS="redis://127.0.0.1:$PORT/test"
KVQ_TEST_REDIS_SERVER=$(command -v redis-server)
export KVQ_TEST_REDIS KVQ_TEST_REDIS_SERVER
"$@"
rc=$?
kill "$PID" 2>/dev/null
wait "$PID" 2>/dev/null
rm -rf "$DIR"
exit $rc
