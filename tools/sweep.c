/*
 * sweep.c - `kvq sweep`: evaluates a list of cache configurations as
 * inference runs (kvq eval's decoding, token by token) and writes
 * DIR/sweep.csv and DIR/sweep.svg, a plot of the asymptotic bits per value
 * (what a long sequence stores per value, every byte counted) against
 * KL(f32 || compressed) on a log scale, with fixed configurations,
 * allocations calibrated in the run and saved allocations marked apart and
 * named in a legend.
 *
 * --configs is a comma-separated list; each entry is
 *   CODEC            the same codec for K and V (e.g. int4, tq3:norm=8)
 *   KCODEC/VCODEC    keys and values (KCODEC may be chan:int<b>)
 *   calib:BITS       an allocation calibrated in this run for BITS asymptotic
 *                    bits per value
 *   alloc:FILE       a saved allocation
 * optionally followed by modifiers "+prerope", "+center" (the key centre of
 * the calibration lines), "+page=N", "+recent=N".
 *
 * With --calib-lines N the first N selected lines are the calibration text
 * (of calib: entries and +center) and only the others are evaluated, so
 * that every point is measured on text its calibration has not seen.
 */
#include "kvq.h"
#include "alloc_json.h"
#include "benchlib.h"
#include "cacheopts.h"
#include "calibrate.h"
#include "cliargs.h"
#include "model_eval.h"
#include "tool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SW_MAX 64

enum { SW_FIXED, SW_CALIB, SW_ALLOC, SW_KINDS };
static const char *const sw_kind_name[SW_KINDS] = {"fixed", "calibrated", "alloc"};
static const char *const sw_kind_legend[SW_KINDS] = {
    "one codec for K, one for V", "calibrated in this run (per-head codecs)", "saved allocation"};
static const char *const sw_kind_color[SW_KINDS] = {"#1f77b4", "#d62728", "#2ca02c"};

typedef struct {
    char label[160];
    int kind;
    kvqt_eval_result r;
    int ok;
} sw_row;

/* The default list; with --calib-lines, sw_default_calib follows it. */
static const char *sw_default = "f16,int8,int4,tq4,tq3,tq2,int8/tq3,chan:int4/tq4:norm=8+prerope,"
                                "chan:int3/tq3:norm=8+prerope";
static const char *sw_default_calib = "calib:6,calib:4.5,calib:3.5";

static void sw_xml(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

/* One marker: a circle (fixed), a diamond (calibrated) or a triangle (alloc). */
static void sw_marker(FILE *f, int kind, double x, double y) {
    const char *c = sw_kind_color[kind];
    if (kind == SW_FIXED)
        fprintf(f, "<circle class=\"point\" cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"/>\n", x, y, c);
    else if (kind == SW_CALIB)
        fprintf(f, "<path class=\"point\" d=\"M%.1f %.1fl7 7l-7 7l-7 -7z\" fill=\"%s\"/>\n", x,
                y - 7, c);
    else
        fprintf(f, "<path class=\"point\" d=\"M%.1f %.1fl6.5 11h-13z\" fill=\"%s\"/>\n", x, y - 7, c);
}

typedef struct sw_box {
    double x0, y0, x1, y1;
} sw_box;

static double sw_overlap(const sw_box *a, const sw_box *b) {
    double w = fmin(a->x1, b->x1) - fmax(a->x0, b->x0), h = fmin(a->y1, b->y1) - fmax(a->y0, b->y0);
    return w > 0 && h > 0 ? w * h : 0;
}

/* The plot: markers numbered in the plot, and beside it the list of the
 * numbered configurations by kind (the legend), each with its fixed bytes
 * per sequence; numbers stay legible where twenty long labels would not. */
static int sw_svg(FILE *f, const char *title, const sw_row *rows, size_t n) {
    const double ml = 80, pw = 760, mt = 50, mb = 60, panel = 360, W = ml + pw + panel;
    double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
    int used[SW_KINDS] = {0};
    size_t nok = 0;
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].ok)
            continue;
        double x = rows[i].r.asymptotic_bits_per_value, y = fmax(rows[i].r.kl, 1e-6);
        xmin = fmin(xmin, x), xmax = fmax(xmax, x);
        ymin = fmin(ymin, y), ymax = fmax(ymax, y);
        used[rows[i].kind] = 1;
        nok++;
    }
    sw_box *boxes = malloc((2 * n + 1) * sizeof *boxes);
    if (!nok || !boxes) {
        free(boxes);
        return -1;
    }
    /* the list: one row per configuration and per kind heading */
    double rh = 17, lh = (double)(nok + 3 * SW_KINDS) * rh, Hh = fmax(620, mt + lh + 20);
    double ph = Hh - mt - mb;
    xmin = floor(xmin) - 0.5, xmax = ceil(xmax) + 0.5;
    double ly0 = floor(log10(ymin)), ly1 = ceil(log10(ymax));
    if (ly1 <= ly0)
        ly1 = ly0 + 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", W, Hh);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">", W / 2);
    sw_xml(f, title);
    fprintf(f, "</text>\n");
