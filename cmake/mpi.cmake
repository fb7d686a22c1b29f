# The optional MPI layer: libmproc_mpi (target mproc_mpi, header
# include/mproc/mpi.h). libmproc never links MPI; programs that use
# mp_mpi_* link mproc_mpi (which brings mproc_static and MPI). Without MPI
# the library is built from src/mpi/stub.c: every call returns MP_ENOTSUP.
#   -DMPROC_MPI=AUTO (default): use MPI when find_package finds it
#   -DMPROC_MPI=ON: fail the configure without MPI; OFF: never use it
set(MPROC_MPI AUTO CACHE STRING "Build the MPI layer: AUTO, ON or OFF")
set_property(CACHE MPROC_MPI PROPERTY STRINGS AUTO ON OFF)
set(MPROC_MPI_FOUND OFF)
if(NOT MPROC_MPI STREQUAL "OFF")
  if(MPROC_MPI STREQUAL "ON")
    find_package(MPI REQUIRED COMPONENTS C)
  else()
    find_package(MPI QUIET COMPONENTS C)
  endif()
  if(MPI_C_FOUND)
    set(MPROC_MPI_FOUND ON)
  endif()
endif()

if(MPROC_MPI_FOUND)
  set(MPROC_MPI_SOURCES conn.c core.c local.c pool.c pool_array.c pool_iter.c queue.c queue_join.c spawn.c
      xfer.c)
  list(TRANSFORM MPROC_MPI_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/src/mpi/)
  add_library(mproc_mpi STATIC ${MPROC_MPI_SOURCES})
  target_link_libraries(mproc_mpi PUBLIC mproc_static MPI::MPI_C)
  find_program(MPROC_MPIEXEC NAMES mpirun mpiexec HINTS ${MPI_C_COMPILER_DIR})
  message(STATUS "mproc: MPI layer on (${MPI_C_LIBRARIES})")
else()
  add_library(mproc_mpi STATIC ${PROJECT_SOURCE_DIR}/src/mpi/stub.c)
  target_link_libraries(mproc_mpi PUBLIC mproc_static)
  message(STATUS "mproc: MPI layer off (stub: mp_mpi_* return MP_ENOTSUP)")
endif()
mproc_use_flags(mproc_mpi)
target_include_directories(mproc_mpi PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_definitions(mproc_mpi PRIVATE _GNU_SOURCE)
install(TARGETS mproc_mpi ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

# Programs that use the layer: the hogwild demo (--backend mpi) and
# bench_mpi. Deferred to the end of the top-level file, where they exist.
function(mproc_mpi_link_programs)
  foreach(t hogwild bench_mpi)
    if(TARGET ${t})
      target_link_libraries(${t} PRIVATE mproc_mpi)
    endif()
  endforeach()
  if(TARGET bench_mpi AND MPROC_MPI_FOUND)
    target_compile_definitions(bench_mpi PRIVATE MPROC_HAVE_MPI)
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL mproc_mpi_link_programs)
