/*
 * store_ref.h - the references a cache holds on its cold store. A cache
 * that uses a store as its cold tier retains it at creation and releases it
 * when freed (after deleting its records through it); kvq_store_close on a
 * store that is still retained only marks it closed, and the last release
 * closes it. So freeing a cache after closing its store is safe (kvq.h
 * states the rule).
 */
#ifndef KVQ_STORE_REF_H
#define KVQ_STORE_REF_H

#include "kvq.h"

void kvq__store_retain(kvq_store *s);
/* Drops a reference; closes the store when it was the last one and
 * kvq_store_close was called. NULL is ignored. */
void kvq__store_release(kvq_store *s);

#endif
