/* --plot DIR: data files, a gnuplot script, and two PNG charts made by running gnuplot (Debian
 * package gnuplot-nox or gnuplot). The script and data stay in DIR, so a chart can be restyled
 * and made again with `gnuplot plot.gp` there. */
#include "bench_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

char *sl_bench_plot_find_gnuplot(void)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        return NULL;
    char *dirs = sl_xstrdup(path), *save = NULL;
    char *found = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        struct sl_str p;
        sl_str_init(&p);
        sl_str_appendf(&p, "%s/gnuplot", *d ? d : ".");
        if (access(p.p, X_OK) == 0)
            found = sl_xstrdup(p.p);
        sl_str_dispose(&p);
    }
    free(dirs);
    return found;
}

static FILE *open_in(const char *dir, const char *name)
{
    struct sl_str p;
    sl_str_init(&p);
    sl_str_appendf(&p, "%s/%s", dir, name);
    FILE *f = fopen(p.p, "w");
    if (!f)
        fprintf(stderr, "sluice-bench: --plot: cannot write %s: %s\n", p.p, strerror(errno));
    sl_str_dispose(&p);
    return f;
}

static const char *const metrics[4] = {"ttft", "tpot", "itl", "e2el"};

/* Writes the CDF of s as "value fraction" lines; returns whether it wrote any. Values of 0
 * (chunks that arrived in one read) have no place on a log axis: they are left out, but still
 * counted, so the line starts at their share. */
static bool write_cdf(const char *dir, const char *name, struct sl_bench_samples *s)
{
    FILE *f = open_in(dir, name);
    if (!f)
        return false;
    /* Sorted by percentile(); at most about 2000 points, enough for a smooth line. */
    sl_bench_samples_percentile(s, 50);
    size_t step = s->n > 2000 ? s->n / 2000 : 1;
    bool any = false;
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i] <= 0 || (i % step && i != s->n - 1))
            continue;
        fprintf(f, "%.6g %.6g\n", s->v[i], (double)(i + 1) / (double)s->n);
        any = true;
    }
    fclose(f);
    return any;
}

static int run_gnuplot(const char *gnuplot, const char *dir)
{
    pid_t pid = fork();
    if (pid < 0)
        return SL_EIO;
    if (pid == 0) {
        if (chdir(dir) != 0)
            _exit(126);
        execl(gnuplot, "gnuplot", "plot.gp", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "sluice-bench: --plot: gnuplot failed (status %d); see %s/plot.gp\n",
                WIFEXITED(st) ? WEXITSTATUS(st) : -1, dir);
        return SL_EIO;
    }
    return SL_OK;
}

