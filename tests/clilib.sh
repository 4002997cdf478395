# clilib.sh - the harness shared by the shell tests of the kvq tool
# (cli_test.sh, inspect_test.sh, model_cli_test.sh), sourced after they set
# KVQ (the binary), TMP (a scratch folder) and PY (python3, or empty).
# Counts checks; `finish` prints "N passed, N failed" and gives the status.

pass=0
fail=0

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

# check_json DESCRIPTION PYTHON-ASSERTIONS: $TMP/out must be exactly one JSON
# object; the assertions see it as d. Without python3 (PY empty) the check
# is counted as passed.
check_json() {
    if [ -z "$PY" ]; then ok; return; fi
    if "$PY" - "$TMP/out" "$2" <<'PYEOF'
import json, sys
d = json.loads(open(sys.argv[1]).read())  # one JSON value, nothing else
assert isinstance(d, dict), "not an object"
exec(sys.argv[2])
PYEOF
    then ok; else bad "$1: JSON check failed"; fi
}

finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
