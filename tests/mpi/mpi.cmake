# MPI tests: tests/mpi/mpi_suite.c and mpi_iter_suite.c run under mpirun (tests/mpi/run.sh), 4
# ranks on this machine, once with the same-host shared-memory path and once
# with it forced off and MPI on TCP (the cross-host path). Registered only
# when the MPI layer is built and its launcher is found; the mpich_* tests
# run the same cases against the layer's MPICH build (cmake/mpi.cmake) when
# MPICH is installed beside the main MPI.
set(run ${CMAKE_CURRENT_LIST_DIR}/run.sh)

# The stub that -DMPROC_MPI=OFF builds (src/mpi/stub.c), checked in every
# build: its constructors fail with MP_ENOTSUP and say how to enable MPI.
add_library(mproc_mpi_stub STATIC ${PROJECT_SOURCE_DIR}/src/mpi/stub.c)
target_link_libraries(mproc_mpi_stub PUBLIC mproc_static)
target_include_directories(mproc_mpi_stub PRIVATE ${PROJECT_SOURCE_DIR}/src)
mproc_use_flags(mproc_mpi_stub)
add_executable(mpi_stub_test ${CMAKE_CURRENT_LIST_DIR}/stub_test.c)
target_link_libraries(mpi_stub_test PRIVATE mproc_mpi_stub)
mproc_use_flags(mpi_stub_test)
add_test(NAME mpi_stub_test COMMAND mpi_stub_test)

# The suite's cases for one build of the layer: tests PREFIX_<case>_<variant>
# (run.sh: shm, tcp, and for Open MPI hosts, two hosts made on this machine).
function(mproc_mpi_suite_tests prefix layer variants)
  foreach(s suite iter_suite queue_suite ahead_suite)
    add_executable(${prefix}_${s} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/mpi_${s}.c
                   ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/mpi_check.c)
    target_link_libraries(${prefix}_${s} PRIVATE ${layer})
    mproc_use_flags(${prefix}_${s})
  endforeach()
  set(suite $<TARGET_FILE:${prefix}_suite>)
  set(iter $<TARGET_FILE:${prefix}_iter_suite>)
  set(qsuite $<TARGET_FILE:${prefix}_queue_suite>)
  set(asuite $<TARGET_FILE:${prefix}_ahead_suite>)
  foreach(v ${variants})
    foreach(c roundtrip alltoall allreduce queue queue_full pool)
      add_test(NAME ${prefix}_${c}_${v} COMMAND ${run} 4 ${v} ok "ok on 4 ranks" ${suite} ${c})
    endforeach()
    add_test(NAME ${prefix}_raise_${v} COMMAND ${run} 4 ${v} fail
             "rank 0: job failed.*rank 1 .*exit 1 signal 0: rank 1 gives up on purpose"
             ${suite} raise)
    # A SIGKILLed rank: the launcher's report is what is guaranteed (Open
    # MPI: "process rank 2 with PID ... signal 9"; MPICH's hydra kills the
    # job at once and names the pid only: "EXIT CODE: 9"); on one host
    # rank 0 usually reports it first itself (pidfd watch), but the launcher
    # may end the job before rank 0 prints; or another survivor's blocking
    # call fails first with the record naming rank 2 and the signal, and its
    # MPI_Abort ends the job (seen with MPICH: hydra then prints no kill
    # banner).
    set(pat "rank 0: job failed.*rank 2 [(]pid|rank 2 with PID .* signal 9")
    set(pat "${pat}|^=   EXIT CODE: 9$|EXIT STRING: Killed [(]signal 9[)]")
    set(pat "${pat}|^rank [0-9]+: .*rank 2 [(]pid [0-9]+ on [^)]+[)] failed: died of signal 9")
    # MPICH over UCX: a survivor still copying from the killed rank's memory
    # (UCX's CMA transport) is aborted by UCX itself, before any mproc call
    # returns (1 run in about 20 here): the job still ends, with UCX's line.
    set(pat "${pat}|process_vm_readv[(]pid=[0-9]+ .* No such process")
    add_test(NAME ${prefix}_kill_${v} COMMAND ${run} 4 ${v} fail "${pat}" ${suite} kill)
    # The pool's iterators and async calls, JoinableQueue counts across
    # ranks, and a rank killed while the others join.
    foreach(c imap joinable)
      add_test(NAME ${prefix}_${c}_${v} COMMAND ${run} 4 ${v} ok "ok on 4 ranks" ${iter} ${c})
    endforeach()
    add_test(NAME ${prefix}_join_kill_${v} COMMAND ${run} 4 ${v} fail "${pat}" ${iter} join_kill)
    add_test(NAME ${prefix}_raise_after_pool_${v} COMMAND ${run} 4 ${v} fail
             "rank 0: job failed.*rank 1 .*exit 1 signal 0: rank 1 raised after serving a pool"
             ${iter} raise_after_pool)
    # The queue's short cuts on its home rank: hand-overs, timeouts racing
    # them, close, and a rank killed while the home serves gets.
    foreach(c qping qraces qclose qfork)
      add_test(NAME ${prefix}_${c}_${v} COMMAND ${run} 4 ${v} ok "ok on 4 ranks" ${qsuite} ${c})
    endforeach()
    add_test(NAME ${prefix}_qkill_${v} COMMAND ${run} 4 ${v} fail "${pat}" ${qsuite} qkill)
    # Puts that run ahead of the home's answers, and a rank killed mid-stream.
    add_test(NAME ${prefix}_ahead_${v} COMMAND ${run} 4 ${v} ok "ok on 4 ranks" ${asuite} ahead)
    add_test(NAME ${prefix}_ahead_kill_${v} COMMAND ${run} 4 ${v} fail "${pat}" ${asuite}
             ahead_kill)
    # The home rank killed: no rank 0 to print the record; a survivor's or
    # the launcher's report names it.
    set(hpat "rank 0 with PID .* signal 9|^=   EXIT CODE: 9$|EXIT STRING: Killed [(]signal 9[)]")
    set(hpat "${hpat}|rank 0 [(]pid [0-9]+ on [^)]+[)] failed: died of signal 9")
    set(hpat "${hpat}|process_vm_readv[(]pid=[0-9]+ .* No such process")
    add_test(NAME ${prefix}_qkill_home_${v} COMMAND ${run} 4 ${v} fail "${hpat}" ${qsuite}
             qkill_home)
  endforeach()
