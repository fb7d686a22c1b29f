# The programs: the CLI `mproc` (installed in bindir) and the daemon
# `mproc-shm-manager` (installed in libexecdir/mproc, where the library looks
# for it). Explicit source lists; the targets get a _tool suffix because
# `mproc` is the library's target. Both link libmproc.a and its internals.
set(MPROC_CLI_SOURCES doctor.c main.c manager.c shm.c)
set(MPROC_DAEMON_SOURCES loop.c main.c peers.c ring.c table.c)
list(TRANSFORM MPROC_CLI_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/mproc/)
list(TRANSFORM MPROC_DAEMON_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/shm-manager/)

add_executable(mproc_tool ${MPROC_CLI_SOURCES})
add_executable(mproc-shm-manager_tool ${MPROC_DAEMON_SOURCES})
set_target_properties(mproc_tool PROPERTIES OUTPUT_NAME mproc)
set_target_properties(mproc-shm-manager_tool PROPERTIES OUTPUT_NAME mproc-shm-manager)
foreach(exe mproc_tool mproc-shm-manager_tool)
  target_link_libraries(${exe} PRIVATE mproc_internal)
  mproc_use_flags(${exe})
endforeach()
install(TARGETS mproc_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
install(TARGETS mproc-shm-manager_tool RUNTIME DESTINATION ${MPROC_DAEMON_DIR} COMPONENT lib)