int sl_bench_plot(const struct sl_bench_config *c, struct sl_bench_results *r, const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "sluice-bench: --plot %s: %s\n", dir, strerror(errno));
        return SL_EIO;
    }
    FILE *gp = open_in(dir, "plot.gp");
    if (!gp)
        return SL_EIO;
    fprintf(gp,
            "# Made by sluice-bench; run `gnuplot plot.gp` in this folder to redraw.\n"
            "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) {\n"
            "  set terminal pngcairo noenhanced size 1400,1000 font \",10\"\n"
            "} else {\n"
            "  set terminal png noenhanced size 1400,1000\n"
            "}\n"
            "set grid\nset key bottom right\n"
            "set output \"latency_cdf.png\"\n"
            "set multiplot layout 2,2 title \"latency CDF per class (%s)\"\n",
            c->url);
    static const char *const titles[4] = {"time to first token", "time per output token",
                                          "inter-token latency", "end-to-end latency"};
    for (int m = 0; m < 4; m++) {
        fprintf(gp,
                "set title \"%s\"\nset xlabel \"ms (log scale)\"\nset ylabel \"fraction\"\n"
                "set logscale x\nset yrange [0:1]\nset autoscale x\n",
                titles[m]);
        struct sl_str plot;
        sl_str_init(&plot);
        for (size_t i = 0; i < c->n_classes; i++) {
            struct sl_bench_figures f;
            sl_bench_figures_compute(c, r, i, &f);
            char name[64];
            snprintf(name, sizeof name, "cdf_%s_%zu.dat", metrics[m], i);
            struct sl_bench_samples *s = m == 0   ? &f.ttft_ms
                                         : m == 1 ? &f.tpot_ms
                                         : m == 2 ? &f.itl_ms
                                                  : &f.e2el_ms;
            if (write_cdf(dir, name, s))
                sl_str_appendf(&plot, "%s\"%s\" using 1:2 with lines lw 2 title \"%s\"",
                               plot.len ? ", " : "plot ", name, c->classes[i].name);
            sl_bench_figures_dispose(&f);
        }
        if (plot.len)
            fprintf(gp, "%s\n", plot.p);
        else
            fprintf(gp, "unset logscale x\nset label 1 \"no data\" at graph 0.45,0.5\n"
                        "plot [0:1] 1/0 notitle\nunset label 1\n");
        sl_str_dispose(&plot);
    }
    fprintf(gp, "unset multiplot\nunset logscale x\nset yrange [*:*]\n");

    /* Time series: each completed request's TTFT at its send time; responses per second by
     * status (admissions: 2xx; rejections: 429, 503, others). */
    FILE *req = open_in(dir, "requests.dat");
    if (!req) {
        fclose(gp);
        return SL_EIO;
    }
    bool any_req = false;
    for (size_t i = 0; i < r->n_recs; i++) {
        const struct sl_bench_record *q = &r->recs[i];
        if (q->outcome != SL_BENCH_OK)
            continue;
        double ttft = ((q->t_first > 0 ? q->t_first : q->t_end) - q->t_sent) * 1000.0;
        fprintf(req, "%u %.6f %.6g %d\n", q->cls, q->t_sent, ttft > 0 ? ttft : 1e-3, q->warmup);
        any_req = true;
    }
    fclose(req);
    FILE *adm = open_in(dir, "admissions.dat");
    if (!adm) {
        fclose(gp);
        return SL_EIO;
    }
    size_t secs = 0;
    for (size_t i = 0; i < r->n_adm; i++)
        if (r->adm[i].t >= 0 && (size_t)r->adm[i].t + 1 > secs)
            secs = (size_t)r->adm[i].t + 1;
    uint32_t(*b)[4] = sl_xcalloc(secs ? secs : 1, sizeof *b);
    for (size_t i = 0; i < r->n_adm; i++) {
        if (r->adm[i].t < 0)
            continue;
        int s = r->adm[i].status;
        b[(size_t)r->adm[i].t][s >= 200 && s < 300 ? 0 : s == 429 ? 1 : s == 503 ? 2 : 3]++;
    }
    fprintf(adm, "# second 2xx 429 503 other\n");
    for (size_t s = 0; s < secs; s++)
        fprintf(adm, "%zu %u %u %u %u\n", s, b[s][0], b[s][1], b[s][2], b[s][3]);
    free(b);
    fclose(adm);

    fprintf(gp,
            "set output \"timeseries.png\"\n"
            "set multiplot layout 2,1 title \"TTFT and admissions over the run (%s)\"\n"
            "set title \"time to first token of each completed request, by send time\"\n"
            "set xlabel \"seconds since start\"\nset ylabel \"TTFT, ms (log scale)\"\n"
            "set logscale y\nset key top left\n",
            c->url);
    if (r->t_meas0 > 0)
        fprintf(gp,
                "set arrow 1 from %.3f, graph 0 to %.3f, graph 1 nohead dt 2\n"
                "set label 2 \"warm-up ends\" at %.3f, graph 0.95 left offset 0.5,0\n",
                r->t_meas0, r->t_meas0, r->t_meas0);
    if (any_req) {
        fprintf(gp, "plot ");
        for (size_t i = 0; i < c->n_classes; i++)
            fprintf(gp,
                    "%s\"requests.dat\" using 2:($1 == %zu ? $3 : 1/0) with points pt 7 ps 0.5 "
                    "title \"%s\"",
                    i ? ", " : "", i, c->classes[i].name);
        fprintf(gp, "\n");
    } else {
        fprintf(gp, "unset logscale y\nset label 1 \"no completed requests\" at graph 0.4,0.5\n"
                    "plot [0:1] 1/0 notitle\nunset label 1\n");
    }
    fprintf(gp, "unset arrow 1\nunset label 2\nunset logscale y\n"
                "set title \"responses per second by status\"\n"
                "set ylabel \"responses/s\"\nset key top right\n");
    if (secs)
        fprintf(gp, "plot \"admissions.dat\" using ($1+0.5):2 with steps lw 2 title \"2xx\", "
                    "\"\" using ($1+0.5):3 with steps lw 2 title \"429\", "
                    "\"\" using ($1+0.5):4 with steps lw 2 title \"503\", "
                    "\"\" using ($1+0.5):5 with steps lw 2 title \"other\"\n");
    else
        fprintf(gp, "set label 1 \"no responses\" at graph 0.45,0.5\nplot [0:1] 1/0 notitle\n");
    fprintf(gp, "unset multiplot\n");
    if (fclose(gp) != 0)
        return SL_EIO;
    return run_gnuplot(c->gnuplot, dir);
}
