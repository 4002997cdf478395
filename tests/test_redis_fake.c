/*
 * test_redis_fake.c - the Redis store against a misbehaving server: the
 * fake Redis of tests/fake_redis.py (run with /usr/bin/python3 on a free
 * loopback port, one process per mode) answers slowly, not at all, with a
 * looping or endless SCAN cursor, with huge bulk lengths, with +QUEUED for
 * SET, or hangs up mid-reply. Every store call (open, put, get, del, list,
 * stats) must come back within its deadline (timeout_ms in the URL, 300 ms
 * here; the documented default of 5 s once) plus a margin of 1 s, with the
 * status and message the store promises, and the store must be usable
 * afterwards. Refusals that need no waiting (a value announced larger than
 * 1 GiB, an array of 10^8 keys, +QUEUED, a hang-up, a repeated SCAN
 * cursor) run with timeout_ms=3000 and must come back in under half of it. URL option parsing is checked without a server.
 * Prints a SKIP line when kvq was built without hiredis or /usr/bin/python3
 * is missing. --mode NAME runs one mode; --default-timeout runs the modes
 * with URLs without timeout_ms (deadline 5 s).
 */
#include "testutil.h"

#include "tier/store_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PY "/usr/bin/python3"
#define MARGIN_MS 1000 /* scheduling slack on a loaded machine: a bound, not a benchmark */

static char g_script[1024];
/* timeout_ms of the modes that must run into their deadline, and of those
 * that must be refused sooner (long, so that a loaded machine cannot make
 * a refusal look like a deadline); 0: URLs without it (the default 5 s) */
static long g_timeout_ms = 300;
static long g_refuse_timeout_ms = 3000;
static const char *g_only;

