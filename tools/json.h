/*
 * json.h - a small JSON reader for the tool's own files (cache allocations):
 * objects, arrays, strings (with \uXXXX escapes below U+0080 and the usual
 * backslash escapes), numbers, true/false/null. Depth and size are bounded;
 * errors give the byte offset.
 */
#ifndef KVQ_JSON_H
#define KVQ_JSON_H

#include <stddef.h>

typedef enum { KJ_NULL, KJ_BOOL, KJ_NUM, KJ_STR, KJ_ARR, KJ_OBJ } kj_type;

typedef struct kj_value {
    kj_type type;
    double num;
    int boolean;
    char *str;               /* KJ_STR */
    struct kj_value *items;  /* KJ_ARR / KJ_OBJ values */
    char **keys;             /* KJ_OBJ */
    size_t n;
} kj_value;

/* Parses text (NUL-terminated). Returns NULL with a message in err. */
kj_value *kj_parse(const char *text, char *err, size_t err_size);
void kj_free(kj_value *v);
const kj_value *kj_get(const kj_value *obj, const char *key); /* NULL if absent */

#endif
