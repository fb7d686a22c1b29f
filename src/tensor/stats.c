/* mp_tensor_stats_get: what this process moved into and out of shared
 * memory for its tensors. The counters are plain relaxed atomics: a reader
 * wants totals, not a snapshot consistent across fields while other
 * threads share and receive. */
#include "shm/pins.h"
#include "tensor/tensor_priv.h"

static atomic_ullong copies, copy_bytes, created, received, mapped;

void mp__tensor_stats_copied(size_t nbytes)
{
    atomic_fetch_add_explicit(&copies, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&copy_bytes, nbytes, memory_order_relaxed);
}

void mp__tensor_stats_linked(bool from_message, bool new_mapping)
{
    if (from_message)
        atomic_fetch_add_explicit(&received, 1, memory_order_relaxed);
    if (!new_mapping)
        return;
    atomic_fetch_add_explicit(from_message ? &mapped : &created, 1, memory_order_relaxed);
}

int mp_tensor_stats_get(mp_tensor_stats *out)
{
    mp_tensor_stats st = {.size = sizeof st};
    uint64_t reused = 0;
    if (!out)
        return mp__error(MP_EINVAL, "mp_tensor_stats_get: out is NULL (pass "
                                    "mp_tensor_stats st = {.size = sizeof st}; and &st)");
    st.shared_copies = atomic_load_explicit(&copies, memory_order_relaxed);
    st.shared_copy_bytes = atomic_load_explicit(&copy_bytes, memory_order_relaxed);
    st.segments_created = atomic_load_explicit(&created, memory_order_relaxed);
    mp__pins_counts(&st.segments_received_by_pin, &reused);
    st.segments_received = atomic_load_explicit(&received, memory_order_relaxed) + reused;
    st.segments_mapped = atomic_load_explicit(&mapped, memory_order_relaxed);
    st.segments_unmapped = mp__segment_user_unmapped();
    /* Read last: a segment counted unmapped was counted created or mapped
     * before, so the difference never goes below zero. */
    st.segments_live = st.segments_created + st.segments_mapped - st.segments_unmapped;
    return mp__struct_out(out, &st, sizeof st, "mp_tensor_stats_get", "mp_tensor_stats");
}
