/* Helper of static_link_test.sh: sends two messages on the SOCK_SEQPACKET
 * socket whose fd number is argv[1] (an end of the receiver's mp_pipe,
 * inherited through exec). It links the library's internals, because no
 * public call sends on a bare fd.
 *   1. one attachment of every object kind but the CUDA tensor, each named
 *      after its kind;
 *   2. an attachment of the CUDA tensor's kind id, whose body is an event's
 *      (there is no GPU to make a real one): a receiver that knows the kind
 *      hands it to the CUDA layer, which refuses it with its own sentence;
 *      one that does not says "does not know".
 * Exit status 0 when both were sent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mproc.h"
#include "wire/frame.h"
#include "wire/wire.h"

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((x) < 0) {                                                                             \
            fprintf(stderr, "kinds_sender: %s: %s\n", #x, mp_last_error());                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void send_every_kind(int sock)
{
    mp_msg *m;
    mp_queue *q, *jq;
    mp_simple_queue *sq;
    mp_conn *a, *b;
    mp_lock *l;
    mp_rlock *rl;
    mp_semaphore *s;
    mp_event *e;
    mp_condition *c;
    mp_barrier *br;
    TRY(mp_msg_create(&m));
    TRY(mp_queue_create(0, &q));
    TRY(mp_msg_add_queue(m, "queue", q));
    TRY(mp_simple_queue_create(&sq));
    TRY(mp_msg_add_simple_queue(m, "simple queue", sq));
    TRY(mp_joinable_queue_create(0, &jq));
    TRY(mp_msg_add_queue(m, "joinable queue", jq));
    TRY(mp_pipe(true, &a, &b));
    TRY(mp_msg_add_conn(m, "connection", a));
    TRY(mp_lock_create(&l));
    TRY(mp_msg_add_lock(m, "lock", l));
    TRY(mp_rlock_create(&rl));
    TRY(mp_msg_add_rlock(m, "rlock", rl));
    TRY(mp_semaphore_create(2, &s));
    TRY(mp_msg_add_semaphore(m, "semaphore", s));
    TRY(mp_event_create(&e));
    TRY(mp_msg_add_event(m, "event", e));
    TRY(mp_condition_create(&c));
    TRY(mp_msg_add_condition(m, "condition", c));
    TRY(mp_barrier_create(2, &br));
    TRY(mp_msg_add_barrier(m, "barrier", br));
    TRY(mp__wire_send(sock, m, mp__deadline(30)));
    mp_msg_destroy(m);
    mp_queue_release(q);
    mp_queue_release(jq);
    mp_simple_queue_release(sq);
    mp_conn_release(a);
    mp_conn_release(b);
    mp_lock_release(l);
    mp_rlock_release(rl);
    mp_semaphore_release(s);
    mp_event_release(e);
    mp_condition_release(c);
    mp_barrier_release(br);
}

/* A frame of one event, its attachment relabelled as a CUDA tensor. */
static void send_cuda_kind(int sock)
{
    mp_msg *m;
    mp_event *e;
    void *buf;
    size_t len;
    int fds[MP__WIRE_MAX_FDS], nfds;
    mp__frame_attach fa;
    TRY(mp_msg_create(&m));
    TRY(mp_event_create(&e));
    TRY(mp_msg_add_event(m, NULL, e));
    TRY(mp__wire_encode(m, &buf, &len, fds, &nfds));
    /* No payload, no storages: the attachment record follows the header. */
    memcpy(&fa, (char *)buf + sizeof(mp__frame_header), sizeof fa);
    if (fa.kind != MP_ATTACH_EVENT) {
        fprintf(stderr, "kinds_sender: the frame layout changed (kind %u)\n", fa.kind);
        exit(1);
    }
    fa.kind = MP_ATTACH_CUDA_TENSOR;
    memcpy((char *)buf + sizeof(mp__frame_header), &fa, sizeof fa);
    TRY(mp__send_record(sock, buf, len, fds, nfds, mp__deadline(30)));
    free(buf);
    mp_msg_destroy(m);
    mp_event_release(e);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: kinds_sender FD\n");
        return 2;
    }
    send_every_kind(atoi(argv[1]));
    send_cuda_kind(atoi(argv[1]));
    return 0;
}
