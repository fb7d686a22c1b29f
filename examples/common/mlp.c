#include "mlp.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

const char *const mlp_param_names[2 * MLP_LAYERS] = {
    "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias",
};

void mlp_layout_init(mlp_layout *l, const mlp_shape *s)
{
    int fan_in[MLP_LAYERS] = {s->in, s->h1, s->h2};
    int fan_out[MLP_LAYERS] = {s->h1, s->h2, s->out};
    size_t off = 0;
    memset(l, 0, sizeof *l);
    for (int i = 0; i < MLP_LAYERS; i++) {
        l->off[2 * i] = off;
        l->len[2 * i] = (size_t)fan_out[i] * (size_t)fan_in[i];
        l->dims[2 * i][0] = fan_out[i];
        l->dims[2 * i][1] = fan_in[i];
        l->ndim[2 * i] = 2;
        off += l->len[2 * i];
        l->off[2 * i + 1] = off;
        l->len[2 * i + 1] = (size_t)fan_out[i];
        l->dims[2 * i + 1][0] = fan_out[i];
        l->ndim[2 * i + 1] = 1;
        off += l->len[2 * i + 1];
    }
    l->total = off;
}

void mlp_init_params(const mlp_shape *s, float *params, uint64_t seed)
{
    mlp_layout l;
    rng r;
    mlp_layout_init(&l, s);
    rng_seed(&r, seed);
    for (int i = 0; i < 2 * MLP_LAYERS; i++) {
        /* Weights and biases of a layer share its fan-in bound. */
        float bound = 1.0f / sqrtf((float)l.dims[i & ~1][1]);
        for (size_t k = 0; k < l.len[i]; k++)
            params[l.off[i] + k] = (2.0f * rng_float(&r) - 1.0f) * bound;
    }
}

int mlp_work_init(mlp_work *w, const mlp_shape *s, int max_batch)
{
    size_t b = (size_t)max_batch;
    memset(w, 0, sizeof *w);
    w->max_batch = max_batch;
    w->a1 = malloc(b * (size_t)s->h1 * sizeof(float));
    w->a2 = malloc(b * (size_t)s->h2 * sizeof(float));
    w->logits = malloc(b * (size_t)s->out * sizeof(float));
    w->d1 = malloc(b * (size_t)s->h1 * sizeof(float));
    w->d2 = malloc(b * (size_t)s->h2 * sizeof(float));
    w->dlogits = malloc(b * (size_t)s->out * sizeof(float));
    if (!w->a1 || !w->a2 || !w->logits || !w->d1 || !w->d2 || !w->dlogits) {
        mlp_work_free(w);
        return -1;
    }
    return 0;
}

void mlp_work_free(mlp_work *w)
{
    free(w->a1);
    free(w->a2);
    free(w->logits);
    free(w->d1);
    free(w->d2);
    free(w->dlogits);
    memset(w, 0, sizeof *w);
}

/* y[batch, out] = x[batch, in] W^T + b, then ReLU when relu is set. */
static void linear(const float *x, const float *W, const float *b, float *y, int batch, int in,
                   int out, int relu)
{
    for (int r = 0; r < batch; r++)
        memcpy(y + (size_t)r * out, b, (size_t)out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.0f, x, in, W, in, 1.0f,
                y, out);
    if (relu)
        for (size_t i = 0; i < (size_t)batch * out; i++)
            y[i] = y[i] > 0 ? y[i] : 0;
}

static void forward(const mlp_shape *s, const mlp_layout *l, const float *p, const float *x,
                    int batch, mlp_work *w)
{
    linear(x, p + l->off[0], p + l->off[1], w->a1, batch, s->in, s->h1, 1);
    linear(w->a1, p + l->off[2], p + l->off[3], w->a2, batch, s->h1, s->h2, 1);
    linear(w->a2, p + l->off[4], p + l->off[5], w->logits, batch, s->h2, s->out, 0);
}

/* Turns row's logits into log-probabilities in place (stable log-softmax). */
static void log_softmax(float *row, int n)
{
    float mx = row[0], sum = 0;
    for (int j = 1; j < n; j++)
        mx = row[j] > mx ? row[j] : mx;
    for (int j = 0; j < n; j++)
        sum += expf(row[j] - mx);
    float lse = mx + logf(sum);
    for (int j = 0; j < n; j++)
        row[j] -= lse;
}

/* Gradients of one layer from dy [batch, out]: dW = dy^T x, db = sum dy, and
 * dx = dy W masked by ReLU of x (skipped when dx is NULL). */
static void linear_backward(const float *x, const float *W, const float *dy, float *dW, float *db,
                            float *dx, int batch, int in, int out)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch, 1.0f, dy, out, x, in, 0.0f,
                dW, in);
    memset(db, 0, (size_t)out * sizeof(float));
    for (int r = 0; r < batch; r++)
        for (int j = 0; j < out; j++)
            db[j] += dy[(size_t)r * out + j];
    if (!dx)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out, 1.0f, dy, out, W, in,
                0.0f, dx, in);
    for (size_t i = 0; i < (size_t)batch * in; i++)
        if (x[i] <= 0)
            dx[i] = 0;
}

float mlp_forward_backward(const mlp_shape *s, const float *params, const float *x,
                           const uint8_t *labels, int batch, float *grad, mlp_work *w)
{
    mlp_layout l;
    double loss = 0;
    mlp_layout_init(&l, s);
    forward(s, &l, params, x, batch, w);
    for (int r = 0; r < batch; r++) {
        float *row = w->logits + (size_t)r * s->out;
        float *drow = w->dlogits + (size_t)r * s->out;
        log_softmax(row, s->out);
        loss -= row[labels[r]];
        /* d(mean loss)/d(logit) = (softmax - onehot) / batch */
        for (int j = 0; j < s->out; j++)
            drow[j] = (expf(row[j]) - (j == labels[r])) / (float)batch;
    }
    linear_backward(w->a2, params + l.off[4], w->dlogits, grad + l.off[4], grad + l.off[5], w->d2,
                    batch, s->h2, s->out);
    linear_backward(w->a1, params + l.off[2], w->d2, grad + l.off[2], grad + l.off[3], w->d1, batch,
                    s->h1, s->h2);
    linear_backward(x, params + l.off[0], w->d1, grad + l.off[0], grad + l.off[1], NULL, batch,
                    s->in, s->h1);
    return (float)(loss / batch);
}

double mlp_evaluate(const mlp_shape *s, const float *params, const float *x, const uint8_t *labels,
                    int batch, mlp_work *w, int64_t *correct)
{
    mlp_layout l;
    double loss = 0;
    mlp_layout_init(&l, s);
    forward(s, &l, params, x, batch, w);
    for (int r = 0; r < batch; r++) {
        float *row = w->logits + (size_t)r * s->out;
        int best = 0;
        log_softmax(row, s->out);
        for (int j = 1; j < s->out; j++)
            best = row[j] > row[best] ? j : best;
        *correct += best == labels[r];
        loss -= row[labels[r]];
    }
    return loss;
}

void mlp_sgd_step(float *params, const float *grad, float *velocity, size_t n, float lr,
                  float momentum)
{
    for (size_t i = 0; i < n; i++) {
        velocity[i] = momentum * velocity[i] + grad[i];
        params[i] -= lr * velocity[i];
    }
}
