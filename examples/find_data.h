/* find_data.h - how the examples find their data files (data/...) from any directory. */
#ifndef MLC_EXAMPLES_FIND_DATA_H
#define MLC_EXAMPLES_FIND_DATA_H
#include <stdio.h>
#include <string.h>

/* A data file from any directory: the path as it is (from the current directory), else from
   the program's directory (argv[0]'s, up to its last slash), else from that directory's parent,
   so build/digits finds data/... in the repository wherever it is started. Returns the first
   path that opens (in buf if it is not `path`), or `path` unchanged. */
static const char *find_data(const char *argv0, const char *path, char *buf, size_t size) {
    static const char *const up[] = { "", "../" };
    size_t dir = strlen(argv0);
    while (dir > 0 && argv0[dir - 1] != '/' && argv0[dir - 1] != '\\') dir--;   /* '\\': Windows */
    FILE *f = fopen(path, "rb");
    for (int i = 0; !f && dir > 0 && i < 2; i++) {
        snprintf(buf, size, "%.*s%s%s", (int)dir, argv0, up[i], path);
        if ((f = fopen(buf, "rb")) != NULL) path = buf;
    }
    if (f) fclose(f);
    return path;
}

#endif
