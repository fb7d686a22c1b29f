/* The hogwild example's training driver, end to end on real Fashion-MNIST
 * (Debian's dataset-fashion-mnist, installed by scripts/deps): a 1-worker
 * --seed run is reproducible, short 2-worker runs on a 2k-sample subset
 * learn (both modes), a dying worker stops the run with mp_spawn's error
 * instead of hanging it, and bad options are refused. Every run is checked
 * for leaked fds, segments, mappings and children by the teardown. */
#include "mp_test.h"

#include <stdio.h>
#include <string.h>

#include "data.h"
#include "train.h"

static dataset data;

/* 2,000 training samples, quiet, small batches so each worker steps often. */
static void short_run(train_options *o, int workers, int epochs)
{
    train_options_init(o);
    o->limit = 2000;
    o->batch = 32;
    o->workers = workers;
    o->epochs = epochs;
    o->output = OUT_QUIET;
}

static void test_one_worker_seed_is_deterministic(void **state)
{
    train_options o;
    train_result a, b, c;
    short_run(&o, 1, 1);
    o.seed = 42;
    assert_mp_ok(train_run(&o, &data, &a));
    assert_mp_ok(train_run(&o, &data, &b));
    assert_true(a.param_hash == b.param_hash);
    assert_true(a.test_accuracy == b.test_accuracy);
    o.seed = 43; /* another seed: another initialization and shuffle */
    assert_mp_ok(train_run(&o, &data, &c));
    assert_true(c.param_hash != a.param_hash);
}

static void test_one_worker_periodic_is_deterministic(void **state)
{
    train_options o;
    train_result a, b;
    short_run(&o, 1, 1);
    o.sync = TRAIN_PERIODIC;
    o.every = 5;
    o.seed = 7;
    assert_mp_ok(train_run(&o, &data, &a));
    assert_mp_ok(train_run(&o, &data, &b));
    assert_true(a.param_hash == b.param_hash);
}

/* A fixed bound far below the untrained loss (ln 10 = 2.30) and chance
 * accuracy (0.1), yet generous enough for any interleaving of the workers. */
#define LOSS_BOUND 0.8
#define ACCURACY_FLOOR 0.6

static void test_two_workers_shared_learn(void **state)
{
    train_options o;
    train_result r;
    short_run(&o, 2, 3);
    assert_mp_ok(train_run(&o, &data, &r));
    if (!(r.train_loss < LOSS_BOUND) || !(r.test_accuracy > ACCURACY_FLOOR))
        fail_msg("train loss %.3f (want < %.1f), test accuracy %.3f (want > %.1f)", r.train_loss,
                 LOSS_BOUND, r.test_accuracy, ACCURACY_FLOOR);
}

static void test_two_workers_periodic_learn(void **state)
{
    train_options o;
    train_result r;
    short_run(&o, 2, 3);
    o.sync = TRAIN_PERIODIC;
    o.every = 4;
    assert_mp_ok(train_run(&o, &data, &r));
    if (!(r.train_loss < LOSS_BOUND) || !(r.test_accuracy > ACCURACY_FLOOR))
        fail_msg("train loss %.3f (want < %.1f), test accuracy %.3f (want > %.1f)", r.train_loss,
                 LOSS_BOUND, r.test_accuracy, ACCURACY_FLOOR);
}

static void test_spawn_start_method_trains(void **state)
{
    train_options o;
    train_result r;
    short_run(&o, 2, 1);
    o.start_method = "spawn";
    assert_mp_ok(train_run(&o, &data, &r));
    assert_true(r.test_accuracy > 0.3);
}

static void test_dead_worker_stops_the_run(void **state)
{
    train_options o;
    train_result r;
    short_run(&o, 2, 2);
    o.fail_rank = 1;
    assert_mp_err(train_run(&o, &data, &r), MP_ECHILD);
    o.sync = TRAIN_PERIODIC; /* the parent is blocked on the queue here */
    o.every = 3;
    assert_mp_err(train_run(&o, &data, &r), MP_ECHILD);
}

static void test_bad_options_are_refused(void **state)
{
    train_options o;
    train_result r;
    short_run(&o, 2, 1);
    o.limit = data.n_train + 1;
    assert_mp_err(train_run(&o, &data, &r), MP_EINVAL);
    short_run(&o, 2, 1);
    o.batch = 1500; /* 1000 samples per worker: not one batch */
    assert_mp_err(train_run(&o, &data, &r), MP_EINVAL);
    short_run(&o, 2, 1);
    o.sync = TRAIN_PERIODIC;
    o.every = 0;
    assert_mp_err(train_run(&o, &data, &r), MP_EINVAL);
}

static void test_missing_dataset_names_the_package(void **state)
{
    dataset d;
    char err[1024];
    assert_int_not_equal(dataset_load("/nonexistent/fashion", &d, err, sizeof err), 0);
    if (!strstr(err, DATA_PACKAGE) || !strstr(err, "--data"))
        fail_msg("error '%s' should name %s and --data", err, DATA_PACKAGE);
}

static int setup(void **state)
{
    return mp_test_setup(state);
}
static int teardown(void **state)
{
    return mp_test_teardown(state);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_worker_seed_is_deterministic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_worker_periodic_is_deterministic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_workers_shared_learn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_workers_periodic_learn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spawn_start_method_trains, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_worker_stops_the_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_options_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_dataset_names_the_package, setup, teardown),
    };
    char err[1024];
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    /* Loaded once: the shared training tensors exist before every test's
     * leak snapshot, as they do in the example. */
    if (dataset_load(NULL, &data, err, sizeof err) != 0) {
        fprintf(stderr, "hogwild_test: %s\n", err);
        return 1;
    }
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dataset_free(&data);
    return rc;
}