#define SX(x) (ml + ((x) - xmin) / (xmax - xmin) * pw)
#define SY(y) (mt + (ly1 - log10(y)) / (ly1 - ly0) * ph)
    for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
        double y = SY(pow(10, e));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ml, y,
                ml + pw, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">1e%.0f</text>\n", ml - 6, y + 4, e);
        for (int m = 2; m <= 5 && e < ly1; m += 3) { /* 2 and 5 times the decade */
            double ym = SY(m * pow(10, e));
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#f2f2f2\"/>\n",
                    ml, ym, ml + pw, ym);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#888\">%d</text>\n",
                    ml - 6, ym + 4, m);
        }
    }
    for (double x = ceil(xmin); x <= xmax; x += (xmax - xmin) > 20 ? 4 : 1) {
        double px = SX(x);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px, mt,
                px, mt + ph);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", px, mt + ph + 18, x);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"black\"/>\n", ml, mt, pw, ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">asymptotic bits per value (a "
               "long sequence's stored bytes of K and V per value)</text>\n", ml + pw / 2, Hh - 18);
    fprintf(f, "<text transform=\"translate(20,%.1f) rotate(-90)\" text-anchor=\"middle\">KL(f32 "
               "|| compressed) per predicted token, decoding (log scale)</text>\n", mt + ph / 2);
    /* markers, then each number where it overlaps least (markers and the
     * numbers placed before it) */
    size_t nb = 0;
    for (size_t i = 0; i < n; i++)
        if (rows[i].ok) {
            double x = SX(rows[i].r.asymptotic_bits_per_value), y = SY(fmax(rows[i].r.kl, 1e-6));
            sw_marker(f, rows[i].kind, x, y);
            boxes[nb++] = (sw_box){x - 7, y - 7, x + 7, y + 7};
        }
    static const double off[][2] = {{8, -6}, {8, 14}, {-8, -6}, {-8, 14}, {0, -10}, {0, 20},
                                    {12, 4}, {-12, 4}, {14, -16}, {-14, -16}, {14, 24}, {-14, 24}};
    size_t num = 0;
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].ok)
            continue;
        num++;
        double x = SX(rows[i].r.asymptotic_bits_per_value), y = SY(fmax(rows[i].r.kl, 1e-6));
        double w = num >= 10 ? 14 : 7, best = INFINITY;
        sw_box at = {0, 0, 0, 0};
        for (size_t k = 0; k < sizeof off / sizeof *off && best > 0; k++) {
            double bx = off[k][0] > 0 ? x + off[k][0] : off[k][0] < 0 ? x + off[k][0] - w : x - w / 2;
            sw_box b = {bx, y + off[k][1] - 10, bx + w, y + off[k][1] + 1};
            double o = b.x0 < ml || b.x1 > ml + pw || b.y0 < mt || b.y1 > mt + ph ? 1e6 : 0;
            for (size_t j = 0; j < nb; j++)
                o += sw_overlap(&b, &boxes[j]);
            if (o < best)
                best = o, at = b;
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">%zu</text>\n", at.x0, at.y1 - 1, num);
        boxes[nb++] = at;
    }
    /* the list beside the plot, by kind (the legend) */
    double lx = ml + pw + 24, ly = mt + 4;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">fixed bytes per sequence in grey</text>\n",
            lx, ly + 8);
    ly += 2 * rh;
    for (int k = 0; k < SW_KINDS; k++) {
        if (!used[k])
            continue;
        if (k == SW_FIXED)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"/>\n", lx + 6, ly - 4,
                    sw_kind_color[k]);
        else if (k == SW_CALIB)
            fprintf(f, "<path d=\"M%.1f %.1fl7 7l-7 7l-7 -7z\" fill=\"%s\"/>\n", lx + 6, ly - 11,
                    sw_kind_color[k]);
        else
            fprintf(f, "<path d=\"M%.1f %.1fl6.5 11h-13z\" fill=\"%s\"/>\n", lx + 6, ly - 11,
                    sw_kind_color[k]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">%s</text>\n", lx + 18, ly,
                sw_kind_legend[k]);
        ly += rh;
        num = 0;
        for (size_t i = 0; i < n; i++) {
            if (!rows[i].ok)
                continue;
            num++;
            if (rows[i].kind != k)
                continue;
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%zu</text>", lx + 22, ly, num);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", lx + 30, ly);
            sw_xml(f, rows[i].label);
            fprintf(f, "<tspan dx=\"6\" fill=\"#888\">%.1f kB</tspan></text>\n",
                    rows[i].r.fixed_bytes_per_sequence / 1000.0);
            ly += rh;
        }
        ly += rh / 2;
    }
