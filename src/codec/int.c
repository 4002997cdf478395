/* int.c - placeholder until the family is written. */
#include "codec_impl.h"

static kvq_status kvq__int_init(kvq_codec *c, char *err, size_t err_size) {
    (void)c; (void)err; (void)err_size;
    return KVQ_ERR_UNSUPPORTED;
}
static void kvq__int_destroy(kvq_codec *c) { (void)c; }
const kvq__family_ops kvq__int_ops = { .init = kvq__int_init, .destroy = kvq__int_destroy };
