/* pool_map: squares 1..1,000,000 through a 2-worker pool, in chunks of
 * 10,000 items, over the typed fast path (a plain C array in, one out),
 * and checks the sum against n(n+1)(2n+1)/6.
 *
 *   build/pool_map            -> "sum of squares 1..1000000 = 333333833333500000 (ok)"
 */
#include <mproc.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs in a worker: the item is one int64, the result its square. */
MP_TASK(square)
{
    int64_t x;
    size_t len;
    memcpy(&x, mp_msg_payload(in, &len), sizeof x);
    x *= x;
    return mp_msg_set_payload(out, &x, sizeof x);
}

int main(int argc, char **argv)
{
    const int64_t n = 1000000;
    int64_t *in, *out, sum = 0, want = n * (n + 1) * (2 * n + 1) / 6;
    mp_pool *pool;
    int rc;

    if (mp_setup(&argc, &argv) != 0) /* a spawned worker never returns from here */
        return 1;
    in = malloc((size_t)n * sizeof *in);
    out = malloc((size_t)n * sizeof *out);
    if (!in || !out)
        return 1;
    for (int64_t i = 0; i < n; i++)
        in[i] = i + 1;

    rc = mp_pool_create(2, NULL, &pool);
    if (rc == 0)
        rc = mp_pool_map_array(pool, "square", in, (size_t)n, sizeof *in, out, sizeof *out,
                               10000);
    if (rc != 0) {
        fprintf(stderr, "pool_map: %s: %s\n", mp_err_name(rc), mp_last_error());
        mp_pool_destroy(pool);
        return 1;
    }
    mp_pool_close(pool);
    mp_pool_join(pool);
    mp_pool_destroy(pool);

    for (int64_t i = 0; i < n; i++)
        sum += out[i];
    printf("sum of squares 1..%" PRId64 " = %" PRId64 " (%s)\n", n, sum,
           sum == want ? "ok" : "WRONG");
    free(in);
    free(out);
    return sum == want ? 0 : 1;
}
