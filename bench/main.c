/* sluice-bench: see bench/README.md and `sluice-bench --help`. */
#include "bench_impl.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    struct sl_bench_config c;
    sl_bench_config_init(&c);
    char err[512];
    int rc = sl_bench_cli_parse(&c, argc, argv, err, sizeof err);
    if (rc == 1) {
        sl_bench_config_dispose(&c);
        return 0;
    }
    if (rc != SL_OK) {
        fprintf(stderr, "sluice-bench: %s\n", err);
        sl_bench_config_dispose(&c);
        return 2;
    }
    /* A peer that closes while we write must be an error on that connection, not our death. */
    signal(SIGPIPE, SIG_IGN);
    struct sl_bench_results r;
    memset(&r, 0, sizeof r);
    rc = sl_bench_run(&c, &r);
    int status = 0;
    if (rc != SL_OK) {
        status = 1;
    } else {
        if (!c.quiet)
            sl_bench_report_text(&c, &r, stdout);
        fflush(stdout);
        if (c.json_path && sl_bench_report_json(&c, &r, c.json_path) != SL_OK)
            status = 1;
        if (c.csv_path && sl_bench_report_csv(&c, &r, c.csv_path) != SL_OK)
            status = 1;
        if (c.summary_path && sl_bench_report_summary(&c, &r, c.summary_path) != SL_OK)
            status = 1;
        if (c.plot_dir && sl_bench_plot(&c, &r, c.plot_dir) != SL_OK)
            status = 1;
    }
    sl_bench_results_dispose(&r, c.n_classes);
    sl_bench_config_dispose(&c);
    return status;
}
