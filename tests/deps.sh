#!/bin/sh
# deps.sh - the one list of what `make check` needs from Debian, checked
# before any suite runs (`make check` and .ci/run both call it; `make deps`
# runs it alone).
#
#   sh tests/deps.sh            check; install what is missing when run as
#                               root (apt-get), otherwise stop with the exact
#                               command to run
#   sh tests/deps.sh --check    check only: list what is missing, exit 1 if any
#   sh tests/deps.sh --list     print every package of the list and exit
#   sh tests/deps.sh --fuzz ... also what `make fuzz` needs (clang, its runtime)
#
# Building the library itself needs only a C compiler, make and libc; the
# rest is for the test suites: Python's numpy and torch for the binding's
# tests, pip and setuptools for its offline install test, SIMDe to compile
# the AVX-512 and AVX-VNNI kernels on any CPU, hiredis and a redis-server for
# the Redis store and its tests, valgrind, groff for the man page and
# pkg-config for the install test. Exit status: 0 when everything is there
# (after installing), 1 when something is missing and could not be installed.
# `make check DEPS=0` skips this step: suites then run with what the machine
# has, and the summary line says what could not run and why.
PY=${PYTHON:-/usr/bin/python3}
mode=install
fuzz=0
for a in "$@"; do
    case $a in
    --check) mode=check ;;
    --list) mode=list ;;
    --install) mode=install ;;
    --fuzz) fuzz=1 ;;
    *)
        echo "usage: sh tests/deps.sh [--check|--install|--list] [--fuzz]" >&2
        exit 2
        ;;
    esac
done

have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_py() { [ -x "$PY" ] && "$PY" -c "import $1" >/dev/null 2>&1; }

# One line per package: the package, then the probe that says it is there.
# (Each probe is a shell command; the package is missing when it fails.)
list() {
    cat <<'EOF'
make            have_cmd make
gcc             have_cmd gcc
libc6-dev       test -f /usr/include/stdio.h
pkg-config      have_cmd pkg-config
python3         test -x "$PY"
python3-numpy   have_py numpy
python3-torch   have_py torch
python3-pip     have_py pip
python3-setuptools have_py setuptools
libsimde-dev    test -f /usr/include/simde/x86/avx512.h
libhiredis-dev  pkg-config --exists hiredis
redis-server    have_cmd redis-server
redis-tools     have_cmd redis-cli
valgrind        have_cmd valgrind
groff-base      have_cmd groff
EOF
    if [ $fuzz = 1 ]; then
        cat <<'EOF'
clang           have_cmd clang
libclang-rt-14-dev  test -n "$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a 2>/dev/null)"
EOF
    fi
}

missing() {
    list | while read -r pkg probe; do
        eval "$probe" >/dev/null 2>&1 || printf '%s ' "$pkg"
    done
}

if [ $mode = list ]; then
    list | while read -r pkg probe; do echo "$pkg"; done
    exit 0
fi

need=$(missing)
if [ -z "$need" ]; then
    echo "deps: every package make check needs is installed ($(list | wc -l) checked by tests/deps.sh)"
    exit 0
fi
need=${need% }
echo "deps: missing for make check: $need"
if [ $mode = check ]; then
    exit 1
fi
if [ "$(id -u)" != 0 ] || ! have_cmd apt-get; then
    echo "deps: install them and run make check again:" >&2
    echo "  sudo apt-get install -y $need" >&2
    echo "deps: (or run make check DEPS=0 to test with what is here; the suites that" >&2
    echo "  need them then fail or skip, each saying why)" >&2
    exit 1
fi
echo "deps: installing with apt-get (running as root)"
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
if ! apt-get install -y -qq --no-install-recommends $need; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $need
fi
still=$(missing)
if [ -n "$still" ]; then
    echo "deps: still missing after apt-get install: $still" >&2
    exit 1
fi
echo "deps: installed $need"
exit 0
