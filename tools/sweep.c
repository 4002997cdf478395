/*
 * sweep.c - `kvq sweep`: runs eval over a list of cache configurations and
 * writes DIR/sweep.csv and DIR/sweep.svg, a plot of bits per value against
 * KL(f32 || compressed) on a log scale with one labelled point each.
 *
 * --configs is a comma-separated list; each entry is
 *   CODEC            the same codec for K and V (e.g. int4, tq3:norm=8)
 *   KCODEC/VCODEC    keys and values (KCODEC may be chan:int<b>)
 *   calib:BITS       an allocation calibrated in this run at BITS bits/value
 *   alloc:FILE       a saved allocation
 * optionally followed by modifiers "+prerope", "+center", "+page=N".
 */
#include "kvq.h"
#include "benchlib.h"
#include "alloc_json.h"
#include "cacheopts.h"
#include "model_eval.h"
#include "tool.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SW_MAX 64

typedef struct {
    char label[160];
    kvqt_eval_result r;
    int ok;
} sw_row;

static const char *sw_default =
    "f16,int8,int4,int2,tq4,tq3,tq2,int8/tq3,chan:int4/int4+prerope+page=32,calib:6,calib:4.5,calib:3.5";

static void sw_svg(const char *path, const sw_row *rows, size_t n) {
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    const double W = 900, Hh = 560, ml = 80, mr = 30, mt = 40, mb = 60;
    double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].ok)
            continue;
        double x = rows[i].r.bits_per_value, y = fmax(rows[i].r.kl, 1e-6);
        xmin = fmin(xmin, x), xmax = fmax(xmax, x);
        ymin = fmin(ymin, y), ymax = fmax(ymax, y);
    }
    if (xmin > xmax) {
        fclose(f);
        return;
    }
    xmin = floor(xmin) - 0.5, xmax = ceil(xmax) + 0.5;
    double ly0 = floor(log10(ymin)), ly1 = ceil(log10(ymax));
    if (ly1 <= ly0)
        ly1 = ly0 + 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", W, Hh);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">kvq: KV-cache "
               "bits per value vs KL(f32 || compressed)</text>\n", W / 2);
    double pw = W - ml - mr, ph = Hh - mt - mb;
#define SX(x) (ml + ((x) - xmin) / (xmax - xmin) * pw)
#define SY(y) (mt + (ly1 - log10(y)) / (ly1 - ly0) * ph)
    for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
        double y = SY(pow(10, e));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ml, y,
                ml + pw, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">1e%.0f</text>\n", ml - 6, y + 4, e);
    }
    for (double x = ceil(xmin); x <= xmax; x += (xmax - xmin) > 20 ? 4 : 1) {
        double px = SX(x);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px, mt,
                px, mt + ph);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", px, mt + ph + 18, x);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"black\"/>\n", ml, mt, pw, ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">bits per value (every stored "
               "byte of K and V)</text>\n", ml + pw / 2, Hh - 18);
    fprintf(f, "<text transform=\"translate(20,%.1f) rotate(-90)\" text-anchor=\"middle\">KL "
               "divergence (log scale)</text>\n", mt + ph / 2);
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].ok)
            continue;
        double x = SX(rows[i].r.bits_per_value), y = SY(fmax(rows[i].r.kl, 1e-6));
        int cal = !strncmp(rows[i].label, "calib:", 6);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"/>\n", x, y,
                cal ? "#d62728" : "#1f77b4");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", x + 8, y - 6 - (double)(i % 2) * 10);
        for (const char *p = rows[i].label; *p; p++) {
            if (*p == '<')
                fputs("&lt;", f);
            else if (*p == '&')
                fputs("&amp;", f);
            else
                fputc(*p, f);
        }
        fprintf(f, "</text>\n");
    }
#undef SX
#undef SY
    fprintf(f, "</svg>\n");
    fclose(f);
}

