#!/bin/sh
# vs-llamacpp.sh - KV-cache quality of kvq against the real llama.cpp's
# quantized KV caches on stories15M, written as docs/vs-llamacpp.md.
#
# llama.cpp side: the peer in DATA/../peers/llamacpp (setup.sh builds
# llama.cpp's tools from what npm's node-llama-cpp ships and converts
# stories15M to GGUF with its heads zero-padded from 48 to 64 values, since
# llama.cpp refuses a quantized KV cache when its block of 32 does not divide
# head_dim). For each KV type: llama-perplexity -c 256 -b 256 -fa on -t 1,
# first f16 with --kl-divergence-base, then each quantized type against it.
# kvq side: kvq eval on the same text for each configuration, against kvq's
# own f32 cache. Both report KL mean, KL p99, change of perplexity, same
# top-1 token and bits per value; the document pairs every llama.cpp type
# with the kvq configurations that store no more real bits per value.
#
# Needs POSIX sh, awk, /usr/bin/python3 (JSON and the GGUF header), and for a
# peer not yet built: bash, npm (and the network to reach its registry), g++,
# git, numpy. Takes about 6 minutes on one core, 2 more to build the peer.
# Exit status: 0 ok, 1 a failure (peer, kvq, files), 2 usage.

usage() {
    cat <<'EOF'
usage: sh bench/vs-llamacpp.sh [--peer-dir DIR] [--peer-src DIR] [--kvq PATH]
          [--data DIR] [--text FILE] [--out FILE] [--kvq-configs "K/V ..."]
          [--llama-types "TYPE ..."]
  --peer-dir DIR      where the llama.cpp peer is (built there by setup.sh when
                      its tools or models are missing); default $PEER_DIR, else
                      $HOME/.cache/kvq-llamacpp-peer
  --peer-src DIR      the folder of the peer's setup.sh and README.md
                      (DATA/../peers/llamacpp)
  --kvq PATH          the kvq binary (build/kvq)
  --data DIR          the shared data: stories15M/, text/ (../shared/data)
  --text FILE         the text both tools read
                      (DATA/text/tinystories-valid-sample.txt)
  --out FILE          the document written (docs/vs-llamacpp.md)
  --kvq-configs LIST  kvq configurations, space-separated: K/V (key and value
                      codecs, e.g. int8/int4 or int4:g=16/int4:g=16), C (the
                      same codec for both), kv=N (the preset --kv N)
  --llama-types LIST  llama.cpp KV types: T or K/V for a mixed cache (f16 is
                      always run first: it is the base of the others)
Relative paths are taken from the repository root.
EOF
}

die() { echo "vs-llamacpp.sh: $*" >&2; exit 1; }
say() { echo "vs-llamacpp.sh: $*" >&2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd) || exit 2
# The command line as typed, quoted where a word needs it, for the document.
CMD="sh bench/vs-llamacpp.sh"
for a in "$@"; do
    case $a in
    *[!A-Za-z0-9_./:=+-]*|'') CMD="$CMD '$(printf '%s' "$a" | sed "s/'/'\\\\''/g")'" ;;
    *) CMD="$CMD $a" ;;
    esac
done

PEER=${PEER_DIR:-$HOME/.cache/kvq-llamacpp-peer}
PEER_SRC= KVQ=build/kvq DATA=../shared/data TEXT= OUT=docs/vs-llamacpp.md
CONFIGS= LTYPES="q8_0 q5_1 q5_0 q4_1 q4_0 iq4_nl q8_0/q4_0"
while [ $# -gt 0 ]; do
    case $1 in
    -h|--help) usage; exit 0 ;;
    --peer-dir|--peer-src|--kvq|--data|--text|--out|--kvq-configs|--llama-types)
        [ $# -ge 2 ] || { usage >&2; echo "vs-llamacpp.sh: $1 needs a value" >&2; exit 2; }
        case $1 in
        --peer-dir) PEER=$2 ;; --peer-src) PEER_SRC=$2 ;; --kvq) KVQ=$2 ;;
        --data) DATA=$2 ;; --text) TEXT=$2 ;; --out) OUT=$2 ;;
        --kvq-configs) CONFIGS=$2 ;; --llama-types) LTYPES=$2 ;;
        esac
        shift 2 ;;
    *) usage >&2; echo "vs-llamacpp.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

