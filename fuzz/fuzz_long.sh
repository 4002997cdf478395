#!/bin/sh
# fuzz_long.sh BUILD SECONDS PARALLEL OUT TARGET... - `make fuzz-long`: runs
# each libFuzzer target BUILD/fuzz_<target> for SECONDS seconds on a copy of
# its committed corpus (fuzz/corpus/<target>, never written to), one after
# the other (PARALLEL=1: all at once), with its work folder OUT/<target>
# (corpus/, crash artifacts, log), then prints one line per target: seconds
# run, executions, corpus size before and after, and crashes (libFuzzer stops
# a target at its first crash; the reproducer's path is printed). Exits 1
# when any target crashed or did not run.
set -u
build=$1 secs=$2 par=$3 out=$4
shift 4
mkdir -p "$out" || exit 1

run_one() {
    t=$1 dir=$out/$1
    rm -rf "$dir"
    mkdir -p "$dir/corpus" "$dir/artifacts"
    if [ -d "fuzz/corpus/$t" ]; then cp fuzz/corpus/"$t"/* "$dir/corpus/" 2>/dev/null; fi
    start=$(date +%s)
    "$build/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
        -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1
    echo $? >"$dir/rc"
    echo $(($(date +%s) - start)) >"$dir/seconds"
}

if [ "$par" = 1 ]; then
    for t in "$@"; do run_one "$t" & done
    wait
else
    for t in "$@"; do echo "fuzz-long: $t for ${secs}s"; run_one "$t"; done
fi

fail=0
printf '%-12s %8s %12s %8s %8s %8s  %s\n' target seconds execs seeds corpus crashes reproducer
for t in "$@"; do
    dir=$out/$t
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" 2>/dev/null | tail -n 1)
    seeds=$(ls "fuzz/corpus/$t" 2>/dev/null | wc -l)
    corpus=$(ls "$dir/corpus" 2>/dev/null | wc -l)
    crashes=$(ls "$dir/artifacts" 2>/dev/null | wc -l)
    repro=$(ls "$dir/artifacts" 2>/dev/null | head -n 1)
    rc=$(cat "$dir/rc" 2>/dev/null || echo 1)
    [ -n "$repro" ] && repro="$dir/artifacts/$repro"
    if [ "$rc" != 0 ] || [ "$crashes" != 0 ] || [ -z "$execs" ]; then fail=1; fi
    printf '%-12s %8s %12s %8s %8s %8s  %s\n' "$t" "$(cat "$dir/seconds" 2>/dev/null)" \
        "${execs:-?}" "$seeds" "$corpus" "$crashes" "$repro"
done
[ $fail = 0 ] || echo "fuzz-long: a target crashed or did not run (logs under $out/<target>/log)"
exit $fail