int kvq_tool_sweep(int argc, char **argv) {
    const char *dir = NULL, *configs = sw_default;
    size_t calib_tokens = 512;
    const kvqt_opt opts[] = {{"--configs", KVQT_OPT_STR, &configs},
                             {"-o", KVQT_OPT_STR, &dir},
                             {"--calib-tokens", KVQT_OPT_SIZE, &calib_tokens}};
    kvqt_modelopts mo;
    kvqt_modelopts_init(&mo, 1);
    if (kvqt_model_args(argc, argv, "sweep", &mo, NULL, opts, KVQT_NOPTS(opts)))
        return 2;
    if (!kvqt_modelopts_complete(&mo) || !dir) {
        fprintf(stderr, "usage: kvq sweep --model M --tokenizer T --text FILE [--configs LIST] -o DIR\n"
                        "  [--calib-tokens N (512)]\n  LIST entries: CODEC | KCODEC/VCODEC | "
                        "calib:BITS | alloc:FILE, with +prerope +center +page=N\n  default: %s\n",
                sw_default);
        return 2;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvq sweep: cannot create %s\n", dir);
        return 1;
    }
    kvqt_model_session ms;
    if (kvqt_model_session_open(&ms, &mo, 1, "sweep", ""))
        return 1;
    char *list = strdup(configs);
    sw_row rows[SW_MAX];
    size_t n = 0;
    kvqt_calib *cb = NULL;
    int rc = 0, progress = isatty(2);
    char *lsave = NULL;
    for (char *tok = strtok_r(list, ",", &lsave); tok && n < SW_MAX; tok = strtok_r(NULL, ",", &lsave)) {
        sw_row *r = &rows[n++];
        memset(r, 0, sizeof *r);
        snprintf(r->label, sizeof r->label, "%s", tok);
        kvqt_cacheopts o;
        kvqt_cacheopts_init(&o);
        char spec[160];
        snprintf(spec, sizeof spec, "%s", tok);
        /* modifiers after the first '+' */
        char *plus = strchr(spec, '+');
        if (plus) {
            *plus = 0;
            char *save = NULL;
            for (char *mod = strtok_r(plus + 1, "+", &save); mod; mod = strtok_r(NULL, "+", &save)) {
                if (!strcmp(mod, "prerope"))
                    o.k_prerope = 1;
                else if (!strcmp(mod, "center"))
                    o.k_center = 1;
                else if (!strncmp(mod, "page=", 5))
                    o.page = strtoul(mod + 5, NULL, 10);
                else
                    fprintf(stderr, "kvq sweep: unknown modifier '+%s' ignored\n", mod);
            }
        }
        if (!strncmp(spec, "calib:", 6)) {
            double bits = strtod(spec + 6, NULL);
            if (!cb)
                cb = kvqt_calib_prepare(ms.model, ms.tok, ms.lines, ms.nlines, calib_tokens, 32,
                                        progress, NULL);
            char path[4096];
            snprintf(path, sizeof path, "%s/alloc-%s.json", dir, spec + 6);
            kvqt_calib_result cr;
            if (!cb || kvqt_calib_allocate(cb, bits, path, &cr) != 0) {
                fprintf(stderr, "kvq sweep: %s: calibration failed\n", tok);
                rc = 1;
                continue;
            }
            char err[256];
            if (kvqt_alloc_load_into(path, &o, err, sizeof err) != 0) {
                fprintf(stderr, "kvq sweep: %s: %s\n", path, err);
                rc = 1;
                continue;
            }
        } else if (!strncmp(spec, "alloc:", 6)) {
            char err[256];
            if (kvqt_alloc_load_into(spec + 6, &o, err, sizeof err) != 0) {
                fprintf(stderr, "kvq sweep: %s: %s\n", spec + 6, err);
                rc = 1;
                continue;
            }
        } else {
            char *slash = strchr(spec, '/');
            if (slash) {
                *slash = 0;
                snprintf(o.k_codec, sizeof o.k_codec, "%.95s", spec);
                snprintf(o.v_codec, sizeof o.v_codec, "%.95s", slash + 1);
            } else {
                snprintf(o.k_codec, sizeof o.k_codec, "%.95s", spec);
                snprintf(o.v_codec, sizeof o.v_codec, "%.95s", spec);
            }
        }
        double t0 = kvqb_now();
        if (kvqt_eval_run(ms.model, ms.tok, ms.lines, ms.nlines, &o, 0, &r->r) == 0) {
            r->ok = 1;
            fprintf(stderr, "%-40s bits %7.3f  KL %.5f  dNLL %+.3f%%  top1 %.4f  (%.1f s)\n", r->label,
                    r->r.bits_per_value, r->r.kl, 100 * (r->r.nll - r->r.nll_f32) / r->r.nll_f32,
                    r->r.top1, kvqb_now() - t0);
        } else {
            fprintf(stderr, "kvq sweep: %s: eval failed\n", tok);
            rc = 1;
        }
        kvqt_cacheopts_free(&o);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/sweep.csv", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "config,bits_per_value,total_bits_per_value,kl,nll,nll_f32,delta_nll_pct,ppl,"
                   "ppl_f32,top1_agree,tokens\n");
        for (size_t i = 0; i < n; i++)
            if (rows[i].ok)
                fprintf(f, "\"%s\",%.4f,%.4f,%.6g,%.6f,%.6f,%.4f,%.5f,%.5f,%.5f,%zu\n", rows[i].label,
                        rows[i].r.bits_per_value, rows[i].r.total_bits_per_value, rows[i].r.kl,
                        rows[i].r.nll, rows[i].r.nll_f32,
                        100 * (rows[i].r.nll - rows[i].r.nll_f32) / rows[i].r.nll_f32,
                        exp(rows[i].r.nll), exp(rows[i].r.nll_f32), rows[i].r.top1, rows[i].r.tokens);
        fclose(f);
    } else {
        rc = 1;
    }
    snprintf(path, sizeof path, "%s/sweep.svg", dir);
    sw_svg(path, rows, n);
    printf("wrote %s/sweep.csv and %s/sweep.svg (%zu configurations)\n", dir, dir, n);
    kvqt_calib_free(cb);
    free(list);
    kvqt_model_session_close(&ms);
    return rc;
}
