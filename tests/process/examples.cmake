# examples/spawn_errors in every mode and start method (the issue's checks:
# exit status, the error record, under 2 s).
if(MPROC_BUILD_EXAMPLES)
  foreach(mode segv raise ok)
    foreach(method fork spawn forkserver)
      add_test(NAME example_spawn_errors_${mode}_${method}
               COMMAND sh ${PROJECT_SOURCE_DIR}/tests/process/spawn_errors.sh
                       $<TARGET_FILE:spawn_errors> ${mode} ${method})
      set_tests_properties(example_spawn_errors_${mode}_${method} PROPERTIES
                           TIMEOUT 60 LABELS process)
    endforeach()
  endforeach()
endif()