cd "$ROOT" || exit 1
T0=$(date +%s)
PY=/usr/bin/python3
[ -x $PY ] || die "$PY is missing (it reads kvq's JSON and the GGUF headers)"
[ -x "$KVQ" ] || die "no kvq binary at $KVQ (make, or pass --kvq PATH)"
[ -d "$DATA" ] || die "no data folder at $DATA (--data DIR)"
DATA=$(cd "$DATA" && pwd)
[ -n "$TEXT" ] || TEXT=$DATA/text/tinystories-valid-sample.txt
[ -n "$PEER_SRC" ] || PEER_SRC=$DATA/../peers/llamacpp
MODEL=$DATA/stories15M/stories15M.bin TOK=$DATA/stories15M/tokenizer.bin
for f in "$MODEL" "$TOK" "$TEXT"; do [ -f "$f" ] || die "missing $f"; done
case $TEXT in /*) ;; *) TEXT=$ROOT/$TEXT ;; esac
case $OUT in /*) ;; *) OUT=$ROOT/$OUT ;; esac
[ -d "$(dirname "$OUT")" ] || die "no folder for --out $OUT"

# The default kvq list: plain codecs, and the --kv presets when this kvq has them.
if [ -z "$CONFIGS" ]; then
    CONFIGS="f16/f16 int8/int8 int8/int4 int8/tq4 int4:g=16/int4:g=16 int4/int4 tq4/tq4 tq3/tq3"
    if "$KVQ" eval --help 2>&1 | grep -q -- '--kv N'; then
        CONFIGS="$CONFIGS kv=8 kv=6 kv=4 kv=3"
    fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvq_vsllama.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
trap 'exit 1' INT TERM HUP

# ---- the peer: use it when built, else build it with its own setup.sh ------
BUILT=
mkdir -p "$PEER" 2>/dev/null || die "cannot create the peer folder $PEER"
PEER=$(cd "$PEER" && pwd)
B=$PEER/bin PADDED=$PEER/models/stories15M-hd64.gguf UNPADDED=$PEER/models/stories15M.gguf
peer_ready() { [ -x "$B/llama-perplexity" ] && [ -f "$PADDED" ] && [ -f "$UNPADDED" ]; }
if ! peer_ready; then
    [ -f "$PEER_SRC/setup.sh" ] || die "the peer is not built in $PEER and its setup.sh is not in $PEER_SRC (--peer-src DIR)"
    missing=
    [ -d "$PEER/node_modules/node-llama-cpp" ] || command -v npm >/dev/null 2>&1 || missing="$missing npm"
    for c in bash g++ git; do command -v $c >/dev/null 2>&1 || missing="$missing $c"; done
    $PY -c 'import numpy' 2>/dev/null || missing="$missing numpy(for $PY)"
    [ -z "$missing" ] || die "cannot build the llama.cpp peer in $PEER: missing$missing (the peer is built from npm's node-llama-cpp 3.21.1 with g++; or pass --peer-dir with a built peer)"
    say "building the llama.cpp peer in $PEER with $PEER_SRC/setup.sh (about 2 minutes)"
    if ! bash "$PEER_SRC/setup.sh" "$PEER" >"$WORK/setup.log" 2>&1; then
        tail -n 15 "$WORK/setup.log" >&2
        if [ ! -d "$PEER/node_modules/node-llama-cpp" ]; then
            die "npm could not install node-llama-cpp 3.21.1 into $PEER (no network, or the npm registry is unreachable?); the llama.cpp peer's tools are missing"
        fi
        die "the llama.cpp peer's setup.sh failed in $PEER (log above): its tools are missing"
    fi
    BUILT=", building the peer included"
    peer_ready || die "setup.sh ran but the peer's tools are missing: $B/llama-perplexity, $PADDED, $UNPADDED"
fi
PEER_VERSION=$("$B/llama-perplexity" --version 2>&1 | sed -n 's/^version: //p' | head -n 1)
NLC_VERSION=$(sed -n 's/^  "version": "\(.*\)",*$/\1/p' "$PEER/node_modules/node-llama-cpp/package.json" 2>/dev/null | head -n 1)

# head_dim of the real model and of the padded one llama.cpp stores, from
# the GGUF headers (key_length, else embedding_length / head_count).
cat >"$WORK/gguf_hd.py" <<'EOF'
import struct, sys
def head_dim(path):
    f = open(path, 'rb')
    def rd(fmt):
        return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))
    if f.read(4) != b'GGUF':
        sys.exit(path + ': not a GGUF file')
    rd('I'); ntensors, nkv = rd('QQ')
    fixed = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    def val(t):
        if t == 8:
            n, = rd('Q'); return f.read(n).decode('utf-8', 'replace')
        if t == 9:
            et, n = rd('IQ')
            if et in fixed:
                f.seek(struct.calcsize('<' + fixed[et]) * n, 1)
            else:
                for _ in range(n): val(et)
            return None
        return rd(fixed[t])[0]
    kv = {}
    for _ in range(nkv):
        n, = rd('Q'); k = f.read(n).decode('utf-8', 'replace'); t, = rd('I'); kv[k] = val(t)
    a = kv.get('general.architecture', 'llama')
    hd = kv.get(a + '.attention.key_length')
    return hd if hd else kv[a + '.embedding_length'] // kv[a + '.attention.head_count']
print(head_dim(sys.argv[1]), head_dim(sys.argv[2]))
EOF
HD=$($PY "$WORK/gguf_hd.py" "$UNPADDED" "$PADDED") || die "cannot read the head_dim of the peer's GGUF models"
set -- $HD; HD_REAL=$1 HD_PAD=$2

# ---- llama.cpp runs --------------------------------------------------------
# Bits per value as llama.cpp counts them: ggml's block bytes x 8 / block size.
lbits() {
    case $1 in
    f32) echo 32 ;; f16|bf16) echo 16 ;; q8_0) echo 8.5 ;; q5_1) echo 6 ;; q5_0) echo 5.5 ;;
    q4_1) echo 5 ;; q4_0|iq4_nl) echo 4.5 ;; *) echo "" ;;
    esac
}
ALLOWED=$("$B/llama-perplexity" --help 2>&1 | sed -n 's/.*allowed values: //p' | head -n 1 | tr -d ',')
lp() { "$B/llama-perplexity" -m "$PADDED" -c 256 -b 256 -fa on -t 1 "$@"; }
# parse a llama-perplexity log: PPL(Q) KL-mean KL-p99 same-top-1-% KL-mean's-stderr
lparse() {
    awk '/Mean PPL\(Q\) +:/ { sub(/.*: */, ""); p = $1 }
         /Mean +KLD:/ { sub(/.*KLD: */, ""); k = $1; e = $3 }
         /99\.0% +KLD:/ { sub(/.*KLD: */, ""); q = $1 }
         /Same top p:/ { sub(/.*Same top p: */, ""); t = $1 }
         END { if (p == "" || k == "" || q == "" || t == "" || e == "") exit 1; print p, k, q, t, e }' "$1"
}

