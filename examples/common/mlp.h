/* The hogwild example's model: an MLP in -> h1 -> h2 -> out with ReLU and a
 * softmax cross-entropy loss (784-256-128-10 for Fashion-MNIST), forward and
 * backward with cblas_sgemm, and SGD with momentum.
 *
 * All parameters live in one flat float array (so one shared tensor holds
 * them) in PyTorch's order and layout: fc1.weight [h1,in], fc1.bias [h1],
 * fc2.weight [h2,h1], fc2.bias, fc3.weight [out,h2], fc3.bias. Nothing here
 * allocates except mlp_work_init, and nothing locks: under Hogwild the
 * parameters may change while a step reads them, by design.
 */
#ifndef HOGWILD_MLP_H
#define HOGWILD_MLP_H

#include <stddef.h>
#include <stdint.h>

#define MLP_LAYERS 3

typedef struct mlp_shape {
    int in, h1, h2, out;
} mlp_shape;

/* Offsets and sizes of the six parameter tensors in the flat array. */
typedef struct mlp_layout {
    size_t off[2 * MLP_LAYERS];
    size_t len[2 * MLP_LAYERS];
    int64_t dims[2 * MLP_LAYERS][2]; /* weight: {out, in}; bias: {out, 0} */
    int ndim[2 * MLP_LAYERS];
    size_t total;
} mlp_layout;

/* PyTorch's state_dict names, in layout order. */
extern const char *const mlp_param_names[2 * MLP_LAYERS];

void mlp_layout_init(mlp_layout *l, const mlp_shape *s);

/* PyTorch's nn.Linear default: weights and biases uniform in
 * +-1/sqrt(fan_in) (kaiming_uniform with a = sqrt(5)), from seed. */
void mlp_init_params(const mlp_shape *s, float *params, uint64_t seed);

/* Scratch for a batch of up to max_batch rows. */
typedef struct mlp_work {
    int max_batch;
    float *a1, *a2, *logits;  /* activations */
    float *d1, *d2, *dlogits; /* their gradients */
} mlp_work;

/* Returns 0, or -1 when out of memory. */
int mlp_work_init(mlp_work *w, const mlp_shape *s, int max_batch);
void mlp_work_free(mlp_work *w);

/* Forward and backward of one batch: x [batch, in], labels [batch] in
 * 0..out-1. Writes the gradient of the mean loss into grad (flat, like
 * params) and returns the mean loss. batch <= w->max_batch. */
float mlp_forward_backward(const mlp_shape *s, const float *params, const float *x,
                           const uint8_t *labels, int batch, float *grad, mlp_work *w);

/* Forward only: returns the summed loss of the batch and adds the number of
 * correctly classified rows to *correct. */
double mlp_evaluate(const mlp_shape *s, const float *params, const float *x, const uint8_t *labels,
                    int batch, mlp_work *w, int64_t *correct);

/* v = momentum * v + grad; p -= lr * v (PyTorch's SGD, dampening 0). */
void mlp_sgd_step(float *params, const float *grad, float *velocity, size_t n, float lr,
                  float momentum);

#endif