typedef struct fake {
    pid_t pid;
    int in_fd; /* the server's stdin: closing it ends the server */
    int port;
} fake;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int fake_start(fake *f, const char *mode) {
    int in[2], out[2];
    f->pid = -1;
    if (pipe(in) != 0)
        return -1;
    if (pipe(out) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl(PY, PY, g_script, mode, "120", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    f->pid = pid;
    f->in_fd = in[1];
    char line[32];
    size_t n = 0;
    struct pollfd p = {out[0], POLLIN, 0};
    double t0 = now_ms();
    while (n < sizeof line - 1 && now_ms() - t0 < 10000) {
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t k = read(out[0], line + n, 1);
        if (k <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = 0;
    close(out[0]);
    f->port = atoi(line);
    return f->port > 0 ? 0 : -1;
}

static void fake_stop(fake *f) {
    if (f->pid <= 0)
        return;
    close(f->in_fd);
    kill(f->pid, SIGTERM);
    waitpid(f->pid, NULL, 0);
    f->pid = -1;
}

/* 1 when the test of mode runs (--only) and its fake server started;
 * a server that did not start is a failure. */
static int fake_begin(fake *f, const char *mode) {
    f->pid = -1;
    if (g_only && strcmp(g_only, mode) != 0)
        return 0;
    if (fake_start(f, mode) != 0) {
        TU_REPORT(0, "%s: the fake server did not start", mode);
        fake_stop(f);
        return 0;
    }
    return 1;
}

static void url_of(char *buf, size_t n, const fake *f, long timeout_ms) {
    if (timeout_ms)
        snprintf(buf, n, "redis://127.0.0.1:%d/fk?timeout_ms=%ld", f->port, timeout_ms);
    else
        snprintf(buf, n, "redis://127.0.0.1:%d/fk", f->port);
}

/* The deadline of a call in ms: the URL's, or the documented default. */
static long deadline_ms(long timeout_ms) { return timeout_ms ? timeout_ms : 5000; }

/* What a call must do. */
typedef struct want {
    kvq_status st;
    const char *msg;  /* a piece of its message (NULL: any non-empty one) */
    long at_least_ms; /* it must have waited this long (a deadline, not a refusal) */
    long below_ms;    /* and come back sooner than this */
} want;

static void check_call(const char *mode, const char *call, kvq_status st, const char *msg,
                       double ms, want w) {
    TU_REPORT(st == w.st, "%s %s: got %d (%s), want %d (%s); message: %s", mode, call, (int)st,
              kvq_strerror(st), (int)w.st, kvq_strerror(w.st), msg);
    if (w.st != KVQ_OK && w.st != KVQ_ERR_RANGE) {
        TU_REPORT(msg[0] != 0, "%s %s: no message", mode, call);
        if (w.msg)
            TU_REPORT(strstr(msg, w.msg) != NULL, "%s %s: message '%s' does not say '%s'", mode,
                      call, msg, w.msg);
    }
    TU_REPORT(ms < w.below_ms, "%s %s: took %.0f ms, want under %ld", mode, call, ms, w.below_ms);
    TU_REPORT(ms >= w.at_least_ms, "%s %s: took %.0f ms, want at least %ld (the deadline)", mode,
              call, ms, w.at_least_ms);
    printf("  %-10s %-6s %4.0f ms  %s\n", mode, call, ms, st == KVQ_OK ? "ok" : msg);
}

static int count_cb(void *ctx, const char *key, size_t size) {
    (void)key;
    (void)size;
    ++*(int *)ctx;
    return 0;
}

enum { C_PUT, C_GET, C_DEL, C_LIST, C_STATS, C_N };
static const char *const CALL_NAMES[C_N] = {"put", "get", "del", "list", "stats"};

static kvq_status run_call(kvq_store *s, int call, double *ms) {
    double t0 = now_ms();
    kvq_status st = KVQ_OK;
    void *v = NULL;
    size_t n = 0;
    int count = 0;
    kvq_store_metrics m;
    switch (call) {
    case C_PUT:
        st = kvq_store_put(s, "k1", "value", 5);
        break;
    case C_GET:
        st = kvq_store_get(s, "k1", &v, &n);
        kvq_store_free_buf(s, v);
        break;
    case C_DEL:
        st = kvq_store_del(s, "k1");
        break;
    case C_LIST:
        st = kvq_store_list(s, "", count_cb, &count);
        break;
    default:
        st = kvq_store_stats(s, &m);
        break;
    }
    *ms = now_ms() - t0;
    return st;
}

/* Opens a store on a fake of mode and runs every call; w[call] says what
 * each must do (st == 1: skip the call). */
static void run_mode(const char *mode, long timeout_ms, const want *w) {
    fake f;
    if (!fake_begin(&f, mode))
        return;
    char url[128], err[256] = "";
    url_of(url, sizeof url, &f, timeout_ms);
    kvq_store *s = NULL;
    double t0 = now_ms();
    kvq_status st = kvq_store_open(&s, url, NULL, err, sizeof err);
    double ms = now_ms() - t0;
    TU_REPORT(st == KVQ_OK, "%s: open %s: %s", mode, url, err);
    TU_REPORT(ms < deadline_ms(timeout_ms) + MARGIN_MS, "%s: open took %.0f ms", mode, ms);
    if (st == KVQ_OK) {
        for (int c = 0; c < C_N; c++) {
            if (w[c].st == 1)
                continue;
            st = run_call(s, c, &ms);
            check_call(mode, CALL_NAMES[c], st, kvq_store_last_error(s), ms, w[c]);
        }
    }
    kvq_store_close(s);
    fake_stop(&f);
}

/* A call that must run into its deadline: KVQ_ERR_CONN, "timed out",
 * between the deadline and the deadline + margin. */
static want timed_out(const char *what) {
    long d = deadline_ms(g_timeout_ms);
    want w = {KVQ_ERR_CONN, what, d - 5, d + MARGIN_MS};
    return w;
}

/* A call (of a refusal mode) that must be refused without waiting for the
 * deadline: in under half of it. */
static want refused(kvq_status st, const char *what) {
    want w = {st, what, 0, deadline_ms(g_refuse_timeout_ms) / 2};
    return w;
}

static want fine(kvq_status st, long timeout_ms) {
    want w = {st, NULL, 0, deadline_ms(timeout_ms) + MARGIN_MS};
    return w;
}

static const want SKIP_CALL = {(kvq_status)1, NULL, 0, 0};

static void test_modes(void) {
    long td = g_timeout_ms, tr = g_refuse_timeout_ms;
    want t = timed_out("timed out after");
    /* a server that answers every command a byte at a time, for minutes */
    want dribble[C_N] = {timed_out("SET: timed out"), timed_out("GET: timed out"),
                         timed_out("DEL: timed out"), timed_out("SCAN: timed out"),
                         timed_out("SCAN: timed out")};
    run_mode("dribble", td, dribble);
    /* a cursor that never repeats and never ends: the deadline ends it */
    want grow[C_N] = {fine(KVQ_OK, td), SKIP_CALL, SKIP_CALL, t, t};
    run_mode("scangrow", td, grow);
    /* "$1073741000" is within the cap: the deadline ends the trickle */
    want huge[C_N] = {fine(KVQ_OK, td), timed_out("GET: timed out"), SKIP_CALL, SKIP_CALL,
                      SKIP_CALL};
    run_mode("hugebulk", td, huge);
    /* SCAN cursor 1 forever: the repeat is seen at once */
    want loop[C_N] = {fine(KVQ_OK, tr), fine(KVQ_OK, tr), fine(KVQ_OK, tr),
                      refused(KVQ_ERR_IO, "came back"), refused(KVQ_ERR_IO, "came back")};
    run_mode("scanloop", tr, loop);
    /* over the caps: refused when the header arrives */
    want huger[C_N] = {fine(KVQ_OK, tr), refused(KVQ_ERR_CORRUPT, "more than any value"),
                       SKIP_CALL, refused(KVQ_ERR_IO, "elements"), refused(KVQ_ERR_IO, "elements")};
    run_mode("hugerbulk", tr, huger);
    /* +QUEUED is not a stored value */
    want queued[C_N] = {refused(KVQ_ERR_IO, "QUEUED"), refused(KVQ_ERR_IO, "QUEUED"),
                        refused(KVQ_ERR_IO, "QUEUED"), refused(KVQ_ERR_IO, "unexpected"),
                        refused(KVQ_ERR_IO, "unexpected")};
    run_mode("queued", tr, queued);
    /* half a reply, then a hang-up */
    want hangup[C_N] = {refused(KVQ_ERR_CONN, "closed"), refused(KVQ_ERR_CONN, "closed"),
                        refused(KVQ_ERR_CONN, "closed"), refused(KVQ_ERR_CONN, "closed"),
                        refused(KVQ_ERR_CONN, "closed")};
    run_mode("disconnect", tr, hangup);
    /* the fake itself works: the calls above fail for the right reason */
    want ok[C_N] = {fine(KVQ_OK, tr), fine(KVQ_OK, tr), fine(KVQ_OK, tr), fine(KVQ_OK, tr),
                    fine(KVQ_OK, tr)};
    run_mode("ok", tr, ok);
}

/* A server that takes the PING and never reads again: a put larger than
 * the socket buffers cannot be sent, and the deadline ends it. */
static void test_noread(void) {
    fake f;
    if (!fake_begin(&f, "noread"))
        return;
    char url[128], err[256] = "";
    url_of(url, sizeof url, &f, g_timeout_ms);
    kvq_store *s = NULL;
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    size_t big = (size_t)64 << 20;
    char *v = (char *)calloc(big, 1);
    if (s && v) {
        double t0 = now_ms();
        kvq_status st = kvq_store_put(s, "big", v, big);
        check_call("noread", "put", st, kvq_store_last_error(s), now_ms() - t0,
                   timed_out("sending the command"));
    }
    free(v);
    kvq_store_close(s);
    fake_stop(&f);
}

/* A server that never answers: open itself fails within its deadline, with
 * timeout_ms and with the documented default. */
static void test_silent(void) {
    fake f;
    if (!fake_begin(&f, "silent"))
        return;
    long tos[2] = {g_timeout_ms, 0};
    for (int i = g_timeout_ms ? 0 : 1; i < 2; i++) {
        char url[128], err[256] = "";
        url_of(url, sizeof url, &f, tos[i]);
        kvq_store *s = NULL;
        double t0 = now_ms();
        kvq_status st = kvq_store_open(&s, url, NULL, err, sizeof err);
        double ms = now_ms() - t0;
        CHECK(s == NULL);
        long d = deadline_ms(tos[i]);
        want w = {KVQ_ERR_CONN, "PING: timed out", d - 5, d + MARGIN_MS};
        check_call("silent", i ? "open5s" : "open", st, err, ms, w);
    }
    fake_stop(&f);
}

/* After a missed deadline the connection is dropped; the next call makes
 * a new one (the epoch moves: the server may have lost its data). */
static void test_reconnect(void) {
    fake f;
    if (!fake_begin(&f, "slowfirst"))
        return;
    char url[128], err[256] = "";
    url_of(url, sizeof url, &f, g_timeout_ms);
    kvq_store *s = NULL;
    CHECK_OK(kvq_store_open(&s, url, NULL, err, sizeof err));
    if (s) {
        uint64_t e0 = kvq__store_epoch(s);
        double ms;
        kvq_status st = run_call(s, C_GET, &ms);
        check_call("slowfirst", "get", st, kvq_store_last_error(s), ms, timed_out("GET: timed out"));
        st = run_call(s, C_GET, &ms);
        check_call("slowfirst", "get2", st, kvq_store_last_error(s), ms,
                   fine(KVQ_ERR_RANGE, g_timeout_ms));
        CHECK_OK(kvq_store_put(s, "k1", "value", 5));
        st = run_call(s, C_GET, &ms);
        check_call("slowfirst", "get3", st, kvq_store_last_error(s), ms, fine(KVQ_OK, g_timeout_ms));
        CHECK_EQ(kvq__store_epoch(s), e0 + 1);
    }
    kvq_store_close(s);
    fake_stop(&f);
}

/* timeout_ms in the URL: 1..3600000, nothing else after '?'. Parsed before
 * any connection (port 1: nothing listens there). */
static void test_url(void) {
    static const char *const bad[] = {
        "redis://127.0.0.1:1/ns?timeout_ms=0",     "redis://127.0.0.1:1/ns?timeout_ms=3600001",
        "redis://127.0.0.1:1/ns?timeout_ms=",      "redis://127.0.0.1:1/ns?timeout_ms=12x",
        "redis://127.0.0.1:1/ns?timeout_ms=-5",    "redis://127.0.0.1:1/ns?timeout=5",
        "redis://127.0.0.1:1/ns?timeout_ms",       "redis://127.0.0.1:1/ns?timeout_ms=5&x=1",
        "redis://127.0.0.1:1/n?s",                 "redis://127.0.0.1:1?timeout_ms=99999999",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvq_store *s = NULL;
        char err[256] = "";
        kvq_status st = kvq_store_open(&s, bad[i], NULL, err, sizeof err);
        TU_REPORT(st == KVQ_ERR_INVALID_ARG && s == NULL, "%s: got %d (%s)", bad[i], (int)st, err);
    }
    static const char *const good[] = {
        "redis://127.0.0.1:1/ns?timeout_ms=1",
        "redis://127.0.0.1:1/ns?timeout_ms=3600000",
        "redis://127.0.0.1:1?timeout_ms=250",
        "redis://127.0.0.1:1/?timeout_ms=250",
        "redis://127.0.0.1:1/ns?",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        kvq_store *s = NULL;
        char err[256] = "";
        kvq_status st = kvq_store_open(&s, good[i], NULL, err, sizeof err);
        /* parsed: the connection is what fails */
        TU_REPORT(st == KVQ_ERR_CONN && strstr(err, "127.0.0.1:1") != NULL, "%s: got %d (%s)",
                  good[i], (int)st, err);
    }
}

int main(int argc, char **argv) {
    tu_init(argc, argv);
    snprintf(g_script, sizeof g_script, "%s", __FILE__);
    char *slash = strrchr(g_script, '/');
    if (slash)
        snprintf(slash + 1, sizeof g_script - (size_t)(slash + 1 - g_script), "fake_redis.py");
    else
        snprintf(g_script, sizeof g_script, "fake_redis.py");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--fake") == 0 && i + 1 < argc)
            snprintf(g_script, sizeof g_script, "%s", argv[++i]);
        else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc)
            g_only = argv[++i];
        else if (strcmp(argv[i], "--default-timeout") == 0)
            g_timeout_ms = g_refuse_timeout_ms = 0;
    }
    kvq_store *s = NULL;
    char err[256] = "";
    if (kvq_store_open(&s, "redis://127.0.0.1:1", NULL, err, sizeof err) == KVQ_ERR_UNSUPPORTED) {
        printf("SKIP redis fake: built without hiredis (%s)\n", err);
        return tu_finish();
    }
    if (access(PY, X_OK) != 0 || access(g_script, R_OK) != 0) {
        printf("SKIP redis fake: needs %s and %s\n", PY, g_script);
        return tu_finish();
    }
    signal(SIGPIPE, SIG_DFL); /* the store must not raise it: a SIGPIPE kills the test */
    printf("fake Redis %s, deadline %ld ms, margin %d ms\n", g_script,
           deadline_ms(g_timeout_ms), MARGIN_MS);
    test_url();
    test_modes();
    test_noread();
    test_silent();
    test_reconnect();
    return tu_finish();
}