: >"$WORK/llama.tsv"
say "llama.cpp f16 (the base)"
lp -f "$TEXT" -ctk f16 -ctv f16 --kl-divergence-base "$WORK/base.kld" >"$WORK/f16.log" 2>&1 ||
    { tail -n 5 "$WORK/f16.log" >&2; die "llama-perplexity failed on the f16 base"; }
PPL_BASE=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$WORK/f16.log")
[ -n "$PPL_BASE" ] || die "no final PPL in llama-perplexity's f16 output"
printf 'f16\t16\tok\t%s\t0\t0\t100\t0\n' "$PPL_BASE" >>"$WORK/llama.tsv"
for t in $LTYPES; do
    k=${t%/*} v=${t#*/}
    [ "$t" = f16 ] && continue
    kb=$(lbits "$k") vb=$(lbits "$v")
    if [ -z "$kb" ] || [ -z "$vb" ]; then say "skipping $t: unknown KV type"; continue; fi
    case " $ALLOWED " in *" $k "*) ;; *) printf '%s\t0\tnot offered by this llama.cpp\n' "$t" >>"$WORK/llama.tsv"; continue ;; esac
    case " $ALLOWED " in *" $v "*) ;; *) printf '%s\t0\tnot offered by this llama.cpp\n' "$t" >>"$WORK/llama.tsv"; continue ;; esac
    say "llama.cpp $t"
    log=$WORK/llama-$k-$v.log
    if lp -ctk "$k" -ctv "$v" --kl-divergence-base "$WORK/base.kld" --kl-divergence >"$log" 2>&1 &&
       r=$(lparse "$log"); then
        bits=$(awk -v a="$kb" -v b="$vb" 'BEGIN { print (a + b) / 2 }')
        printf '%s\t%s\tok\t%s\n' "$t" "$bits" "$(echo "$r" | tr ' ' '\t')" >>"$WORK/llama.tsv"
    else
        why=$(grep -m 1 ' E ' "$log" | sed 's/^[0-9. ]*E //')
        printf '%s\t0\trefused: %s\n' "$t" "${why:-llama-perplexity failed}" >>"$WORK/llama.tsv"
    fi
