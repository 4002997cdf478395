#!/bin/sh
# install_test.sh [MAKE] [BUILD] - `make install` into a scratch DESTDIR and
# what a user does next: every file in place (libkvq.so with its soname
# link), the kvq binary running without libkvq.so, the man page rendering,
# the install message saying what the loader needs, examples compiled with
# pkg-config against the installed header and library and run (through
# LD_LIBRARY_PATH, an rpath, and linked statically); then `make uninstall`
# removes exactly those files (a file of another package in the same
# folders stays). Prints "N passed, N failed"; exits 1 on failure.
MAKE_CMD=${1:-make}
BUILD=${2:-build}
CC=${CC:-cc}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvq_install.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
ROOT=$TMP/root
PREFIX=/opt/kvq-install-test
P=$ROOT$PREFIX
V=$(sed -n 's/^#define KVQ_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/kvq.h | paste -sd. -)
M=${V%%.*}

echo "-- make install PREFIX=$PREFIX DESTDIR=$ROOT"
if $MAKE_CMD --no-print-directory install BUILD="$BUILD" PREFIX="$PREFIX" DESTDIR="$ROOT" \
    >"$TMP/install.log" 2>&1; then ok; else bad "make install failed"; fi
cat "$TMP/install.log"

echo "-- installed files"
for f in include/kvq.h lib/libkvq.a lib/libkvq.so.$V bin/kvq lib/pkgconfig/kvq.pc \
    share/man/man1/kvq.1; do
    if [ -f "$P/$f" ] && [ ! -L "$P/$f" ]; then ok; else bad "$PREFIX/$f is not installed"; fi
done
[ "$(readlink "$P/lib/libkvq.so.$M")" = "libkvq.so.$V" ] && ok ||
    bad "lib/libkvq.so.$M is not a link to libkvq.so.$V"
[ "$(readlink "$P/lib/libkvq.so")" = "libkvq.so.$M" ] && ok ||
    bad "lib/libkvq.so is not a link to libkvq.so.$M"
readelf -d "$P/lib/libkvq.so.$V" 2>/dev/null | grep -q "SONAME.*\[libkvq\.so\.$M\]" && ok ||
    bad "libkvq.so.$V has no soname libkvq.so.$M"
cmp -s include/kvq.h "$P/include/kvq.h" && ok || bad "the installed kvq.h differs"

echo "-- the kvq binary (libkvq linked in statically)"
readelf -d "$P/bin/kvq" | grep NEEDED | grep -q libkvq && bad "bin/kvq needs libkvq.so" || ok
out=$(env -u LD_LIBRARY_PATH "$P/bin/kvq" version 2>&1)
[ "$out" = "kvq $V" ] && ok || bad "installed kvq version printed '$out', want 'kvq $V'"

echo "-- kvq.pc and the install message name hiredis exactly when libkvq links it"
if readelf -d "$P/lib/libkvq.so.$V" | grep NEEDED | grep -q libhiredis; then with_hr=1; else with_hr=0; fi
grep '^Libs.private:' "$P/lib/pkgconfig/kvq.pc" | grep -q -- -lhiredis && pc_hr=1 || pc_hr=0
grep '^To link statically:' "$TMP/install.log" | grep -q -- -lhiredis && msg_hr=1 || msg_hr=0
[ $pc_hr = $with_hr ] && ok || bad "kvq.pc Libs.private names -lhiredis: $pc_hr, libkvq.so links it: $with_hr"
[ $msg_hr = $with_hr ] && ok || bad "the install hint names -lhiredis: $msg_hr, libkvq.so links it: $with_hr"

echo "-- the install message says what the loader needs"
grep -q "LD_LIBRARY_PATH=$PREFIX/lib" "$TMP/install.log" && ok || bad "no LD_LIBRARY_PATH hint"
grep -q "rpath,$PREFIX/lib" "$TMP/install.log" && ok || bad "no rpath hint"
grep -q "ldconfig" "$TMP/install.log" && ok || bad "no ldconfig hint"

echo "-- the man page"
MANPAGE=$P/share/man/man1/kvq.1
if command -v groff >/dev/null 2>&1; then
    groff -man -Tutf8 -ww -z "$MANPAGE" >"$TMP/groff.err" 2>&1
    [ ! -s "$TMP/groff.err" ] && ok || { bad "groff warns about kvq.1:"; head "$TMP/groff.err"; }
    groff -man -Tutf8 -P-c -P-b -P-u "$MANPAGE" 2>/dev/null >"$TMP/man.txt"
    for c in simulate generate eval calibrate sweep inspect codecs "bench codecs" "bench attend" \
        version; do
        grep -q "kvq $c" "$TMP/man.txt" && ok || bad "the man page does not document kvq $c"
    done
else
    echo "SKIP man page rendering: groff is not installed"
fi

echo "-- examples built with pkg-config against the installed kvq"
PC="pkg-config --define-variable=prefix=$P"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
cflags=$($PC --cflags kvq) && libs=$($PC --libs kvq) && ok || bad "pkg-config kvq failed"
[ "$(echo $cflags)" = "-I$P/include" ] && ok || bad "pkg-config --cflags kvq gave '$cflags'"
mkdir -p "$TMP/run"
# the quickstart with the build line of its README/comment
if $CC -std=c11 -Wall -Wextra -o "$TMP/quickstart" examples/quickstart.c $cflags $libs; then
    ok
    readelf -d "$TMP/quickstart" | grep NEEDED | grep -q "libkvq\.so\.$M" && ok ||
        bad "quickstart does not need libkvq.so.$M"
    (cd "$TMP/run" && LD_LIBRARY_PATH="$P/lib" "$TMP/quickstart") && ok ||
        bad "quickstart with LD_LIBRARY_PATH=$PREFIX/lib failed"
else
    bad "quickstart does not compile against the installed kvq"
fi
# an rpath instead of LD_LIBRARY_PATH
if $CC -std=c11 -Wall -Wextra -o "$TMP/codec_rpath" examples/codec_roundtrip.c $cflags $libs \
    -lm "-Wl,-rpath,$P/lib"; then
    ok
    (cd "$TMP/run" && env -u LD_LIBRARY_PATH "$TMP/codec_rpath" >/dev/null) && ok ||
        bad "codec_roundtrip with an rpath failed"
else
    bad "codec_roundtrip does not compile against the installed kvq"
fi
# statically, with the private libraries kvq.pc names
static_libs=$($PC --static --libs-only-l kvq | sed 's/-lkvq//')
if $CC -std=c11 -Wall -Wextra -o "$TMP/snapshot_static" examples/snapshot.c $cflags \
    "$P/lib/libkvq.a" $static_libs -lm; then
    ok
    readelf -d "$TMP/snapshot_static" | grep NEEDED | grep -q libkvq &&
        bad "the static snapshot example needs libkvq.so" || ok
    (cd "$TMP/run" && env -u LD_LIBRARY_PATH "$TMP/snapshot_static" >/dev/null) && ok ||
        bad "the static snapshot example failed"
else
    bad "snapshot does not link statically against the installed libkvq.a"
fi

echo "-- make uninstall"
: >"$P/lib/other-package.so" # a file install did not write
if $MAKE_CMD --no-print-directory uninstall BUILD="$BUILD" PREFIX="$PREFIX" DESTDIR="$ROOT" \
    >"$TMP/uninstall.log" 2>&1; then ok; else bad "make uninstall failed"; cat "$TMP/uninstall.log"; fi
[ -f "$P/lib/other-package.so" ] && ok || bad "uninstall removed a file install did not write"
rm -f "$P/lib/other-package.so"
left=$(find "$ROOT" ! -type d)
[ -z "$left" ] && ok || bad "uninstall left: $left"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
