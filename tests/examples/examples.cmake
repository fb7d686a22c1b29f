# The example tests compile the examples' own sources (not their main.c) into
# the test binary, so they test the code the examples run.
set(MPROC_HOGWILD_DIR ${PROJECT_SOURCE_DIR}/examples/hogwild)
function(mproc_example_test test)
  if(TARGET ${test})
    list(TRANSFORM ARGN PREPEND ${MPROC_HOGWILD_DIR}/)
    target_sources(${test} PRIVATE ${ARGN})
    target_include_directories(${test} PRIVATE ${MPROC_HOGWILD_DIR})
  endif()
endfunction()
mproc_example_test(mlp_test mlp.c)
mproc_example_test(idx_test idx.c)
mproc_example_test(hogwild_test data.c idx.c mlp.c progress.c train.c worker.c)
