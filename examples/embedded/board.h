/* What the microcontroller programs (main.c, float32; main_int8.c, int8) share: output through
   semihosting on the Cortex-M4F (stdout on the host), a bump allocator over a static pool for
   the few long-lived objects (the context, the tensor structs over the weights), a context over
   the program's arena, and the report at the end. Included after mlc.h. */
#ifdef __arm__
unsigned long stack_used(void);                      /* startup.c */
static void emit(const char *text) {                 /* semihosting SYS_WRITE0 */
    register int op __asm__("r0") = 0x04;
    register const char *arg __asm__("r1") = text;
    __asm__ volatile("bkpt 0xab" : "+r"(op) : "r"(arg) : "memory");
}
#else
#include <stdio.h>
static void emit(const char *text) { fputs(text, stdout); }
#endif

#ifndef BOARD_POOL_BYTES                             /* the long-lived objects' pool */
#define BOARD_POOL_BYTES (1280 * sizeof(void *))
#endif
static unsigned char pool[BOARD_POOL_BYTES] __attribute__((aligned(16)));
static size_t pool_used;

/* A bump allocator: nothing long-lived is freed before the program ends. */
static void *pool_alloc(size_t bytes, void *user) {
    void *p = pool + pool_used;
    (void)user;
    bytes = (bytes + 15) & ~(size_t)15;
    if (bytes > sizeof pool - pool_used) return NULL;
    pool_used += bytes;
    return p;
}
static void pool_free(void *p, void *user) { (void)p; (void)user; }

static char *put_int(char *s, size_t v) {
    char rev[24];
    int n = 0;
    do { rev[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n) *s++ = rev[--n];
    return s;
}

static void emit_size(const char *label, size_t v) {
    char text[24], *end = put_int(text, v);
    end[0] = '\n'; end[1] = '\0';
    emit(label);
    emit(text);
}

/* A context whose op results come from arena and whose long-lived objects come from the pool */
static mlc_ctx *board_context(unsigned char *arena, size_t arena_bytes) {
    mlc_config config = { 0 };
    config.allocator.alloc = pool_alloc;
    config.allocator.free = pool_free;
    config.arena = arena;
    config.arena_bytes = arena_bytes;
    return mlc_create(&config);
}

/* line (the predictions, ending in '\n'), then what the run took: the arena's peak, the pool and,
   on the Cortex-M4F, the stack; or the context's error. Returns main's status. */
static int board_report(mlc_ctx *ctx, const char *line) {
    if (mlc_error(ctx)) { emit("error: "); emit(mlc_error_message(ctx)); emit("\n"); return 1; }
    emit(line);
    emit_size("arena peak bytes: ", mlc_get_stats(ctx).arena_peak);
    emit_size("pool bytes: ", pool_used);
#ifdef __arm__
    emit_size("stack bytes: ", stack_used());
#endif
    mlc_destroy(ctx);
    return 0;
}