endfunction()

# The demo: 2 ranks x 2 workers, 3 epochs, at least 0.84 (the single-host
# demo has 0.85 to 0.86 at 2 epochs; 2 epochs here gave 0.8375 once while
# make test loaded both cores, so 3 keep the check off that edge); and a worker
# crash on one rank ending the whole job with the record.
function(mproc_mpi_hogwild_tests prefix exe)
  set(exe $<TARGET_FILE:${exe}>)
  add_test(NAME ${prefix}_hogwild_shm COMMAND ${run} 2 shm ok
           "summary:.*test accuracy 0[.](8[4-9]|9)" ${exe} --backend mpi
           --workers 2 --epochs 3 --progress lines)
  add_test(NAME ${prefix}_hogwild_fail_tcp COMMAND ${run} 2 tcp fail
           "hogwild: rank [01] .*failed.*SIGSEGV|signal 11" ${exe} --backend mpi
           --workers 2 --epochs 1 --limit 6000 --fail-rank 1 --progress none)
endfunction()

if(MPROC_MPI_FOUND AND MPROC_MPIEXEC)
  mproc_mpi_suite_tests(mpi mproc_mpi "shm;tcp;hosts")
  # A host that drops off the network (no process exits, no connection
  # closes): mpirun's daemon connection's keepalive (hosts.sh sets it to
  # about 5 s; Open MPI's default takes 8 minutes) ends the job.
  add_test(NAME mpi_host_lost_hosts COMMAND ${run} 4 hosts fail
           "ORTE has lost communication with a remote daemon" $<TARGET_FILE:mpi_suite> host_lost)
  if(TARGET hogwild AND OPENBLAS_LIB AND ZLIB_FOUND)
    mproc_mpi_hogwild_tests(mpi hogwild)
    # The demo and its crash across two hosts made here: a rank on each.
    add_test(NAME mpi_hogwild_hosts COMMAND ${run} 2 hosts ok
             "summary:.*test accuracy 0[.](8[4-9]|9)" $<TARGET_FILE:hogwild> --backend mpi
             --workers 2 --epochs 3 --progress lines)
    add_test(NAME mpi_hogwild_fail_hosts COMMAND ${run} 2 hosts fail
             "hogwild: rank [01] .*failed.*SIGSEGV|signal 11" $<TARGET_FILE:hogwild>
             --backend mpi --workers 2 --epochs 1 --limit 6000 --fail-rank 1 --progress none)
  endif()
endif()
if(MPROC_MPICH_FOUND)
  mproc_mpi_suite_tests(mpich mproc_mpi_mpich "shm;tcp")
  if(TARGET hogwild AND OPENBLAS_LIB AND ZLIB_FOUND)
    mproc_mpi_hogwild_tests(mpich hogwild_mpich) # built by cmake/mpi.cmake
  endif()
endif()

get_property(mpi_tests DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY TESTS)
foreach(t ${mpi_tests})
  if(t MATCHES "^mpich_")
    set(launcher ${MPROC_MPIEXEC_MPICH})
  elseif(t MATCHES "^mpi_")
    set(launcher ${MPROC_MPIEXEC})
  else()
    continue()
  endif()
  # One at a time: each takes 4 ranks on a small machine. run.sh starts the
  # job with the launcher of the MPI the program was built with.
  set_tests_properties(${t} PROPERTIES TIMEOUT 200 LABELS "mpi;noasan" RESOURCE_LOCK mpi
                       ENVIRONMENT "MPROC_MPIEXEC=${launcher}" SKIP_RETURN_CODE 77)
endforeach()
