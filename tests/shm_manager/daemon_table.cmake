# The daemon's segment table on its own: table.c is compiled into the
# daemon, not the library, so this test links it (and peers.c) directly.
# Its source is not named *_test.c, which would link the library alone.
if(TARGET mproc_test_support)
  set(shm_manager_dir ${PROJECT_SOURCE_DIR}/tools/shm-manager)
  add_executable(daemon_table_test ${PROJECT_SOURCE_DIR}/tests/shm_manager/daemon_table.c
                 ${shm_manager_dir}/table.c ${shm_manager_dir}/peers.c)
  target_include_directories(daemon_table_test PRIVATE ${shm_manager_dir})
  target_link_libraries(daemon_table_test PRIVATE mproc_test_support mproc_internal
                        ${CMOCKA_LIB} m)
  add_test(NAME daemon_table_test COMMAND daemon_table_test)
  set_tests_properties(daemon_table_test PROPERTIES TIMEOUT 120 LABELS shm_manager
                       RESOURCE_LOCK mproc_dev_shm)
endif()
