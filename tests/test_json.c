/*
 * test_json.c - the JSON reader of the tool (tools/json.c) and the --alloc
 * allocation file (tools/alloc_json.c), which are user input: RFC 8259
 * numbers only (no nan, inf, hex, '+', leading zeros, overflow), escapes
 * that never read past the end of the text, and integer fields that must
 * be integers in their range instead of being cast.
 */
#include "testutil.h"
#include "json.h"
#include "alloc_json.h"

#include <unistd.h>

/* Parses a copy of text in a buffer of exactly its size (ASan sees any
 * read past the end); 1 when it parses. */
static int parses(const char *text, double *num) {
    size_t n = strlen(text) + 1;
    char *buf = malloc(n), err[160] = "";
    memcpy(buf, text, n);
    kj_value *v = kj_parse(buf, err, sizeof err);
    int ok = v != NULL;
    if (v && num)
        *num = v->type == KJ_NUM ? v->num : NAN;
    if (!ok)
        TU_REPORT(err[0] != 0, "no message for a refused %s", text);
    kj_free(v);
    free(buf);
    return ok;
}

static void test_numbers(void) {
    const char *bad[] = {"nan", "NaN", "inf", "-inf", "Infinity", "0x10", "+1", "1e999",
                         "-1e400", ".5", "1.", "01", "-", "1e", "1e+", "--1", "[1,]x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TU_REPORT(!parses(bad[i], NULL), "accepted the number %s", bad[i]);
    const char *good[] = {"0", "-0.5", "1e-3", "12", "1E+2", "-3.25e1"};
    const double want[] = {0, -0.5, 1e-3, 12, 100, -32.5};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        double x = NAN;
        TU_REPORT(parses(good[i], &x) && x == want[i], "%s: got %g", good[i], x);
    }
}

static void test_strings(void) {
    /* a trailing \u or backslash ends the text: refused, nothing read past */
    const char *bad[] = {"\"abc\\u", "\"abc\\u12", "\"abc\\", "\"\\uZZZZ\"", "\"\\u0000\"",
                         "\"\\u00e9\"", "\"a\nb\"", "\"abc"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TU_REPORT(!parses(bad[i], NULL), "accepted the string %s", bad[i]);
    CHECK(parses("\"a\\u0041\\n\"", NULL));
}

/* Writes text to a temporary file and loads it as an allocation; 0 when it
 * loads. */
static int load_alloc(const char *text, char *err, size_t err_size) {
    char path[] = "/tmp/kvq_test_json.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -2;
    ssize_t w = write(fd, text, strlen(text));
    close(fd);
    kvqt_cacheopts o;
    kvqt_cacheopts_init(&o);
    err[0] = 0;
    int rc = w == (ssize_t)strlen(text) ? kvqt_alloc_load(path, &o, err, err_size) : -2;
    kvqt_cacheopts_free(&o);
    unlink(path);
    return rc;
}

static void test_alloc(void) {
    char err[256];
    CHECK_EQ(load_alloc("{\"kvq_alloc\": 1, \"page\": 32, \"recent\": 0, \"overrides\": "
                        "[{\"layer\": 0, \"head\": -1, \"kind\": \"k\", \"codec\": \"int8\", "
                        "\"state\": \"0aFF\"}], \"center\": [0.5, -1]}",
                        err, sizeof err),
             0);
    const char *bad[] = {
        "{\"kvq_alloc\": 1, \"page\": 1e30}",
        "{\"kvq_alloc\": 1, \"page\": 0}",
        "{\"kvq_alloc\": 1, \"page\": 16.5}",
        "{\"kvq_alloc\": 1, \"recent\": -1}",
        "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": 3e9, \"head\": 0, \"kind\": \"k\", "
        "\"codec\": \"int8\"}]}",
        "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": 0, \"head\": 1.5, \"kind\": \"k\", "
        "\"codec\": \"int8\"}]}",
        "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": -2, \"head\": 0, \"kind\": \"v\", "
        "\"codec\": \"int8\"}]}",
        "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": 0, \"head\": 0, \"kind\": \"k\", "
        "\"codec\": \"nuq4\", \"state\": \" 1\"}]}",
        "{\"kvq_alloc\": 1, \"overrides\": [{\"layer\": 0, \"head\": 0, \"kind\": \"k\", "
        "\"codec\": \"nuq4\", \"state\": \"+1\"}]}",
        "{\"kvq_alloc\": 1, \"center\": [1e39]}",
        "{\"kvq_alloc\": 1, \"center\": [nan]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = load_alloc(bad[i], err, sizeof err);
        TU_REPORT(rc == -1 && err[0], "accepted allocation %zu: %s (rc %d)", i, bad[i], rc);
    }
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    test_numbers();
    test_strings();
    test_alloc();
    return tu_finish();
}
