#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "idx.h"

/* Reads dir/name into a new tensor (shared or private), checking its ndim
 * and, where given (non-zero), its sizes. */
static int load_idx(const char *dir, const char *name, bool shared, int ndim, const int64_t *want,
                    mp_tensor **out, char *err, size_t cap)
{
    char path[1024];
    idx_file f;
    mp_tensor *t = NULL;
    int rc;
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (stat(path, &st) != 0) {
        snprintf(err, cap,
                 "Fashion-MNIST not found: %s: %s; install Debian's %s "
                 "(sudo apt-get install %s, or make deps) or pass --data DIR",
                 path, strerror(errno), DATA_PACKAGE, DATA_PACKAGE);
        return MP_ENOENT;
    }
    if (idx_open(path, &f, err, cap) != 0)
        return MP_EPROTO;
    if (f.ndim != ndim) {
        snprintf(err, cap, "%s: %d dimensions, want %d", path, f.ndim, ndim);
        rc = MP_EPROTO;
        goto out_close;
    }
    for (int i = 0; i < ndim; i++) {
        if (want[i] && f.dims[i] != want[i]) {
            snprintf(err, cap, "%s: size %d is %lld, want %lld", path, i, (long long)f.dims[i],
                     (long long)want[i]);
            rc = MP_EPROTO;
            goto out_close;
        }
    }
    int64_t shape[2] = {f.dims[0], ndim == 3 ? f.dims[1] * f.dims[2] : 0};
    rc = shared ? mp_tensor_empty_shared(MP_UINT8, ndim == 3 ? 2 : 1, shape, &t)
                : mp_tensor_empty(MP_UINT8, ndim == 3 ? 2 : 1, shape, &t);
    if (rc != 0) {
        snprintf(err, cap, "%s: %s", path, mp_last_error());
        goto out_close;
    }
    if (idx_read_data(&f, mp_tensor_data(t), err, cap) != 0) {
        mp_tensor_release(t);
        rc = MP_EPROTO;
        goto out_close;
    }
    *out = t;
out_close:
    idx_close(&f);
    return rc;
}

static int check_labels(const mp_tensor *y, const char *what, char *err, size_t cap)
{
    const uint8_t *p = mp_tensor_data(y);
    for (int64_t i = 0; i < mp_tensor_numel(y); i++) {
        if (p[i] >= DATA_CLASSES) {
            snprintf(err, cap, "%s labels: label %lld is %u, want 0..%d", what, (long long)i, p[i],
                     DATA_CLASSES - 1);
            return MP_EPROTO;
        }
    }
    return 0;
}

int dataset_load(const char *dir, dataset *d, char *err, size_t cap)
{
    const int64_t img[3] = {0, DATA_ROWS, DATA_COLS};
    int rc;
    memset(d, 0, sizeof *d);
    if (!dir)
        dir = DATA_DEFAULT_DIR;
    rc = load_idx(dir, "train-images-idx3-ubyte.gz", true, 3, img, &d->train_x, err, cap);
    if (rc == 0) {
        const int64_t n[1] = {mp_tensor_size(d->train_x, 0)};
        rc = load_idx(dir, "train-labels-idx1-ubyte.gz", true, 1, n, &d->train_y, err, cap);
    }
    if (rc == 0)
        rc = load_idx(dir, "t10k-images-idx3-ubyte.gz", false, 3, img, &d->test_x, err, cap);
    if (rc == 0) {
        const int64_t n[1] = {mp_tensor_size(d->test_x, 0)};
        rc = load_idx(dir, "t10k-labels-idx1-ubyte.gz", false, 1, n, &d->test_y, err, cap);
    }
    if (rc == 0)
        rc = check_labels(d->train_y, "training", err, cap);
    if (rc == 0)
        rc = check_labels(d->test_y, "test", err, cap);
    if (rc != 0) {
        dataset_free(d);
        return rc;
    }
    d->n_train = mp_tensor_size(d->train_x, 0);
    d->n_test = mp_tensor_size(d->test_x, 0);
    return 0;
}

void dataset_free(dataset *d)
{
    mp_tensor_release(d->train_x);
    mp_tensor_release(d->train_y);
    mp_tensor_release(d->test_x);
    mp_tensor_release(d->test_y);
    memset(d, 0, sizeof *d);
}

void data_gather(const uint8_t *images, const uint32_t *idx, int n, float *x)
{
    const float scale = 1.0f / (255.0f * DATA_STD), shift = DATA_MEAN / DATA_STD;
    for (int r = 0; r < n; r++) {
        const uint8_t *src = images + (size_t)idx[r] * DATA_PIXELS;
        float *dst = x + (size_t)r * DATA_PIXELS;
        for (int k = 0; k < DATA_PIXELS; k++)
            dst[k] = (float)src[k] * scale - shift;
    }
}
