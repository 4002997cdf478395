/*
 * alloc_json.h - the cache-configuration file that `kvq calibrate` writes and
 * every model command loads with --alloc: codecs and key handling, per
 * (layer, KV head, K/V) overrides, fitted nuq tables and key centres.
 */
#ifndef KVQ_ALLOC_JSON_H
#define KVQ_ALLOC_JSON_H

#include "cacheopts.h"

/* 0 on success; -1 with a message in err. */
int kvqt_alloc_load(const char *path, kvqt_cacheopts *o, char *err, size_t err_size);

/* The same, named for callers that load into options they built. */
#define kvqt_alloc_load_into kvqt_alloc_load

#endif