#undef SX
#undef SY
    fprintf(f, "</svg>\n");
    free(boxes);
    return 0;
}

static int sw_csv(FILE *f, const sw_row *rows, size_t n) {    fprintf(f, "config,kind,asymptotic_bits_per_value,fixed_bytes_per_sequence,bits_per_value,"
               "total_bits_per_value,kl,kl_stderr,kl_median,kl_p99,nll,nll_f32,delta_nll_pct,"
               "delta_nll_stderr_pct,ppl,ppl_f32,top1_agree,tokens\n");
    for (size_t i = 0; i < n; i++) {
        const kvqt_eval_result *r = &rows[i].r;
        if (!rows[i].ok)
            continue;
        fprintf(f, "\"%s\",%s,%.4f,%.0f,%.4f,%.4f,%.6g,%.3g,%.6g,%.6g,%.6f,%.6f,%.4f,%.4f,%.5f,"
                   "%.5f,%.5f,%zu\n",
                rows[i].label, sw_kind_name[rows[i].kind], r->asymptotic_bits_per_value,
                r->fixed_bytes_per_sequence, r->bits_per_value, r->total_bits_per_value, r->kl,
                r->kl_stderr, r->kl_median, r->kl_p99, r->nll, r->nll_f32,
                100 * (r->nll - r->nll_f32) / r->nll_f32, 100 * r->delta_nll_stderr / r->nll_f32,
                exp(r->nll), exp(r->nll_f32), r->top1, r->tokens);
    }
    return 0;
}

/* Calibrations of one run, by page and recent window: calib: entries with
 * +page= / +recent= measure under those settings. */
#define SW_MAX_CALIB 8
typedef struct sw_calib {
    kvqt_calib *cb;
    size_t page, recent;
} sw_calib;

/* The calibration with o's page and recent window (any, when any is set
 * and one exists), made on the first calib_lines lines when there is none. */
static kvqt_calib *sw_calib_get(sw_calib *cbs, size_t *n, const kvqt_model_session *ms,
                                size_t calib_lines, const kvqt_calib_opts *o, int any) {
    for (size_t i = 0; i < *n; i++)
        if (any || (cbs[i].page == o->page && cbs[i].recent == o->recent))
            return cbs[i].cb;
    if (*n == SW_MAX_CALIB) {
        fprintf(stderr, "kvq sweep: more than %d calibration settings\n", SW_MAX_CALIB);
        return NULL;
    }
    kvqt_calib *cb = kvqt_calib_new(ms->model, ms->tok, ms->lines, calib_lines, o);
    if (cb)
        cbs[(*n)++] = (sw_calib){cb, o->page, o->recent};
    return cb;
}

/* One entry of --configs, parsed before any work. */
typedef struct sw_entry {
    char label[160];
    int kind;            /* SW_FIXED, SW_CALIB, SW_ALLOC */
    char k[96], v[96];   /* SW_FIXED */
    double bits;         /* SW_CALIB */
    char alloc[4096];    /* SW_ALLOC */
    int prerope, center, page_set, recent_set;
    size_t page, recent;
} sw_entry;

/* Parses one entry (see the top of the file): 0, or -1 with the rule it
 * breaks printed. */
