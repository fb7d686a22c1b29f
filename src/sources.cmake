# The library's sources, one explicit list per layer folder (no globs: a new
# file is added here, next to its neighbours). Included by the top
# CMakeLists.txt, which builds MPROC_SOURCES into libmproc; src/cuda/ is
# added by cmake/cuda.cmake.
set(MPROC_OS_SOURCES atfork.c coderef.c error.c extstruct.c hazard.c ids.c parse.c pidfd.c record.c sys.c util.c)
set(MPROC_SHM_SOURCES cache.c foreign.c handle.c manager_client.c manager_inspect.c manager_util.c pins.c
    pins_borrow.c pins_keep.c recycle.c segment.c strategy.c)
set(MPROC_TENSOR_SOURCES adopt.c dlpack.c dtype.c recycle.c stats.c storage.c strategy.c tensor.c view.c)
set(MPROC_WIRE_SOURCES compact.c frame_decode.c frame_encode.c kinds.c msg.c rx.c wire.c)
set(MPROC_SYNC_SOURCES attach.c barrier.c event.c fastlock.c lock.c object.c robust.c
    semaphore.c)
set(MPROC_IPC_SOURCES conn.c kinds.c qcore.c queue.c ring.c ring_recv.c)
set(MPROC_PROCESS_SOURCES backtrace.c child.c forkserver.c launch.c process.c registry.c spawn.c wait.c)
set(MPROC_POOL_SOURCES exit.c frame.c inflight.c pool.c remote.c result.c submit.c worker.c workers.c)

set(MPROC_SOURCES)
foreach(layer os shm tensor wire sync ipc process pool)
  string(TOUPPER ${layer} LAYER)
  list(TRANSFORM MPROC_${LAYER}_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/${layer}/)
  list(APPEND MPROC_SOURCES ${MPROC_${LAYER}_SOURCES})
endforeach()
