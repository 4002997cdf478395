#!/bin/sh
# build_config_test.sh [MAKE] - the build tracks its configuration
# ($(BUILD)/config.txt): in a scratch build folder, an object built without
# hiredis is rebuilt with it once hiredis is found (here: HIREDIS=0, then
# the default, which is what installing libhiredis-dev changes), an
# unchanged configuration rebuilds nothing, and other CFLAGS rebuild it.
# Without hiredis on the machine the hiredis steps are skipped. Prints
# "N passed, N failed"; exits 1 on failure.
MAKE_CMD=${1:-make}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
T=$(mktemp -d "${TMPDIR:-/tmp}/kvq_buildcfg.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT INT TERM
OBJ=$T/obj/src/tier/store_redis.o
mk() { $MAKE_CMD --no-print-directory BUILD="$T" "$@" "$OBJ" >"$T/log" 2>&1; }
built() { grep -q 'store_redis\.c' "$T/log"; }
links_hiredis() { nm "$OBJ" | grep -q ' U redisConnect'; }

mk HIREDIS=0 && built && ok || bad "the first build did not compile store_redis.c"
grep -q 'hiredis=0' "$T/config.txt" && ok || bad "config.txt does not record hiredis=0"
links_hiredis && bad "HIREDIS=0 built the Redis store" || ok
mk HIREDIS=0 && ! built && ok || bad "an unchanged configuration rebuilt store_redis.o"
if pkg-config --exists hiredis 2>/dev/null; then
    mk HIREDIS=auto && built && ok || bad "finding hiredis did not rebuild store_redis.o"
    links_hiredis && ok || bad "store_redis.o still lacks hiredis after hiredis was found"
    grep -q 'hiredis=1' "$T/config.txt" && ok || bad "config.txt does not record hiredis=1"
    mk HIREDIS=auto && ! built && ok || bad "an unchanged configuration rebuilt store_redis.o"
    mk HIREDIS=0 && built && ok || bad "losing hiredis did not rebuild store_redis.o"
    links_hiredis && bad "store_redis.o still uses hiredis after HIREDIS=0" || ok
else
    echo "SKIP hiredis: pkg-config finds no hiredis (Debian: libhiredis-dev)"
fi
mk HIREDIS=0 CFLAGS=-DKVQ_BUILD_CONFIG_TEST && built && ok || bad "new CFLAGS did not rebuild store_redis.o"
grep -q 'KVQ_BUILD_CONFIG_TEST' "$T/config.txt" && ok || bad "config.txt does not record CFLAGS"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
