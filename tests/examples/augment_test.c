/* The dataloader's augmentation: a zero shift without flip is plain
 * decoding (as the hogwild example's data_gather), a flip mirrors each row,
 * a shift moves the image and pads with the value of a black pixel, and
 * the random variant only ever produces one of those crops, all of them
 * over enough draws. */
#include "mp_test.h"

#include <math.h>
#include <string.h>

#include "data.h"
#include "loader.h"

static uint8_t image[DATA_PIXELS];
static const float black = -DATA_MEAN / DATA_STD;

static void make_image(void)
{
    for (int i = 0; i < DATA_PIXELS; i++)
        image[i] = (uint8_t)(i * 7 % 251 + 1); /* no pixel is black */
}

static float pixel(int r, int c)
{
    static float want[DATA_PIXELS];
    static uint8_t same[DATA_PIXELS];
    uint32_t idx = 0;
    memset(same, image[r * DATA_COLS + c], sizeof same);
    data_gather(same, &idx, 1, want); /* the hogwild normalization of that pixel */
    return want[0];
}

static void test_identity_is_decoding(void **state)
{
    float out[DATA_PIXELS], want[DATA_PIXELS];
    uint32_t idx = 0;
    data_gather(image, &idx, 1, want);
    loader_augment(image, 0, 0, 0, out);
    for (int i = 0; i < DATA_PIXELS; i++)
        assert_float_equal(out[i], want[i], 1e-6);
}

static void test_flip_mirrors_rows(void **state)
{
    float out[DATA_PIXELS];
    loader_augment(image, 0, 0, 1, out);
    for (int r = 0; r < DATA_ROWS; r++)
        for (int c = 0; c < DATA_COLS; c++)
            assert_float_equal(out[r * DATA_COLS + c], pixel(r, DATA_COLS - 1 - c), 1e-6);
}

static void test_shift_pads_with_black(void **state)
{
    float out[DATA_PIXELS];
    loader_augment(image, 2, -3, 0, out); /* out[r][c] = in[r - 3][c + 2] */
    for (int r = 0; r < DATA_ROWS; r++)
        for (int c = 0; c < DATA_COLS; c++) {
            int sr = r - 3, sc = c + 2;
            bool inside = sr >= 0 && sc < DATA_COLS;
            float want = inside ? pixel(sr, sc) : black;
            assert_float_equal(out[r * DATA_COLS + c], want, 1e-6);
        }
}

static void test_random_crops_cover_every_choice(void **state)
{
    enum { SHIFTS = 2 * LOADER_PAD + 1 };
    static float crops[SHIFTS][SHIFTS][2][DATA_PIXELS];
    bool seen[SHIFTS][SHIFTS][2] = {{{false}}};
    float out[DATA_PIXELS];
    int distinct = 0;
    rng r;
    for (int dy = 0; dy < SHIFTS; dy++)
        for (int dx = 0; dx < SHIFTS; dx++)
            for (int f = 0; f < 2; f++)
                loader_augment(image, dx - LOADER_PAD, dy - LOADER_PAD, f, crops[dy][dx][f]);
    rng_seed(&r, 11);
    for (int n = 0; n < 3000; n++) {
        bool found = false;
        loader_augment_random(image, &r, out);
        for (int dy = 0; dy < SHIFTS && !found; dy++)
            for (int dx = 0; dx < SHIFTS && !found; dx++)
                for (int f = 0; f < 2 && !found; f++)
                    if (!memcmp(out, crops[dy][dx][f], sizeof out)) {
                        found = true;
                        distinct += !seen[dy][dx][f];
                        seen[dy][dx][f] = true;
                    }
        if (!found)
            fail_msg("draw %d is no crop of the padded image", n);
    }
    /* 162 choices, 3000 draws: missing one has odds of about 1e-6. */
    assert_int_equal(distinct, SHIFTS * SHIFTS * 2);
}

static void test_quota_splits_the_batches(void **state)
{
    loader_cfg c = {.workers = 3, .batches = 10};
    assert_int_equal(loader_quota(&c, 0), 4);
    assert_int_equal(loader_quota(&c, 1), 3);
    assert_int_equal(loader_quota(&c, 2), 3);
}

#define T(f) cmocka_unit_test_setup_teardown(f, mp_test_setup, mp_test_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_identity_is_decoding),
        T(test_flip_mirrors_rows),
        T(test_shift_pads_with_black),
        T(test_random_crops_cover_every_choice),
        T(test_quota_splits_the_batches),
    };
    make_image();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