done
# what llama.cpp says about the unpadded model
REFUSAL=$("$B/llama-perplexity" -m "$UNPADDED" -f "$TEXT" -c 256 -b 256 -fa on -t 1 -ctk q8_0 -ctv q8_0 \
    --chunks 1 2>&1 | grep -m 1 'does not divide' | sed 's/^.* E //')

# ---- kvq runs --------------------------------------------------------------
: >"$WORK/kvq.tsv"
for c in $CONFIGS; do
    case $c in
    kv=*) set -- --kv "${c#kv=}"; label="--kv ${c#kv=}" ;;
    */*) set -- --k-codec "${c%%/*}" --v-codec "${c#*/}"; label="${c%%/*} / ${c#*/}" ;;
    *) set -- --k-codec "$c" --v-codec "$c"; label="$c / $c" ;;
    esac
    # the f32 reference is computed once and reused by the later runs
    if [ -f "$WORK/kvq-base.f32" ]; then set -- "$@" --base-logits "$WORK/kvq-base.f32"
    else set -- "$@" --save-logits "$WORK/kvq-base.f32"; fi
    say "kvq $label"
    if ! "$KVQ" eval --model "$MODEL" --tokenizer "$TOK" --text "$TEXT" --json "$@" \
            >"$WORK/kvq.json" 2>"$WORK/kvq.err"; then
        cat "$WORK/kvq.err" >&2
        die "kvq eval failed for '$c'"
    fi
    $PY - "$WORK/kvq.json" "$label" >>"$WORK/kvq.tsv" <<'EOF' || die "cannot read kvq eval's JSON for '$c'"
import json, sys
d = json.load(open(sys.argv[1]))
b = d['bits_per_value']
a = d.get('asymptotic_bits_per_value', b)
print('\t'.join(str(x) for x in (sys.argv[2], a, b, d['kl'], d['kl_p99'],
      d['ppl'] / d['ppl_f32'] - 1, 100 * d['top1_agree'], d['ppl_f32'], d.get('kl_stderr', 0))))
EOF
done

# ---- the document ----------------------------------------------------------
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=$(git -C "$ROOT" status --porcelain -- src include tools Makefile 2>/dev/null | wc -l | tr -d ' ')
KVQV=$("$KVQ" --version 2>/dev/null | head -n 1)
CPU=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: *//')
DATE=$(date -u +%Y-%m-%d)
SECS=$(( $(date +%s) - T0 ))
README=$PEER_SRC/README.md; [ -f "$README" ] || README=/dev/null
case $TEXT in */tinystories-valid-sample.txt) SAMEtext=1 ;; *) SAMEtext=0 ;; esac

