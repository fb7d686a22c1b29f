/* mp_mpi_spawn (the entry on every rank, with mp_spawn's error record) and
 * the collectives. */
#include "mpi/mpi_internal.h"
#include "process/process_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The entry's call, made through mp__catch_raise: mp_raise inside it is
 * this rank's failure, with its text, as in a pool worker. */
struct entry_call {
    mp_entry_fn fn;
    mp_msg *args;
};

static int call_entry(void *ctx)
{
    struct entry_call *e = ctx;
    return e->fn(mp__mpi.rank, e->args);
}

/* Writes the failure record into the caller's err (NULL: nowhere) the
 * extensible-struct way; with none yet, a zeroed one (a size check). */
static int fill_error(mp_mpi_error *err, const char *call)
{
    const mp__mpi_fail *f = &mp__mpi.failure;
    mp_mpi_error e = {.size = sizeof e};
    if (!err)
        return 0;
    if (mp__mpi.failed)
        e = (mp_mpi_error){.size = sizeof e, .rank = f->rank, .pid = f->pid, .host = f->host,
                           .exitcode = f->exitcode, .signal = f->signal,
                           .message = f->message};
    return mp__struct_out(err, &e, sizeof e, call, "mp_mpi_error");
}

int mp_mpi_failure(mp_mpi_error *err)
{
    int rc = mp__mpi_need("mp_mpi_failure");
    if (rc)
        return rc;
    if ((rc = fill_error(err, "mp_mpi_failure")) < 0)
        return rc;
    if (!mp__mpi.failed && mp__mpi_check("mp_mpi_failure") == 0)
        return mp__error(MP_ESTATE, "mp_mpi_failure: no rank has failed");
    return fill_error(err, "mp_mpi_failure");
}

/* This rank's entry failed: the record goes to every rank. */
static void report_own(const char *entry, int rc, bool raised, const char *raised_text)
{
    mp__mpi_fail f = {.rank = mp__mpi.rank, .pid = (int32_t)getpid(), .exitcode = rc};
    snprintf(f.host, sizeof f.host, "%s", mp__mpi.peers[mp__mpi.rank].host);
    if (raised)
        snprintf(f.message, sizeof f.message, "%s", raised_text);
    else
        snprintf(f.message, sizeof f.message, "entry '%s' returned %d%s%s%s", entry, rc,
                 rc < 0 ? " (" : "", rc < 0 ? mp_err_name(rc) : "", rc < 0 ? ")" : "");
    /* A negative return is an mproc error: its sentence says what failed. */
    if (!raised && rc < 0 && mp_last_error()[0]) {
        size_t len = strlen(f.message);
        snprintf(f.message + len, sizeof f.message - len, ": %s", mp_last_error());
    }
    mp__mpi_fail_report(&f);
}

int mp_mpi_spawn(const char *entry, mp_msg *args, mp_mpi_error *err)
{
    MPI_Request req = MPI_REQUEST_NULL;
    mp_msg *empty = NULL;
    char raised_text[MP__MPI_TEXT_MAX];
    bool raised;
    int rc = mp__mpi_need("mp_mpi_spawn");
    if (rc)
        return rc;
    if ((rc = mp__entry_check(entry, "entry", "mp_mpi_spawn")) < 0)
        return rc;
    /* Before the entry runs: every rank runs this same check, so a bad size
     * fails them all here, never leaving one rank out of the collective. */
    if ((rc = fill_error(err, "mp_mpi_spawn")) < 0)
        return rc;
    mp_entry_fn fn = mp__entry_lookup(entry);
    if (!args && (rc = mp_msg_create(&empty)) != 0)
        return rc;
    if (!mp__mpi.failed) {
        rc = mp__catch_raise(call_entry, &(struct entry_call){fn, args ? args : empty}, raised_text,
                             sizeof raised_text, &raised);
        if (raised)
            rc = 1; /* the exit code of a child that called mp_raise */
        if (rc != 0)
            report_own(entry, rc, raised, raised_text);
    }
    mp_msg_destroy(empty);
    if (!mp__mpi.failed) {
        /* Done here; wait for the others, or for news of a failure. */
        MPI_Ibarrier(mp__mpi.comm, &req);
        rc = mp__mpi_wait(&req, -1, NULL, "mp_mpi_spawn");
        if (rc == 0)
            return 0;
    }
    fill_error(err, "mp_mpi_spawn"); /* its size was checked on the way in */
    rc = mp__mpi_fail_error("mp_mpi_spawn");
    /* Rank 0 reports; the others must not end the job before it has. */
    if (mp__mpi.rank != 0) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        for (int i = 0; i < 1000; i++)
            nanosleep(&ts, NULL);
    }
    return rc;
}

