# clilib.sh - the harness shared by the shell tests of the kvq tool
# (cli_test.sh, inspect_test.sh, model_cli_test.sh), sourced after they set
# KVQ (the binary), TMP (a scratch folder) and PY (python3, or empty).
# Counts checks; `finish` prints "N passed, N failed" and gives the status.
#
# A check that cannot run here (no python3 for a JSON check) fails, unless
# KVQ_ALLOW_SKIP=1 asks to skip what cannot run: it is then printed as SKIP,
# counted, and named again by `finish`. `make check` (and so CI) never sets
# it, so a machine without python3 fails there.

pass=0
fail=0
skipped=0

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# run EXPECTED_RC DESCRIPTION args...: runs kvq, output in $TMP/out, $TMP/err
run() {
    want=$1
    what=$2
    shift 2
    "$KVQ" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -eq "$want" ]; then
        ok
    else
        bad "$what: exit $rc, want $want (kvq $*)"
        sed 's/^/    stdout: /' "$TMP/out" | head -10 >&2
        sed 's/^/    stderr: /' "$TMP/err" | head -5 >&2
    fi
}

# expect_in / expect_not_in FILE PATTERN DESCRIPTION
expect_in() {
    if grep -q -- "$2" "$1"; then ok; else bad "$3: '$2' not found"; fi
}
expect_not_in() {
    if grep -q -- "$2" "$1"; then bad "$3: '$2' found"; else ok; fi
}

# cannot_run DESCRIPTION REASON: the check cannot run here; it fails, or
# with KVQ_ALLOW_SKIP=1 is skipped loudly.
cannot_run() {
    if [ "${KVQ_ALLOW_SKIP:-0}" = 1 ]; then
        skipped=$((skipped + 1))
        echo "SKIP: $1: $2 (KVQ_ALLOW_SKIP=1)" >&2
    else
        bad "$1: $2 (KVQ_ALLOW_SKIP=1 skips instead)"
    fi
}

# need_py DESCRIPTION: true when python3 ($PY) runs; otherwise cannot_run.
need_py() {
    if [ -n "$PY" ] && "$PY" -c '' 2>/dev/null; then
        return 0
    fi
    cannot_run "$1" "no python3 (${PY:-not found}) to run it"
    return 1
}

# check_json DESCRIPTION PYTHON-ASSERTIONS: $TMP/out must be exactly one JSON
# object; the assertions see it as d. Without python3 it fails (see need_py).
check_json() {
    need_py "$1" || return
    if "$PY" - "$TMP/out" "$2" <<'PYEOF'
import json, sys
d = json.loads(open(sys.argv[1]).read())  # one JSON value, nothing else
assert isinstance(d, dict), "not an object"
exec(sys.argv[2])
PYEOF
    then ok; else bad "$1: JSON check failed"; fi
}

finish() {
    [ "$skipped" -eq 0 ] || echo "SKIPPED: $skipped checks could not run here (KVQ_ALLOW_SKIP=1)" >&2
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