cat >"$WORK/doc.awk" <<'EOF'
function floor(y) { return (y >= 0 || y == int(y)) ? int(y) : int(y) - 1 }
function fmt(x,   d) {               # 3 significant digits, at most 6 decimals
    if (x == 0) return "0"
    if (x < 0.000001 && x > -0.000001) return sprintf("%.1e", x)
    d = 2 - floor(log(x < 0 ? -x : x) / log(10) + 1e-9)
    if (d < 0) d = 0; if (d > 6) d = 6
    return sprintf("%." d "f", x)
}
function unsigned(s) { sub(/^\+/, "", s); return s }
function decs(s) { return index(s, ".") ? length(s) - index(s, ".") : 0 }
function near(x, s) { return sprintf("%." decs(s) "f", x) == s }   # x printed as README printed s
function pct(x) { return sprintf("%+.2f %%", 100 * x) }
function b2(x) { return sprintf("%.2f", x) }
function ratio(a, b) { return b > 0 ? sprintf("%.1fx", a / b) : "-" }
FILENAME ~ /llama.tsv$/ {
    if ($3 != "ok") { bad[++nbad] = $1; badwhy[nbad] = $3; next }
    n = ++nl; lt[n] = $1; lb[n] = $2; lr[n] = $2 * hdp / hdr
    if ($1 == "f16") { pbase = $4; lkl[n] = 0; lp99[n] = 0; ld[n] = 0; lt1[n] = 100; next }
    ld[n] = $4 / pbase - 1; lkl[n] = $5; lp99[n] = $6; lt1[n] = $7; lse[n] = $8; next
}
FILENAME ~ /kvq.tsv$/ {
    n = ++nk; kc[n] = $1; ka[n] = $2; kb[n] = $3; kkl[n] = $4; kp99[n] = $5; kd[n] = $6; kt1[n] = $7; kse[n] = $9; next
}
# the peer README table: | llama.cpp TYPE | bits | KL mean | KL p99 | dPPL | top-1 |
/^\| llama\.cpp / {
    split($0, c, /[ ]*\|[ ]*/); name = c[2]; sub(/^llama\.cpp /, "", name)
    if (name ~ / K \/ .* V$/) { sub(/ K \/ /, "/", name); sub(/ V$/, "", name) }
    rkl[name] = c[4]; rp99[name] = c[5]; rd[name] = c[6]; rt1[name] = c[7]; sub(/ *%/, "", rd[name])
}
function lname(t) { if (t ~ /\//) { sub(/\//, " K / ", t); t = t " V" } return "llama.cpp " t }
function lrow(i) {
    if (lt[i] == "f16")
        return sprintf("| **%s** (the base) | %s | %s | 0 | 0 | 0 | 100 |", lname(lt[i]), b2(lb[i]), b2(lr[i]))
    return sprintf("| **%s** | %s | %s | %s | %s | %s | %s |", lname(lt[i]), b2(lb[i]), b2(lr[i]),
        fmt(lkl[i]), fmt(lp99[i]), pct(ld[i]), sprintf("%.2f", lt1[i]))
}
function krow(j, pre) {
    return sprintf("| %skvq %s | %s | %s (all bytes %s) | %s | %s | %s | %s |", pre, kc[j], b2(ka[j]), b2(ka[j]),
        b2(kb[j]), fmt(kkl[j]), fmt(kp99[j]), pct(kd[j]), sprintf("%.2f", kt1[j]))
}
function wins(i, j,   s, kw, lw, f, noise, w, d) {
    kw = ""; lw = ""
    if (kp99[j] < lp99[i]) kw = kw ", KL p99"; else if (kp99[j] > lp99[i]) lw = lw ", KL p99"
    if (kd[j] < ld[i]) kw = kw ", ΔPPL"; else if (kd[j] > ld[i]) lw = lw ", ΔPPL"
    if (kt1[j] > lt1[i]) kw = kw ", top-1"; else if (kt1[j] < lt1[i]) lw = lw ", top-1"
    f = 100 * (1 - ka[j] / lr[i])
    s = sprintf("- %s at %s real bits vs kvq %s at %s bits (%s): ", lname(lt[i]), b2(lr[i]),
        kc[j], b2(ka[j]), f < 0.5 ? "the same bits" : sprintf("%.0f %% fewer", f))
    # a difference of KL mean under twice its standard error is called a tie
    noise = 2 * sqrt(lse[i] * lse[i] + kse[j] * kse[j])
    d = kkl[j] - lkl[i]
    if (d < -noise) { w = "k"; s = s sprintf("**kvq wins** on KL mean (%s vs %s, %s lower)", fmt(kkl[j]), fmt(lkl[i]), ratio(lkl[i], kkl[j])) }
    else if (d > noise) { w = "l"; s = s sprintf("**llama.cpp wins** on KL mean (%s vs %s, %s lower)", fmt(lkl[i]), fmt(kkl[j]), ratio(kkl[j], lkl[i])) }
    else { w = ""; s = s sprintf("**a tie** on KL mean (kvq %s, llama.cpp %s: the difference is under twice its standard error, %s)", fmt(kkl[j]), fmt(lkl[i]), fmt(noise)) }
    if (kw != "") s = s "; kvq is " (w == "k" ? "also " : "") "better on " substr(kw, 3)
    if (lw != "") s = s "; llama.cpp is " (w == "l" ? "also " : "") "better on " substr(lw, 3)
    return s "."
}
END {
    print "# kvq against llama.cpp: KV-cache quality on stories15M"
    print ""
    printf "Made by `%s` on %s (UTC): kvq commit %s", cmd, date, commit
    if (dirty > 0) printf " with uncommitted changes to %d source file%s", dirty, dirty == 1 ? "" : "s"
    printf " (%s),\nllama.cpp %s", kvqv, peerv
    if (nlcv != "") printf " (the source and CPU libraries of npm's node-llama-cpp %s)", nlcv
    printf ",\nCPU %s; the script took %d min %02d s%s.\n", cpu, int(secs / 60), secs % 60, built
    print ""
    print "Both tools read " text " (stories15M, KV caches of 6 layers x 6 heads). Each reports, against"
    print "its own full-precision cache: the mean and 99th percentile of the KL divergence of the next-token"
    print "distribution, the change of perplexity (ΔPPL) and how often the top-1 token is the same."
    print ""
    print "## Bits per value"
    print ""
    if (refusal != "") printf "llama.cpp refuses a quantized KV cache on stories15M (head_dim %d): \"%s\". The comparison\ntherefore runs", hdr, refusal
    else printf "The comparison runs"
    printf " llama.cpp on the peer model with its heads zero-padded to %d (the same function:\n", hdp
    print "KL 0 against the unpadded model), which llama.cpp stores whole. **bits/value** is what each tool"
    printf "counts per stored value (llama.cpp: ggml block bytes x 8 / 32); **real bits/value** counts llama.cpp's\n"
    printf "per real value (x %d/%d). kvq stores head_dim %d as it is: its real bits are its asymptotic bits, and\n", hdp, hdr, hdr
    print "\"all bytes\" adds every byte kvq allocated on these short stories (per-sequence fixed bytes, page"
    print "slack) over the values stored."
    print ""
    print "## Pairs: each llama.cpp type and the kvq configurations of no more real bits"
    print ""
    print "Under each llama.cpp type: the kvq configuration with the lowest KL mean among those that store no"
    print "more real bits per value, and, where it is another one, the cheapest that still has a KL mean no"
    print "higher than llama.cpp's."
    print ""
    print "| KV cache | bits/value | real bits/value | KL mean | KL p99 | ΔPPL | same top-1 % |"
    print "|---|---|---|---|---|---|---|"
    for (i = 1; i <= nl; i++) {
        print lrow(i)
        best = 0; cheap = 0
        for (j = 1; j <= nk; j++) {
            if (ka[j] > lr[i] + 1e-9) continue
            if (!best || kkl[j] < kkl[best]) best = j
            if (lt[i] != "f16" && kkl[j] <= lkl[i] && (!cheap || ka[j] < ka[cheap] || (ka[j] == ka[cheap] && kkl[j] < kkl[cheap]))) cheap = j
        }
        pb[i] = best; pc[i] = cheap
        if (best) print krow(best, "↳ ")
        else print "| ↳ (no kvq configuration at these bits) | | | | | | |"
        if (cheap && cheap != best) print krow(cheap, "↳ ")
    }
    print ""
    print "Which wins (KL mean first: it is what a KV cache costs in model quality):"
    print ""
    for (i = 1; i <= nl; i++) {
        if (lt[i] == "f16") {
            if (pb[i]) printf("- llama.cpp f16 is the base of the llama.cpp figures (0 by definition); kvq %s against kvq's f32 cache: KL mean %s.\n", kc[pb[i]], fmt(kkl[pb[i]]))
            continue
        }
        if (pb[i]) print wins(i, pb[i])
        if (pc[i] && pc[i] != pb[i]) print wins(i, pc[i])
    }
    for (i = 1; i <= nbad; i++) printf("- llama.cpp %s: %s.\n", bad[i], badwhy[i])
    print ""
    print "## Every kvq configuration"
    print ""
    print "| KV cache | bits/value | real bits/value | KL mean | KL p99 | ΔPPL | same top-1 % |"
    print "|---|---|---|---|---|---|---|"
    for (j = 1; j <= nk; j++) print krow(j, "")
    print ""
    print "## Against the figures measured by hand"
    print ""
    if (!sametext) { print "This run read another text than the peer README's table: no comparison."; }
    else {
        m = 0; same = 0; cnt = 0
        for (i = 1; i <= nl; i++) {
            if (!(lt[i] in rkl)) continue
            cnt++
            if (near(lkl[i], rkl[lt[i]]) && near(lp99[i], rp99[lt[i]]) && near(100 * ld[i], unsigned(rd[lt[i]])) && near(lt1[i], rt1[lt[i]])) same++
            e = rkl[lt[i]] > 0 ? (lkl[i] - rkl[lt[i]]) / rkl[lt[i]] : 0; if (e < 0) e = -e; if (e > m) m = e
            rows = rows sprintf("| %s | %s / %s | %s / %s | %s / %s %% | %.2f / %s |\n", lname(lt[i]), fmt(lkl[i]), rkl[lt[i]],
                fmt(lp99[i]), rp99[lt[i]], pct(ld[i]), rd[lt[i]], lt1[i], rt1[lt[i]])
        }
        if (cnt == 0) print "The peer README has no llama.cpp rows to compare with."
        else {
            printf "The llama.cpp figures above against the table in the peer's README (same protocol, same text):\n"
            printf "%d of %d types agree in every digit the README prints; the largest difference of KL mean is\n%.1f %%%s.\n\n", same, cnt, 100 * m, same == cnt ? " (the README's rounding)" : ""
            print "| KV type | KL mean (here / README) | KL p99 | ΔPPL | same top-1 % |"
            print "|---|---|---|---|---|"
            printf "%s", rows
        }
    }
    print ""
    print "## Protocols"
    print ""
    print "- llama.cpp: `llama-perplexity -m stories15M-hd64.gguf -c 256 -b 256 -fa on -t 1`, first with"
    print "  `-ctk f16 -ctv f16 --kl-divergence-base base.kld`, then `-ctk K -ctv V --kl-divergence-base"
    print "  base.kld --kl-divergence` per type. It cuts the text into 256-token chunks (BOS first), runs each"
    print "  chunk as one batch whose queries see the quantized cache, and scores positions 128-255 against"
    print "  its own f16-cache run. ΔPPL is the quantized run's PPL over the f16 run's final PPL (llama-perplexity's"
    print "  own PPL(base) is computed from the logits it stored in compressed form and reads lower)."
    print "- kvq: `kvq eval --model stories15M.bin --tokenizer tokenizer.bin --text FILE --k-codec K --v-codec V"
    print "  --json` (or `--kv N`). It decodes each story (one per line, BOS first) token by token through the"
    print "  compressed cache and scores every position against its own f32 cache; ΔPPL is ppl / ppl_f32 - 1."
    print "  Its kernels are the best this CPU has (`--isa auto`)."
    print "- The peer README measured that scoring only the later half of each chunk does not bias KL here by"
    print "  more than 5 % (llama.cpp -c 128 against -c 256, kvq's first against later positions), so the KL"
    print "  figures of the two tools are comparable; their absolute perplexities are not (different"
    print "  tokenization into chunks, contexts and bases)."
}
EOF
awk -F '\t' -v cmd="$CMD" -v commit="$COMMIT" -v dirty="$DIRTY" -v kvqv="$KVQV" \
    -v peerv="$PEER_VERSION" -v nlcv="$NLC_VERSION" -v cpu="$CPU" -v date="$DATE" \
    -v secs="$SECS" -v hdr="$HD_REAL" -v hdp="$HD_PAD" -v refusal="$REFUSAL" \
    -v text="$(basename "$TEXT")" -v sametext="$SAMEtext" -v built="$BUILT" \
    -f "$WORK/doc.awk" "$WORK/llama.tsv" "$WORK/kvq.tsv" "$README" >"$WORK/out.md" || die "cannot write the document"
cp "$WORK/out.md" "$OUT" || die "cannot write $OUT"
say "wrote $OUT in $SECS s"
