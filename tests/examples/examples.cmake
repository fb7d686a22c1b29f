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
mproc_example_test(progress_test progress.c)
# The dataloader's loader.c, with the hogwild sources it uses.
mproc_example_test(augment_test data.c idx.c ../dataloader/loader.c)
if(TARGET augment_test)
  target_include_directories(augment_test PRIVATE ${PROJECT_SOURCE_DIR}/examples/dataloader)
endif()

# Short runs of the example programs themselves (built when examples are).
# dataloader exits non-zero unless every batch arrived and only the ring's
# buffers were copied into shared memory; the failing run must report the
# dead loader's record (and so must not hang: the CTest timeout catches it).
if(TARGET dataloader)
  add_test(NAME dataloader_short COMMAND dataloader --batches 400 --ring 6)
  add_test(NAME dataloader_spawn COMMAND dataloader --batches 200 --no-train --start-method spawn)
  add_test(NAME dataloader_dead_loader COMMAND dataloader --batches 400 --fail-rank 1)
  set_tests_properties(dataloader_dead_loader PROPERTIES
    PASS_REGULAR_EXPRESSION "loader 1 \\(pid [0-9]+, [^)]*\\): exit code -[0-9]+, killed by SIG")
  set_tests_properties(dataloader_short dataloader_spawn dataloader_dead_loader PROPERTIES
    TIMEOUT 60 LABELS examples)
endif()
if(TARGET hogwild)
  add_test(NAME hogwild_short COMMAND hogwild --limit 4000 --epochs 1 --batch 32)
  add_test(NAME hogwild_dead_worker COMMAND hogwild --limit 4000 --epochs 1 --fail-rank 0)
  set_tests_properties(hogwild_dead_worker PROPERTIES
    PASS_REGULAR_EXPRESSION "rank 0 \\(pid [0-9]+, [^)]*\\): exit code -[0-9]+, killed by SIG")
  set_tests_properties(hogwild_short hogwild_dead_worker PROPERTIES TIMEOUT 60 LABELS examples)
endif()
