#!/bin/sh
# check_summary.sh LOGDIR SUITE... - the one summary line that ends `make
# check`, from the logs tests/check_suite.sh wrote: for every suite, the
# checks passed and failed (the sum of the "N passed, N failed" lines its
# test programs and scripts print), the checks skipped (lines starting
# with SKIP, named by what they skip), or that the whole suite was skipped
# (a line "SKIP suite: REASON"). A suite fails when it exited non-zero or
# counted a failure; the line then names the programs that failed and the
# log, and for a suite that failed before it counted anything the first
# build or setup error in its log (a missing header, a missing program). Exits 1 when any suite failed.
dir=$1
shift
line=""
bad=""
for s in "$@"; do
    log=$dir/$s.log
    rc=$(cat "$dir/$s.rc" 2>/dev/null || echo "not run")
    if [ ! -f "$log" ]; then
        part="$s NOT RUN"
        bad="$bad $s"
    else
        part=$(awk -v name="$s" -v rc="$rc" -v logf="$log" '
            function no_result() {  # a program that ended without its counts (a crash)
                if (block != "" && !counted && rc != 0)
                    failed_in = failed_in (failed_in == "" ? "" : ", ") block " (no result)"
            }
            /^== / {
                no_result()
                block = substr($0, 4); sub(/ \(.*\)$/, "", block); sub(/^[^ ]*\//, "", block)
                counted = 0
            }
            /^[0-9]+ passed, [0-9]+ failed/ {
                p += $1; f += $3; counted = 1
                if ($3 > 0 && block != "") failed_in = failed_in (failed_in == "" ? "" : ", ") block
            }
            # the first error of a build or a missing program: why a suite
            # that counted nothing could not run
            why == "" && (/fatal error: / || /: error: / || /No rule to make target/ ||
                          /: not found$/ || /command not found/ || /cannot open shared object/ ||
                          /^deps: missing/) {
                why = $0
                sub(/^[^ ]*: (fatal )?error: /, "", why)
                if (length(why) > 100) why = substr(why, 1, 100) "..."
            }
            /^SKIP suite: / { whole = substr($0, 13) }
            /^[ \t]*SKIP(PED)?[: ]/ && !/^SKIP suite: / && !/^SKIPPED: [0-9]+ checks/ {
                n_skip++
                what = $0
                sub(/^[ \t]*SKIP(PED)?:? */, "", what)
                sub(/:.*/, "", what)
                if (length(what) > 40) what = substr(what, 1, 40) "..."
                if (!(what in seen)) {
                    seen[what] = 1
                    skipped = skipped (skipped == "" ? "" : ", ") what
                }
            }
            END {
                no_result()
                if (whole != "" && p + f == 0 && rc == 0) {
                    printf "%s skipped (%s)", name, whole
                    exit
                }
                out = sprintf("%s %d passed, %d failed", name, p, f)
                if (n_skip > 0) out = out sprintf(", %d skipped (%s)", n_skip, skipped)
                if (rc != 0 || f > 0) {
                    out = out " FAILED"
                    if (failed_in != "") out = out " in " failed_in
                    if (rc != 0) out = out sprintf(" (exit %s)", rc)
                    if (rc != 0 && p + f == 0 && why != "") out = out " could not run: " why
                    out = out " [" logf "]"
                }
                printf "%s", out
            }' "$log")
        [ -n "$part" ] || part="$s FAILED (its log could not be read) [$log]"
        case $part in *FAILED*) bad="$bad $s" ;; esac
    fi
    line="${line:+$line | }$part"
done
if [ -n "$bad" ]; then
    echo "check summary: $line => FAILED:$bad"
    exit 1
fi
echo "check summary: $line => all suites passed"
