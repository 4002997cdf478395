#!/bin/sh
# check_suite.sh LOGDIR NAME command [args...] - runs one suite of `make
# check`: its output goes to the terminal and to LOGDIR/NAME.log, its exit
# status to LOGDIR/NAME.rc. Always exits 0, so that every suite runs;
# tests/check_summary.sh reads the logs afterwards and gives the status.
dir=$1
name=$2
shift 2
mkdir -p "$dir"
echo "==== suite $name: $*"
{
    "$@" 2>&1
    echo $? >"$dir/$name.rc"
} | tee "$dir/$name.log"
exit 0