/* ---- collectives ---------------------------------------------------------- */

static MPI_Datatype mpi_type(mp_dtype d)
{
    switch (d) {
    case MP_INT8: return MPI_INT8_T;
    case MP_INT16: return MPI_INT16_T;
    case MP_INT32: return MPI_INT32_T;
    case MP_INT64: return MPI_INT64_T;
    case MP_UINT8: return MPI_UINT8_T;
    case MP_UINT16: return MPI_UINT16_T;
    case MP_UINT32: return MPI_UINT32_T;
    case MP_UINT64: return MPI_UINT64_T;
    case MP_FLOAT32: return MPI_FLOAT;
    case MP_FLOAT64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

static void scale(mp_tensor *t, double by)
{
    int64_t n = mp_tensor_numel(t);
    if (mp_tensor_dtype(t) == MP_FLOAT32) {
        float *p = mp_tensor_data(t);
        for (int64_t i = 0; i < n; i++)
            p[i] = (float)(p[i] * by);
    } else {
        double *p = mp_tensor_data(t);
        for (int64_t i = 0; i < n; i++)
            p[i] *= by;
    }
}

int mp_mpi_allreduce_tensor(mp_tensor *t, mp_mpi_op op)
{
    static const char *fn = "mp_mpi_allreduce_tensor";
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = mp__mpi_need(fn);
    if (rc)
        return rc;
    if (!t)
        return mp__error(MP_EINVAL, "%s: t is NULL", fn);
    if (op != MP_MPI_SUM && op != MP_MPI_MEAN)
        return mp__error(MP_EINVAL, "%s: op %d is not MP_MPI_SUM or MP_MPI_MEAN", fn, (int)op);
    mp_dtype d = mp_tensor_dtype(t);
    MPI_Datatype type = mpi_type(d);
    if (type == MPI_DATATYPE_NULL || (op == MP_MPI_MEAN && d != MP_FLOAT32 && d != MP_FLOAT64))
        return mp__error(MP_ENOTSUP, "%s: dtype %s is not supported for %s (sum: integers, "
                                     "float32, float64; mean: float32, float64)", fn,
                         mp_dtype_name(d), op == MP_MPI_SUM ? "sum" : "mean");
    if (mp_tensor_device(t).device_type != kDLCPU || !mp_tensor_is_contiguous(t))
        return mp__error(MP_EINVAL, "%s: t must be a contiguous CPU tensor (clone it first)", fn);
    if (mp_tensor_numel(t) > INT32_MAX)
        return mp__error(MP_EOVERFLOW, "%s: %lld elements; at most %d per call", fn,
                         (long long)mp_tensor_numel(t), INT32_MAX);
    if (mp__mpi.failed)
        return mp__mpi_fail_error(fn);
    rc = MPI_Iallreduce(MPI_IN_PLACE, mp_tensor_data(t), (int)mp_tensor_numel(t), type, MPI_SUM,
                        mp__mpi.comm, &req);
    if (rc != MPI_SUCCESS)
        return mp__mpi_error(rc, fn, "MPI_Iallreduce");
    if ((rc = mp__mpi_wait(&req, -1, NULL, fn)) != 0)
        return rc;
    if (op == MP_MPI_MEAN)
        scale(t, 1.0 / mp__mpi.size);
    return 0;
}
