/* Fashion-MNIST for the hogwild and dataloader examples: the four idx files
 * of Debian's dataset-fashion-mnist, loaded once by the parent. The training
 * images go straight into a shared tensor (mp_tensor_empty_shared), so every
 * worker maps the same pages instead of a copy; the test set stays private
 * (only the parent evaluates). */
#ifndef HOGWILD_DATA_H
#define HOGWILD_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mproc.h>

#define DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define DATA_PACKAGE "dataset-fashion-mnist"
#define DATA_ROWS 28
#define DATA_COLS 28
#define DATA_PIXELS (DATA_ROWS * DATA_COLS)
#define DATA_CLASSES 10
/* Per-pixel mean and standard deviation of the Fashion-MNIST training set
 * (pixels scaled to [0, 1]); inputs are normalized with them. */
#define DATA_MEAN 0.2860f
#define DATA_STD 0.3530f

typedef struct dataset {
    mp_tensor *train_x; /* uint8 [n_train, 784], shared */
    mp_tensor *train_y; /* uint8 [n_train], shared */
    mp_tensor *test_x;  /* uint8 [n_test, 784], private */
    mp_tensor *test_y;  /* uint8 [n_test], private */
    int64_t n_train, n_test;
} dataset;

/* Loads the four files from dir (NULL: DATA_DEFAULT_DIR). Returns 0, or a
 * negative code with a sentence in err: a missing folder or file names the
 * Debian package to install and the --data flag; a corrupt file says what is
 * wrong with it; counts, image sizes and labels are checked. On failure
 * nothing is left allocated. */
int dataset_load(const char *dir, dataset *d, char *err, size_t cap);
void dataset_free(dataset *d);

/* Normalized float rows for samples idx[0..n) of images: x [n, 784]. */
void data_gather(const uint8_t *images, const uint32_t *idx, int n, float *x);

#endif
