/*
 * inspect_demo.c - writes a small demo store for tests/inspect_test.sh:
 * three page records (one of them an empty page) and a plain value, and with
 * --bad-record also a record with a flipped byte and a record of format
 * version 3. Usage: inspect_demo STORE-URL [--bad-record]. Exit status 0 on
 * success, 3 when the store kind is not built in (KVQ_ERR_UNSUPPORTED) or
 * cannot be reached (KVQ_ERR_CONN), 1 otherwise. Built by the Makefile
 * next to the test binaries (not linked into them).
 */
#include "kvq.h"
#include "tier/record.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *LAYOUT = "k=int8,v=tq3;k=int8,v=tq3";

/* A page of 16 slots in `layer` holding n tokens from position first. */
static uint8_t *demo_record(uint32_t layer, uint32_t n, int32_t first, size_t *size) {
    int32_t pos[16];
    uint8_t states[16], block[200];
    for (int i = 0; i < 16; i++) {
        pos[i] = i < (int)n ? first + i : -1;
        states[i] = i < (int)n ? 1 : 0;
    }
    for (int i = 0; i < 200; i++)
        block[i] = (uint8_t)(i * 7 + layer);
    kvq__record r;
    memset(&r, 0, sizeof r);
    r.cache_id = 0x00c0ffee00000001ull;
    r.layer = layer;
    r.page_tokens = 16;
    r.n_kv_heads = 2;
    r.head_dim = 64;
    r.n_tokens = n;
    r.pos_min = n ? first : -1;
    r.pos_max = n ? first + (int32_t)n - 1 : -1;
    r.prefix_hash = 0x1234abcd5678ef00ull + layer;
    r.layout = LAYOUT;
    r.layout_len = strlen(LAYOUT);
    r.positions = pos;
    r.states = states;
    r.block = block;
    r.block_len = sizeof block;
    *size = kvq__record_size(&r);
    uint8_t *buf = (uint8_t *)malloc(*size);
    if (!buf || kvq__record_encode(&r, buf, *size, size) != KVQ_OK) {
        fprintf(stderr, "inspect_demo: cannot encode a record\n");
        exit(1);
    }
    return buf;
}

static void put(kvq_store *s, const char *key, const void *data, size_t size) {
    kvq_status st = kvq_store_put(s, key, data, size);
    if (st != KVQ_OK) {
        fprintf(stderr, "inspect_demo: put %s: %s\n", key, kvq_store_last_error(s));
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: inspect_demo STORE-URL [--bad-record]\n");
        return 1;
    }
    int bad = argc > 2 && strcmp(argv[2], "--bad-record") == 0;
    kvq_store *s = NULL;
    char err[256];
    kvq_status st = kvq_store_open(&s, argv[1], NULL, err, sizeof err);
    if (st != KVQ_OK) {
        fprintf(stderr, "inspect_demo: %s: %s\n", argv[1], err);
        return st == KVQ_ERR_UNSUPPORTED || st == KVQ_ERR_CONN ? 3 : 1;
    }
    size_t n;
    uint8_t *r = demo_record(0, 16, 0, &n);
    put(s, "page/0/0", r, n);
    free(r);
    r = demo_record(0, 10, 16, &n);
    put(s, "page/0/1", r, n);
    free(r);
    r = demo_record(1, 0, 0, &n);
    put(s, "page/1/0", r, n);
    free(r);
    put(s, "snap/meta", "kvq snapshot demo\n", 18);
    if (bad) {
        r = demo_record(2, 5, 100, &n);
        r[n - 50] ^= 0x10; /* in the block: the record's CRC fails */
        put(s, "page/9/bad", r, n);
        free(r);
        r = demo_record(2, 5, 200, &n);
        r[4] = 3; /* version 3 (a future one), CRC made valid again */
        kvq__st32(r + n - 4, kvq__crc32c(0, r, n - 4));
        put(s, "page/9/v3", r, n);
        free(r);
    }
    kvq_store_close(s);
    return 0;
}
