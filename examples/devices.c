/* The devices mlc can run on, numbered as config.device / MLC_DEVICE = "opencl:N" takes them
   (like `clinfo -l`), then the context that "best" opens (the first GPU, else the CPU).
   Build: cc -std=c99 -I. examples/devices.c -o devices -lm   (add -ldl on glibc before 2.34) */
#include <stdio.h>
#include <string.h>
#define MLC_IMPLEMENTATION
#define MLC_OPENCL
#include "mlc.h"

/* mlc says why "best" stays on the CPU at the INFO level. */
static void show_log(mlc_log_level level, const char *message, void *user) {
    (void)user;
    printf("  %s%s\n", level == MLC_LOG_INFO ? "" : level == MLC_LOG_WARN ? "warning: " : "error: ", message);
}

int main(void) {
    enum { MAX_ROWS = 32 };
    mlc_device_info rows[MAX_ROWS];
    int count = mlc_devices(rows, MAX_ROWS);

    printf("OpenCL devices:\n");
    if (count == 0) printf("  none (no OpenCL library, driver or platform was found)\n");
    else printf("  %-3s %-11s %5s %10s  %s\n", "N", "type", "units", "memory", "device (platform; version)");
    for (int i = 0; i < count && i < MAX_ROWS; i++)
        printf("  %-3d %-11s %5d %6.1f GiB  %s (%s; %s)\n", rows[i].index, rows[i].type, rows[i].compute_units,
               (double)rows[i].memory_bytes / (1024.0 * 1024.0 * 1024.0), rows[i].name, rows[i].platform, rows[i].version);
    if (count > MAX_ROWS) printf("  ... and %d more\n", count - MAX_ROWS);

    int best = -1;                                   /* "best": the first GPU, else the CPU */
    for (int i = 0; i < count && i < MAX_ROWS && best < 0; i++)
        if (strcmp(rows[i].type, "gpu") == 0) best = i;
    printf("\nMLC_DEVICE=best picks: ");
    if (best >= 0) printf("opencl:%d, %s\n", best, rows[best].name);
    else printf("the CPU (no OpenCL GPU)\n");
    mlc_config config;
    memset(&config, 0, sizeof config);               /* zero fields mean defaults */
    config.device = "best";
    config.log = show_log;
    mlc_ctx *ctx = mlc_create(&config);
    if (!ctx) return 1;
    int status = mlc_error(ctx) != MLC_OK;
    if (status) printf("  error: %s\n", mlc_error_message(ctx));
    else printf("  a context made with it runs on: %s\n", mlc_device_name(ctx));
    mlc_destroy(ctx);
    return status;
}
