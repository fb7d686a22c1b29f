/* Reading back the JSON line bench_emit() prints (bench_all parses every
 * benchmark's stdout with it; the runner's test checks latest.json with it). */
#ifndef MPROC_BENCH_RECORD_H
#define MPROC_BENCH_RECORD_H

#include <stddef.h>

typedef struct bench_record {
    char op[256];
    char unit[16];
    double mproc;
    char primitive_name[256];
    double primitive;
    double ratio;
    /* Optional (bench_emit_stats; bench_emit gives only placement): 0 / ""
     * when the line has none. */
    char kind[16];          /* "latency" or "throughput" */
    double mproc_p99;
    double primitive_p99;
    int samples;
    char placement[256];
} bench_record;

/* Parses one flat JSON object with the six fields of the brief, in any
 * order, and the optional kind, mproc_p99, primitive_p99, samples and
 * placement; other string or number fields are skipped. Returns 0, or -1 with
 * the fault in err: not an object, a missing or mistyped field, a bad
 * escape, trailing text. */
int bench_record_parse(const char *line, bench_record *r, char *err, size_t cap);

#endif
