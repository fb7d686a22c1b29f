/* The hogwild example's MLP: gradients against finite differences, one SGD
 * step lowering the loss, evaluation agreeing with the training loss. */
#include "mp_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.h"
#include "rng.h"

#define BATCH 4

typedef struct fixture {
    mlp_shape s;
    mlp_layout l;
    float *params, *grad, *x;
    uint8_t y[BATCH];
    mlp_work w;
} fixture;

static void fixture_open(fixture *f, uint64_t seed)
{
    rng r;
    f->s = (mlp_shape){6, 5, 4, 3};
    mlp_layout_init(&f->l, &f->s);
    f->params = malloc(f->l.total * sizeof(float));
    f->grad = malloc(f->l.total * sizeof(float));
    f->x = malloc(BATCH * 6 * sizeof(float));
    assert_non_null(f->params);
    assert_non_null(f->grad);
    assert_non_null(f->x);
    assert_int_equal(mlp_work_init(&f->w, &f->s, BATCH), 0);
    mlp_init_params(&f->s, f->params, seed);
    rng_seed(&r, seed + 100);
    for (int i = 0; i < BATCH * 6; i++)
        f->x[i] = 2 * rng_float(&r) - 1;
    for (int i = 0; i < BATCH; i++)
        f->y[i] = (uint8_t)rng_below(&r, 3);
}

static void fixture_close(fixture *f)
{
    free(f->params);
    free(f->grad);
    free(f->x);
    mlp_work_free(&f->w);
}

static double loss_at(fixture *f)
{
    int64_t correct = 0;
    return mlp_evaluate(&f->s, f->params, f->x, f->y, BATCH, &f->w, &correct) / BATCH;
}

static void test_layout_matches_pytorch(void **state)
{
    mlp_shape s = {784, 256, 128, 10};
    mlp_layout l;
    mlp_layout_init(&l, &s);
    assert_int_equal(l.total, 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    assert_int_equal(l.dims[0][0], 256); /* fc1.weight is [out, in] */
    assert_int_equal(l.dims[0][1], 784);
    assert_int_equal(l.off[5], l.total - 10);
    assert_string_equal(mlp_param_names[4], "fc3.weight");
}

static void test_gradients_match_finite_differences(void **state)
{
    fixture f;
    fixture_open(&f, 3);
    float loss = mlp_forward_backward(&f.s, f.params, f.x, f.y, BATCH, f.grad, &f.w);
    assert_true(fabs(loss - loss_at(&f)) < 1e-5);
    const float eps = 1e-3f;
    int checked = 0;
    for (size_t i = 0; i < f.l.total; i++) {
        float keep = f.params[i];
        f.params[i] = keep + eps;
        double up = loss_at(&f);
        f.params[i] = keep - eps;
        double down = loss_at(&f);
        f.params[i] = keep;
        double numeric = (up - down) / (2 * eps);
        double err = fabs(numeric - f.grad[i]);
        if (err > 2e-3 + 2e-2 * fabs(numeric))
            fail_msg("parameter %zu: analytic %g, numeric %g", i, f.grad[i], numeric);
        checked += f.grad[i] != 0;
    }
    /* Most gradients are non-zero: the check compared real values. */
    assert_true(checked > (int)f.l.total / 2);
    fixture_close(&f);
}

static void test_one_step_lowers_the_loss(void **state)
{
    fixture f;
    fixture_open(&f, 5);
    float *v = calloc(f.l.total, sizeof(float));
    assert_non_null(v);
    float before = mlp_forward_backward(&f.s, f.params, f.x, f.y, BATCH, f.grad, &f.w);
    mlp_sgd_step(f.params, f.grad, v, f.l.total, 0.1f, 0.9f);
    double after = loss_at(&f);
    assert_true(after < before - 1e-4);
    free(v);
    fixture_close(&f);
}

static void test_sgd_momentum_matches_pytorch(void **state)
{
    float p[2] = {1, 2}, g[2] = {0.5f, -1}, v[2] = {0, 0};
    mlp_sgd_step(p, g, v, 2, 0.1f, 0.9f); /* v = g; p -= 0.1 g */
    assert_float_equal(p[0], 0.95f, 1e-6);
    assert_float_equal(p[1], 2.1f, 1e-6);
    mlp_sgd_step(p, g, v, 2, 0.1f, 0.9f); /* v = 0.9 g + g */
    assert_float_equal(v[0], 0.95f, 1e-6);
    assert_float_equal(p[0], 0.95f - 0.095f, 1e-6);
}

static void test_evaluate_counts_correct(void **state)
{
    fixture f;
    fixture_open(&f, 9);
    /* Zero weights, bias favouring class 2: every prediction is 2. */
    memset(f.params, 0, f.l.total * sizeof(float));
    f.params[f.l.off[5] + 2] = 1;
    uint8_t y[BATCH] = {2, 0, 2, 1};
    int64_t correct = 0;
    double sum = mlp_evaluate(&f.s, f.params, f.x, y, BATCH, &f.w, &correct);
    assert_int_equal(correct, 2);
    double lse = log(exp(1.0) + 2.0);
    assert_true(fabs(sum - (2 * (lse - 1) + 2 * lse)) < 1e-4);
    fixture_close(&f);
}

#define T(f) cmocka_unit_test_setup_teardown(f, mp_test_setup, mp_test_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_layout_matches_pytorch),
        T(test_gradients_match_finite_differences),
        T(test_one_step_lowers_the_loss),
        T(test_sgd_momentum_matches_pytorch),
        T(test_evaluate_counts_correct),
    };
    /* Warm up (BLAS buffers, the heap) so the leak check sees only the tests. */
    fixture f;
    fixture_open(&f, 1);
    mlp_forward_backward(&f.s, f.params, f.x, f.y, BATCH, f.grad, &f.w);
    fixture_close(&f);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
