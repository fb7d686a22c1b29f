/* The idx reader: a valid file reads back; corrupt headers and data are
 * rejected with a sentence naming the file and the fault. */
#include "mp_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "idx.h"

static char dir[64];

static void write_file(const char *name, const void *bytes, size_t n, int gzip, char *path)
{
    sprintf(path, "%s/%s", dir, name);
    if (gzip) {
        gzFile gz = gzopen(path, "wb");
        assert_non_null(gz);
        if (n)
            assert_int_equal(gzwrite(gz, bytes, (unsigned)n), (int)n);
        assert_int_equal(gzclose(gz), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bytes, 1, n, f), n);
        fclose(f);
    }
}

/* Opens and reads a file, expecting failure with `want` in the sentence. */
static void expect_error(const char *name, const void *bytes, size_t n, int gzip, const char *want)
{
    char path[128], err[512] = "";
    unsigned char data[64];
    idx_file f;
    write_file(name, bytes, n, gzip, path);
    int rc = idx_open(path, &f, err, sizeof err);
    if (rc == 0) {
        assert_true(f.nbytes <= sizeof data);
        rc = idx_read_data(&f, data, err, sizeof err);
        idx_close(&f);
    }
    assert_int_equal(rc, -1);
    if (!strstr(err, want) || !strstr(err, path))
        fail_msg("error '%s' should name %s and say '%s'", err, path, want);
    unlink(path);
}

static const unsigned char good[] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2,  0,  0,
                                     0, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

static void test_valid_file_reads_back(void **state)
{
    char path[128], err[256];
    unsigned char data[12];
    idx_file f;
    write_file("good.gz", good, sizeof good, 1, path);
    assert_int_equal(idx_open(path, &f, err, sizeof err), 0);
    assert_int_equal(f.ndim, 3);
    assert_int_equal(f.dims[0], 2);
    assert_int_equal(f.dims[2], 3);
    assert_int_equal(f.nbytes, 12);
    assert_int_equal(idx_read_data(&f, data, err, sizeof err), 0);
    assert_memory_equal(data, good + 16, 12);
    idx_close(&f);
    idx_close(&f); /* twice is harmless */
    unlink(path);
}

static void test_corrupt_headers_are_rejected(void **state)
{
    unsigned char b[sizeof good];
    memcpy(b, good, sizeof b);
    b[2] = 0x0d; /* float data */
    expect_error("type.gz", b, sizeof b, 1, "bad idx magic");
    memcpy(b, good, sizeof b);
    b[0] = 1;
    expect_error("magic.gz", b, sizeof b, 1, "bad idx magic");
    memcpy(b, good, sizeof b);
    b[3] = 0;
    expect_error("ndim0.gz", b, sizeof b, 1, "0 dimensions");
    b[3] = 9;
    expect_error("ndim9.gz", b, sizeof b, 1, "9 dimensions");
    memcpy(b, good, sizeof b);
    b[11] = 0; /* size 1 is zero */
    expect_error("zero.gz", b, sizeof b, 1, "idx size 1 is 0");
    memcpy(b, good, sizeof b);
    b[4] = 0xff; /* 4 billion images */
    expect_error("huge.gz", b, sizeof b, 1, "idx size 0");
    expect_error("short.gz", good, 10, 1, "header cut short");
    expect_error("empty.gz", good, 0, 1, "no idx header");
    {
        /* a gzip header, then a deflate block of the reserved type 3: zlib's
         * own sentence (it lives in the gz state) must survive the close */
        static const unsigned char bad_deflate[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3,
                                                    0x07, 0x00, 0x00, 0x00, 0x00, 0x00};
        expect_error("deflate.gz", bad_deflate, sizeof bad_deflate, 0, "invalid block type");
    }
}

static void test_bad_data_is_rejected(void **state)
{
    unsigned char b[sizeof good + 1];
    expect_error("trunc.gz", good, sizeof good - 1, 1, "promises 12 data bytes");
    memcpy(b, good, sizeof good);
    b[sizeof good] = 99;
    expect_error("trail.gz", b, sizeof b, 1, "trailing bytes");
    expect_error("plain.idx", good, sizeof good, 0, "not gzip");
}

static void test_missing_file_names_it(void **state)
{
    char path[128], err[256];
    idx_file f;
    sprintf(path, "%s/nope.gz", dir);
    assert_int_equal(idx_open(path, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file"));
}

#define T(f) cmocka_unit_test_setup_teardown(f, mp_test_setup, mp_test_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_valid_file_reads_back),
        T(test_corrupt_headers_are_rejected),
        T(test_bad_data_is_rejected),
        T(test_missing_file_names_it),
    };
    strcpy(dir, "/tmp/mproc-idx-test-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(dir);
    return rc;
}