static int sw_parse_entry(const char *tok, sw_entry *e) {
    memset(e, 0, sizeof *e);
    const char *cmd = "sweep";
    if (!*tok) {
        fprintf(stderr, "kvq sweep: --configs has an empty entry (entries are separated by ',')\n");
        return -1;
    }
    if (strlen(tok) >= sizeof e->label) {
        fprintf(stderr, "kvq sweep: --configs entry '%.40s...' is longer than %zu characters\n",
                tok, sizeof e->label - 1);
        return -1;
    }
    snprintf(e->label, sizeof e->label, "%.159s", tok); /* shorter: checked above */
    char spec[160];
    snprintf(spec, sizeof spec, "%.159s", tok);
    char *plus = strchr(spec, '+');
    if (plus) {
        *plus = 0;
        for (char *mod = plus + 1; mod;) {
            char *next = strchr(mod, '+');
            if (next)
                *next++ = 0;
            char opt[256];
            snprintf(opt, sizeof opt, "--configs %.159s: +%.20s", tok, mod);
            if (!strcmp(mod, "prerope")) {
                e->prerope = 1;
            } else if (!strcmp(mod, "center")) {
                e->center = 1;
            } else if (!strncmp(mod, "page=", 5)) {
                if (kvqt_arg_size(cmd, opt, mod + 5, 1, 4096, &e->page))
                    return -1;
                e->page_set = 1;
            } else if (!strncmp(mod, "recent=", 7)) {
                if (kvqt_arg_size(cmd, opt, mod + 7, 0, KVQT_MAX_COUNT, &e->recent))
                    return -1;
                e->recent_set = 1;
            } else {
                fprintf(stderr, "kvq sweep: --configs %s: unknown modifier '+%s' (+prerope, "
                                "+center, +page=N, +recent=N)\n", tok, mod);
                return -1;
            }
            mod = next;
        }
    }
    if (!strncmp(spec, "calib:", 6)) {
        e->kind = SW_CALIB;
        char opt[256];
        snprintf(opt, sizeof opt, "--configs %.159s: the bits of calib:BITS", tok);
        return kvqt_arg_double(cmd, opt, spec + 6, 0, 32, 1, &e->bits);
    }
    if (!strncmp(spec, "alloc:", 6)) {
        e->kind = SW_ALLOC;
        if (!spec[6]) {
            fprintf(stderr, "kvq sweep: --configs %s: alloc: needs a file name\n", tok);
            return -1;
        }
        snprintf(e->alloc, sizeof e->alloc, "%s", tok + 6);
        char *p = strchr(e->alloc, '+');
        if (p)
            *p = 0;
        return 0;
    }
    e->kind = SW_FIXED;
    char *slash = strchr(spec, '/');
    if (slash)
        *slash = 0;
    const char *k = spec, *v = slash ? slash + 1 : spec;
    if (strlen(k) >= sizeof e->k || strlen(v) >= sizeof e->v) {
        fprintf(stderr, "kvq sweep: --configs %s: a codec spec is longer than %zu characters\n",
                tok, sizeof e->k - 1);
        return -1;
    }
    if (!*k || !*v || strchr(v, '/')) {
        fprintf(stderr, "kvq sweep: --configs %s: a fixed entry is CODEC or KCODEC/VCODEC\n", tok);
        return -1;
    }
    snprintf(e->k, sizeof e->k, "%.95s", k);
    snprintf(e->v, sizeof e->v, "%.95s", v);
    return 0;
}

/* The cache options of an entry, but for a calib: entry's allocation and
 * the centre (set by the caller); an alloc: entry's file is read and its
 * +page= and +recent= apply over the file's; 0, or -1 with a message (the
 * file failed). */
static int sw_entry_opts(const sw_entry *e, kvqt_cacheopts *o) {
    kvqt_cacheopts_init(o);
    if (e->kind == SW_FIXED) {
        snprintf(o->k_codec, sizeof o->k_codec, "%s", e->k);
        snprintf(o->v_codec, sizeof o->v_codec, "%s", e->v);
    } else if (e->kind == SW_ALLOC) {
        char err[256];
        if (kvqt_alloc_load_into(e->alloc, o, err, sizeof err) != 0) {
            fprintf(stderr, "kvq sweep: --configs %s: %s: %s\n", e->label, e->alloc, err);
            return -1;
        }
        o->alloc_path = e->alloc;
    }
    if (e->prerope)
        o->k_prerope = 1;
    if (e->page_set)
        o->page = e->page;
    if (e->recent_set)
        o->recent = e->recent;
    return 0;
}

