# MPI tests: tests/mpi/mpi_suite.c run under mpirun (tests/mpi/run.sh), 4
# ranks on this machine, once with the same-host shared-memory path and once
# with it forced off and Open MPI on TCP (the cross-host path). Registered
# only when the MPI layer is built and mpirun is found.
if(MPROC_MPI_FOUND AND MPROC_MPIEXEC)
  add_executable(mpi_suite ${CMAKE_CURRENT_LIST_DIR}/mpi_suite.c)
  target_link_libraries(mpi_suite PRIVATE mproc_mpi)
  mproc_use_flags(mpi_suite)
  add_executable(mpi_iter_suite ${CMAKE_CURRENT_LIST_DIR}/mpi_iter_suite.c)
  target_link_libraries(mpi_iter_suite PRIVATE mproc_mpi)
  mproc_use_flags(mpi_iter_suite)
  set(run ${CMAKE_CURRENT_LIST_DIR}/run.sh)
  foreach(v shm tcp)
    foreach(c roundtrip alltoall allreduce queue queue_full pool)
      add_test(NAME mpi_${c}_${v} COMMAND ${run} 4 ${v} ok "ok on 4 ranks" $<TARGET_FILE:mpi_suite> ${c})
    endforeach()
    add_test(NAME mpi_raise_${v} COMMAND ${run} 4 ${v} fail
             "rank 0: job failed.*rank 1 .*gives up on purpose" $<TARGET_FILE:mpi_suite> raise)
    # A SIGKILLed rank: mpirun's report ("process rank 2 ... signal 9") is
    # what is guaranteed; on one host rank 0 usually reports it first itself
    # (pidfd watch), but mpirun may end the job before rank 0 prints.
    set(pat "rank 0: job failed.*rank 2 [(]pid|rank 2 with PID .* signal 9")
    add_test(NAME mpi_kill_${v} COMMAND ${run} 4 ${v} fail "${pat}" $<TARGET_FILE:mpi_suite> kill)
    # The pool's iterators and async calls, JoinableQueue counts across
    # ranks, and a rank killed while the others join.
    foreach(c imap joinable)
      add_test(NAME mpi_${c}_${v} COMMAND ${run} 4 ${v} ok "ok on 4 ranks"
               $<TARGET_FILE:mpi_iter_suite> ${c})
    endforeach()
    add_test(NAME mpi_join_kill_${v} COMMAND ${run} 4 ${v} fail "${pat}"
             $<TARGET_FILE:mpi_iter_suite> join_kill)
  endforeach()
  # The demo: 2 ranks x 2 workers, 3 epochs, at least 0.84 (the single-host
  # demo has 0.85 to 0.86 at 2 epochs; 2 epochs here gave 0.8375 once while
  # make test loaded both cores, so 3 keep the check off that edge); and a worker
  # crash on one rank ending the whole job with the record.
  if(TARGET hogwild AND OPENBLAS_LIB AND ZLIB_FOUND)
    add_test(NAME mpi_hogwild_shm COMMAND ${run} 2 shm ok
             "summary:.*test accuracy 0[.](8[4-9]|9)" $<TARGET_FILE:hogwild> --backend mpi
             --workers 2 --epochs 3 --progress lines)
    add_test(NAME mpi_hogwild_fail_tcp COMMAND ${run} 2 tcp fail
             "hogwild: rank [01] .*failed.*SIGSEGV|signal 11" $<TARGET_FILE:hogwild> --backend mpi
             --workers 2 --epochs 1 --limit 6000 --fail-rank 1 --progress none)
  endif()
  get_property(mpi_tests DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY TESTS)
  foreach(t ${mpi_tests})
    if(t MATCHES "^mpi_")
      # One at a time: each takes 4 ranks on a small machine.
      set_tests_properties(${t} PROPERTIES TIMEOUT 200 LABELS "mpi;noasan" RESOURCE_LOCK mpi)
    endif()
  endforeach()
endif()
