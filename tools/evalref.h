/*
 * evalref.h - the f32 reference of `kvq eval` and how a compressed run is
 * compared with it, token by token, and the file that keeps the reference
 * between runs (--save-logits / --base-logits).
 *
 * Per predicted token the reference keeps what the figures need: the NLL of
 * the next token, the top token and its probability (all exact), and the
 * next-token distribution as 16-bit codes, code_i = round((max logit -
 * logit_i) / step) with step = KVQT_REF_RANGE / 65535 nats, capped at 65535
 * (log-probabilities more than KVQT_REF_RANGE nats below the top count as
 * that far below; with a vocabulary of V that adds at most V * e^-32 of
 * mass). KL(ref || run) is computed between the two distributions these
 * codes give, both quantized the same way: identical logits give exactly 0,
 * and a rounding error of at most step / 2 = 2.4e-4 nats per log-probability
 * changes KL by O(step^2) per token. NLL, top-1 agreement and the change of
 * the top token's probability use the exact values.
 *
 * The file (little-endian; a header of 64 bytes, then one record per
 * predicted token, in text order):
 *   0  8  magic "KVQREF1\0"           32 8  text hash
 *   8  4  header bytes (64)           40 8  sequences
 *   12 4  vocab                       48 8  predicted tokens
 *   16 8  model file size             56 8  hash of every record's bytes
 *   24 8  model hash
 *   record: f64 nll, f64 p_top, u32 top, u32 0, u16 codes[vocab]
 * Hashes are FNV-1a 64: the model's over the bytes of its file, the text's
 * over each sequence's token count (u64) and token ids (i32), the last over
 * the header's bytes 0..55 and then every record. It is written to
 * PATH.tmp.PID and renamed to PATH once complete.
 */
#ifndef KVQ_EVALREF_H
#define KVQ_EVALREF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVQT_REF_RANGE 32.0
#define KVQT_REF_HEADER 64

/* The reference of one predicted token; codes point into a caller's buffer. */
typedef struct kvqt_ref_row {
    double nll, p_top;
    uint32_t top;
    uint16_t *codes; /* [vocab] */
} kvqt_ref_row;

/* One predicted token of a compressed run against its reference. */
typedef struct kvqt_token_cmp {
    double kl, nll, nll_ref, dp_top; /* dp_top: |p_run(ref top) - p_ref(ref top)| */
    int top1;                        /* the run's top token is the reference's */
} kvqt_token_cmp;

/* Scratch of the comparison: exp(-code * step) for every code, and codes. */
typedef struct kvqt_ref_cmp {
    size_t vocab;
    double *e;       /* [65536] */
    uint16_t *codes; /* [vocab] */
} kvqt_ref_cmp;

int kvqt_ref_cmp_init(kvqt_ref_cmp *c, size_t vocab); /* 0, or -1 out of memory */
void kvqt_ref_cmp_free(kvqt_ref_cmp *c);
/* The reference row of logits[vocab] whose next token is next. */
void kvqt_ref_make(kvqt_ref_row *r, const float *logits, size_t vocab, int32_t next);
void kvqt_ref_compare(kvqt_ref_cmp *c, const kvqt_ref_row *r, const float *logits, int32_t next,
                      kvqt_token_cmp *out);

uint64_t kvqt_fnv1a(uint64_t h, const void *p, size_t n);
#define KVQT_FNV_INIT 0xcbf29ce484222325ull
/* Size and FNV-1a hash of a file's bytes; 0, or -1 when it cannot be read. */
int kvqt_file_hash(const char *path, uint64_t *size, uint64_t *hash);

typedef struct kvqt_ref_header {
    uint32_t vocab;
    uint64_t model_size, model_hash, text_hash, sequences, tokens;
} kvqt_ref_header;

typedef struct kvqt_ref_file {
    FILE *f;
    char *path, *tmp; /* tmp: the file being written, NULL when reading */
    size_t vocab;
    kvqt_ref_header header;
    uint64_t hash;    /* of the header and the records written so far */
    uint64_t records; /* written or read so far */
    unsigned char *rec;
} kvqt_ref_file;

/* Starts PATH.tmp.PID for writing h->tokens records. 0, or -1 with a
 * message in err (close it either way). */
int kvqt_ref_create(kvqt_ref_file *rf, const char *path, const kvqt_ref_header *h, char *err,
                    size_t err_size);
int kvqt_ref_write(kvqt_ref_file *rf, const kvqt_ref_row *r); /* 0, or -1 on a write error */
/* Checks that every record was written, writes the header's hash, syncs
 * and renames the temporary file to PATH. 0, or -1 with a message in err. */
int kvqt_ref_commit(kvqt_ref_file *rf, char *err, size_t err_size);
/* Opens PATH and checks it: its size against its header, the hash of its
 * records, then the model, vocab and text against want. 0, or -1 with err
 * naming what differs (close it either way). */
int kvqt_ref_open(kvqt_ref_file *rf, const char *path, const kvqt_ref_header *want, char *err,
                  size_t err_size);
/* The next record into r (r->codes has room for vocab codes); 0, or -1
 * with a message in err. */
int kvqt_ref_read(kvqt_ref_file *rf, kvqt_ref_row *r, char *err, size_t err_size);
/* Closes; a file being written is removed unless committed. */
void kvqt_ref_close(kvqt_ref_file *rf);

#endif