static void sw_usage(FILE *f) {
    fprintf(f,
            "usage: kvq sweep --model M --tokenizer T --text FILE [--skip N] [--max-lines N]\n"
            "                 [--configs LIST] [--calib-lines N] [--calib-tokens N]\n"
            "                 [--jobs N] -o DIR\n"
            "  evaluates every configuration of LIST as kvq eval does (decoding) and writes\n"
            "  DIR/sweep.csv and DIR/sweep.svg (asymptotic bits per value against KL);\n"
            "  DIR is created when missing and must not be a file\n"
            "  --configs LIST        comma-separated entries: CODEC | KCODEC/VCODEC |\n"
            "                        calib:BITS | alloc:FILE, each optionally followed by\n"
            "                        +prerope +center +page=N +recent=N\n"
            "  --calib-lines N       the first N selected lines calibrate calib: and +center\n"
            "                        entries; every entry is evaluated on the lines after them\n"
            "  --calib-tokens N      predicted tokens of the sensitivity runs, 1..2^30 (640)\n"
            "  --jobs N              calibration threads, 1..256 (1)\n"
            "  default LIST: %s,\n  and with --calib-lines also %s\n"
            "exit status: 0 ok, 1 failure (files, model, a configuration that failed), 2 usage "
            "error\n",
            sw_default, sw_default_calib);
}

typedef struct sw_csv_ctx {
    const sw_row *rows;
    size_t n;
} sw_csv_ctx;

static int sw_csv_write(FILE *f, void *ctx) {
    const sw_csv_ctx *c = (const sw_csv_ctx *)ctx;
    return sw_csv(f, c->rows, c->n);
}

typedef struct sw_svg_ctx {
    const char *title;
    const sw_row *rows;
    size_t n;
} sw_svg_ctx;

static int sw_svg_write(FILE *f, void *ctx) {
    const sw_svg_ctx *c = (const sw_svg_ctx *)ctx;
    return sw_svg(f, c->title, c->rows, c->n);
}

