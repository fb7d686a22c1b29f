# The example tests link the examples' shared library (examples/common/) and
# compile the program-specific sources they test, so they test the code the
# examples run.
if(TARGET hogwild_test)
  set(hogwild_dir ${PROJECT_SOURCE_DIR}/examples/hogwild)
  set(dataloader_dir ${PROJECT_SOURCE_DIR}/examples/dataloader)
  foreach(test augment_test hogwild_test idx_test mlp_test progress_test)
    target_link_libraries(${test} PRIVATE mproc_example_common)
  endforeach()
  target_sources(hogwild_test PRIVATE ${hogwild_dir}/train.c ${hogwild_dir}/worker.c)
  target_include_directories(hogwild_test PRIVATE ${hogwild_dir})
  target_sources(augment_test PRIVATE ${dataloader_dir}/loader.c)
  target_include_directories(augment_test PRIVATE ${dataloader_dir})
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
