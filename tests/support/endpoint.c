/* mp_test_ep: the same test run against a queue and against a pipe. */
#include "mp_test.h"

#include <string.h>

void mp_test_ep_open(mp_test_ep *e, bool queue, bool duplex)
{
    memset(e, 0, sizeof *e);
    if (queue)
        assert_mp_ok(mp_queue_create(0, &e->q));
    else
        assert_mp_ok(mp_pipe(duplex, &e->rx, &e->tx));
}

void mp_test_ep_close(mp_test_ep *e)
{
    mp_queue_release(e->q);
    mp_conn_release(e->rx);
    mp_conn_release(e->tx);
    memset(e, 0, sizeof *e);
}

int mp_test_ep_send(mp_test_ep *e, mp_msg *m, double timeout)
{
    int rc = e->q ? mp_queue_put(e->q, m, timeout) : mp_conn_send(e->tx, m, timeout);
    mp_msg_destroy(m);
    return rc;
}

int mp_test_ep_recv(mp_test_ep *e, mp_msg **m, double timeout)
{
    return e->q ? mp_queue_get(e->q, m, timeout) : mp_conn_recv(e->rx, m, timeout);
}