int kvq_tool_sweep(int argc, char **argv) {
    const char *dir = NULL, *configs = NULL, *cmd = "sweep";
    kvqt_calib_opts co;
    kvqt_calib_opts_init(&co);
    co.cmd = cmd;
    size_t calib_lines = 0;
    const kvqt_opt opts[] = {KVQT_STR("--configs", &configs), KVQT_STR("-o", &dir),
                             KVQT_SIZE("--calib-lines", &calib_lines, 0, KVQT_MAX_COUNT),
                             KVQT_SIZE("--calib-tokens", &co.sens_tokens, 1, KVQT_MAX_COUNT),
                             KVQT_SIZE("--jobs", &co.jobs, 1, 256)};
    kvqt_modelopts mo;
    kvqt_modelopts_init(&mo, 1);
    int r0 = kvqt_model_args(argc, argv, cmd, &mo, NULL, opts, KVQT_NOPTS(opts));
    if (r0 == KVQT_ARGS_HELP) {
        sw_usage(stdout);
        return KVQT_EXIT_OK;
    }
    if (r0 != KVQT_ARGS_OK || kvqt_modelopts_require(&mo, cmd) != 0)
        return KVQT_EXIT_USAGE;
    if (!dir)
        return kvqt_usage_error(cmd, "-o DIR (where sweep.csv and sweep.svg go) is required");
    char deflist[512];
    if (!configs) {
        snprintf(deflist, sizeof deflist, "%s%s%s", sw_default, calib_lines ? "," : "",
                 calib_lines ? sw_default_calib : "");
        configs = deflist;
    }
    if (!*configs)
        return kvqt_usage_error(cmd, "--configs is empty: give at least one configuration");
    /* every entry is parsed before any work */
    sw_entry *ent = calloc(SW_MAX, sizeof *ent);
    if (!ent) {
        fprintf(stderr, "kvq sweep: out of memory\n");
        return KVQT_EXIT_FAIL;
    }
    size_t n = 0;
    int rc = KVQT_EXIT_OK, need_calib = 0;
    for (const char *p = configs; rc == 0;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char tok[200];
        if (n == SW_MAX) {
            rc = kvqt_usage_error(cmd, "--configs has more than %d entries", SW_MAX);
            break;
        }
        snprintf(tok, sizeof tok, "%.*s", (int)(len < 199 ? len : 199), p);
        if (sw_parse_entry(len < 199 ? tok : p, &ent[n]) != 0) {
            rc = kvqt_usage_hint(cmd);
            break;
        }
        need_calib |= ent[n].kind == SW_CALIB || ent[n].center;
        n++;
        if (!e)
            break;
        p = e + 1;
    }
    if (rc == 0 && need_calib && !calib_lines)
        rc = kvqt_usage_error(cmd, "calib: and +center entries need calibration lines "
                                   "(--calib-lines N)");
    /* saved allocations load before anything is measured */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        kvqt_cacheopts o;
        if (ent[i].kind == SW_ALLOC && sw_entry_opts(&ent[i], &o) != 0)
            rc = KVQT_EXIT_FAIL; /* a missing or bad file: exit 1 */
        if (ent[i].kind == SW_ALLOC)
            kvqt_cacheopts_free(&o);
    }
    struct stat sb; /* a file in the way fails at once; the directory is made after the checks */
    if (rc == 0 && stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvq sweep: -o %s: exists and is not a directory\n", dir);
        rc = KVQT_EXIT_FAIL;
    }
    kvqt_model_session ms;
    memset(&ms, 0, sizeof ms);
    if (rc == 0 && kvqt_model_session_open(&ms, &mo, 1, cmd) != 0)
        rc = KVQT_EXIT_FAIL;
    if (rc == 0 && calib_lines >= ms.nlines)
        rc = kvqt_usage_error(cmd, "--calib-lines %zu leaves none of the %zu selected lines to "
                                   "evaluate", calib_lines, ms.nlines);
    /* every configuration makes a cache for this model, and every calib:
     * target is above the cheapest allocation, before the first eval */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const sw_entry *e = &ent[i];
        kvqt_cacheopts o;
        if (e->kind == SW_CALIB) {
            kvqt_calib_opts c2 = co;
            c2.page = e->page_set ? e->page : co.page;
            c2.recent = e->recent_set ? e->recent : co.recent;
            double low = kvqt_calib_cheapest(ms.model, &c2);
            if (low < 0 || e->bits + 1e-9 < low)
                rc = kvqt_usage_error(cmd, "--configs %s: %g bits is below the cheapest "
                                           "allocation, %.4f bits per value (page %zu)",
                                      e->label, e->bits, low, c2.page);
            continue;
        }
        if (sw_entry_opts(e, &o) != 0) {
            rc = KVQT_EXIT_FAIL;
            continue;
        }
        if (e->center) { /* the centre comes from calibration: any values of the right size */
            kvq_model_info in;
            kvq_model_get_info(ms.model, &in);
            o.center_count = in.n_layers * in.n_kv_heads * in.head_dim;
            o.center_values = calloc(o.center_count, sizeof(float));
            o.k_center = 1;
        }
        char what[200];
        snprintf(what, sizeof what, "sweep: --configs %s", e->label);
        if (!e->center || o.center_values)
            rc = kvqt_check_cache(ms.model, &o, what, 0);
        kvqt_cacheopts_free(&o);
    }
    if (rc == 0 && kvqt_check_output_dir(cmd, "-o", dir) != 0)
        rc = KVQT_EXIT_FAIL;
    if (rc) {
        kvqt_model_session_close(&ms);
        free(ent);
        return rc;
    }
    char **eval_lines = ms.lines + calib_lines;
    size_t n_eval = ms.nlines - calib_lines;
    sw_row *rows = calloc(n, sizeof *rows);
    /* calibrations by (page, recent): calib: entries with +page= / +recent=
     * modifiers measure under those settings */
    sw_calib cbs[SW_MAX_CALIB];
    size_t ncb = 0, nok = 0;
    kvqt_calib *cb = NULL;
    int progress = isatty(2);
    co.progress = progress;
    for (size_t i = 0; rows && i < n; i++) {
        const sw_entry *e = &ent[i];
        sw_row *r = &rows[i];
        snprintf(r->label, sizeof r->label, "%s", e->label);
        r->kind = e->kind;
        kvqt_cacheopts o;
        if (sw_entry_opts(e, &o) != 0)
            continue;
        if (e->kind == SW_CALIB || e->center) {
            kvqt_calib_opts c2 = co;
            if (e->kind == SW_CALIB) {
                c2.page = e->page_set ? e->page : co.page;
                c2.recent = e->recent_set ? e->recent : co.recent;
            }
            cb = sw_calib_get(cbs, &ncb, &ms, calib_lines, &c2, e->kind != SW_CALIB);
            if (!cb) {
                kvqt_cacheopts_free(&o);
                break;
            }
        }
        char err[256];
        if (e->kind == SW_CALIB) {
            char path[4096];
            snprintf(path, sizeof path, "%s/alloc-%s.json", dir, e->label + 6);
            kvqt_calib_report cr;
            if (kvqt_calib_solve(cb, e->bits, path, &cr) != 0 ||
                kvqt_alloc_load_into(path, &o, err, sizeof err) != 0) {
                fprintf(stderr, "kvq sweep: %s: calibration failed\n", e->label);
                kvqt_cacheopts_free(&o);
                continue;
            }
            fprintf(stderr, "%-42s calibration text: KL %.5f (units alone %.5f), %.0f s measuring\n",
                    e->label, cr.kl, cr.kl_estimate, cr.seconds_measure);
        }
        if (e->center) {
            size_t nc;
            const float *c = kvqt_calib_center(cb, &nc);
            free(o.center_values);
            o.center_values = malloc(nc * sizeof(float));
            if (!o.center_values) {
                kvqt_cacheopts_free(&o);
                continue;
            }
            memcpy(o.center_values, c, nc * sizeof(float));
            o.center_count = nc;
            o.k_center = 1;
        }
        double t0 = kvqb_now();
        kvqt_evalopts eo;
        kvqt_evalopts_init(&eo);
        eo.cmd = cmd;
        if (kvqt_eval_run_opts(ms.model, ms.tok, eval_lines, n_eval, &o, &eo, progress, &r->r) == 0) {
            r->ok = 1;
            nok++;
            fprintf(stderr, "%-42s asym %6.3f bits  fixed %7.0f B  KL %.5f  dNLL %+.3f%%  top1 %.4f  "
                            "(%.1f s)\n", r->label, r->r.asymptotic_bits_per_value,
                    r->r.fixed_bytes_per_sequence, r->r.kl,
                    100 * (r->r.nll - r->r.nll_f32) / r->r.nll_f32, r->r.top1, kvqb_now() - t0);
        } else {
            fprintf(stderr, "kvq sweep: %s: eval failed\n", e->label);
        }
        kvqt_cacheopts_free(&o);
    }
    rc = rows && nok == n ? KVQT_EXIT_OK : KVQT_EXIT_FAIL;
    if (!rows) {
        fprintf(stderr, "kvq sweep: out of memory\n");
    } else if (nok == 0) {
        fprintf(stderr, "kvq sweep: no configuration succeeded: nothing written to %s\n", dir);
    } else {
        char csv[4096], svg[4096], title[512];
        snprintf(csv, sizeof csv, "%s/sweep.csv", dir);
        snprintf(svg, sizeof svg, "%s/sweep.svg", dir);
        const char *base = strrchr(mo.model, '/');
        snprintf(title, sizeof title, "kvq sweep: %s, decoding %zu lines%s",
                 base ? base + 1 : mo.model, n_eval, calib_lines ? " not seen by calibration" : "");
        sw_csv_ctx cc = {rows, n};
        sw_svg_ctx sc = {title, rows, n};
        if (kvqt_write_file(cmd, csv, sw_csv_write, &cc) != 0 ||
            kvqt_write_file(cmd, svg, sw_svg_write, &sc) != 0) {
            rc = KVQT_EXIT_FAIL;
        } else {
            printf("wrote %s and %s (%zu of %zu configurations)\n", csv, svg, nok, n);
            if (nok < n) {
                fprintf(stderr, "kvq sweep: failed, and left out of the files:");
                for (size_t i = 0; i < n; i++)
                    if (!rows[i].ok)
                        fprintf(stderr, " %s", rows[i].label);
                fprintf(stderr, "\n");
            }
        }
    }
    for (size_t i = 0; i < ncb; i++)
        kvqt_calib_free(cbs[i].cb);
    free(rows);
    free(ent);
    kvqt_model_session_close(&ms);
    return rc;
}
