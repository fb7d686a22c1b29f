# The optional MPI layer: libmproc_mpi (target mproc_mpi, header
# include/mproc/mpi.h). libmproc never links MPI; programs that use
# mp_mpi_* link mproc_mpi (which brings mproc_static and MPI). Without MPI
# the library is built from src/mpi/stub.c: every call returns MP_ENOTSUP.
#   -DMPROC_MPI=AUTO (default): use MPI when find_package finds it
#   -DMPROC_MPI=ON: fail the configure without MPI; OFF: never use it
set(MPROC_MPI AUTO CACHE STRING "Build the MPI layer: AUTO, ON or OFF")
set_property(CACHE MPROC_MPI PROPERTY STRINGS AUTO ON OFF)
set(MPROC_MPI_FOUND OFF)
set(mproc_mpi_is_mpich OFF)
# Debian installs Open MPI and MPICH side by side, and its `mpi`
# alternatives decide which one plain mpicc and mpirun are. The default here
# is Open MPI whatever they say, so installing MPICH never changes a build:
# FindMPI's own hint MPI_EXECUTABLE_SUFFIX makes it look for mpicc.openmpi.
# Pick MPICH with -DMPI_EXECUTABLE_SUFFIX=.mpich (or -DMPI_C_COMPILER=...).
if(NOT DEFINED MPI_EXECUTABLE_SUFFIX AND NOT MPI_C_COMPILER AND NOT MPI_HOME
   AND NOT DEFINED ENV{MPI_HOME})
  find_program(MPROC_OPENMPI_CC NAMES mpicc.openmpi)
  mark_as_advanced(MPROC_OPENMPI_CC)
  if(MPROC_OPENMPI_CC)
    set(MPI_EXECUTABLE_SUFFIX .openmpi)
  endif()
endif()
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
  set(MPROC_MPI_SOURCES conn.c core.c local.c pool.c pool_array.c pool_iter.c pool_ops.c queue.c
      queue_ahead.c queue_broker.c queue_join.c spawn.c xfer.c)
  list(TRANSFORM MPROC_MPI_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/src/mpi/)
  add_library(mproc_mpi STATIC ${MPROC_MPI_SOURCES})
  target_link_libraries(mproc_mpi PUBLIC mproc_static MPI::MPI_C)
  # The launcher of the same MPI: mpicc.X (alternatives resolved) goes with
  # mpirun.X; another MPI's mpirun cannot start this one's programs.
  # Links are followed one at a time: mpicc -> /etc/alternatives/mpi ->
  # mpicc.openmpi -> opal_wrapper.
  set(mproc_mpi_sfx "")
  set(mproc_mpi_cc "${MPI_C_COMPILER}")
  foreach(i RANGE 8)
    get_filename_component(mproc_mpi_name "${mproc_mpi_cc}" NAME)
    if(mproc_mpi_name MATCHES "^mpicc(\\.[A-Za-z0-9_]+)$")
      set(mproc_mpi_sfx ${CMAKE_MATCH_1})
      break()
    endif()
    if(NOT mproc_mpi_cc OR NOT IS_SYMLINK "${mproc_mpi_cc}")
      break()
    endif()
    get_filename_component(mproc_mpi_dir "${mproc_mpi_cc}" DIRECTORY)
    file(READ_SYMLINK "${mproc_mpi_cc}" mproc_mpi_cc)
    if(NOT IS_ABSOLUTE "${mproc_mpi_cc}")
      set(mproc_mpi_cc "${mproc_mpi_dir}/${mproc_mpi_cc}")
    endif()
  endforeach()
  find_program(MPROC_MPIEXEC NAMES mpirun${mproc_mpi_sfx} mpiexec${mproc_mpi_sfx} mpirun mpiexec
               HINTS ${MPI_C_COMPILER_DIR})
  message(STATUS "mproc: MPI layer on (${MPI_C_LIBRARIES}; launcher ${MPROC_MPIEXEC})")
  if(mproc_mpi_sfx STREQUAL ".mpich" OR MPI_C_HEADER_DIR MATCHES "mpich")
    set(mproc_mpi_is_mpich ON)
  endif()
else()
  add_library(mproc_mpi STATIC ${PROJECT_SOURCE_DIR}/src/mpi/stub.c)
  target_link_libraries(mproc_mpi PUBLIC mproc_static)
  message(STATUS "mproc: MPI layer off (stub: mp_mpi_* return MP_ENOTSUP)")
endif()
# Flags of a build of the layer; MPICH true when it is built against MPICH.
function(mproc_mpi_layer_flags target mpich)
  mproc_use_flags(${target})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${target} PRIVATE _GNU_SOURCE)
  # gcc 12 reads MPICH's MPI_STATUSES_IGNORE, (MPI_Status *)1, passed for
  # a `MPI_Status array_of_statuses[]` parameter as a buffer of size 0.
  if(mpich AND CMAKE_C_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-stringop-overflow)
  endif()
endfunction()
mproc_mpi_layer_flags(mproc_mpi ${mproc_mpi_is_mpich})
install(TARGETS mproc_mpi ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

# The same layer built a second time against MPICH, when the layer above uses
# another MPI and Debian's MPICH (libmpich-dev, mpich) is installed beside it:
# target mproc_mpi_mpich, tested by tests/mpi (the mpich_* tests), so both
# implementations stay working through the standard API. Not installed; a
# program that wants MPICH builds the whole project with
# -DMPI_EXECUTABLE_SUFFIX=.mpich. -DMPROC_MPI_MPICH=OFF skips it, ON requires it.
set(MPROC_MPI_MPICH AUTO CACHE STRING "Also build the MPI layer against MPICH: AUTO, ON or OFF")
set_property(CACHE MPROC_MPI_MPICH PROPERTY STRINGS AUTO ON OFF)
set(MPROC_MPICH_FOUND OFF)
if(MPROC_MPI_FOUND AND NOT MPROC_MPI_MPICH STREQUAL "OFF"
   AND NOT mproc_mpi_is_mpich)
  find_path(MPROC_MPICH_INCLUDE_DIR mpi.h
            PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE}/mpich mpich NO_CMAKE_PATH
            NO_CMAKE_ENVIRONMENT_PATH)
  find_library(MPROC_MPICH_LIBRARY NAMES mpich)
  find_program(MPROC_MPIEXEC_MPICH NAMES mpiexec.mpich)
  mark_as_advanced(MPROC_MPICH_INCLUDE_DIR MPROC_MPICH_LIBRARY MPROC_MPIEXEC_MPICH)
  set(mproc_mpich_hdr "")
  if(MPROC_MPICH_INCLUDE_DIR)
    file(STRINGS ${MPROC_MPICH_INCLUDE_DIR}/mpi.h mproc_mpich_hdr REGEX "define MPICH_VERSION")
  endif()
  if(mproc_mpich_hdr AND MPROC_MPICH_LIBRARY AND MPROC_MPIEXEC_MPICH)
    set(MPROC_MPICH_FOUND ON)
    add_library(mproc_mpi_mpich STATIC ${MPROC_MPI_SOURCES})
    target_include_directories(mproc_mpi_mpich SYSTEM PUBLIC ${MPROC_MPICH_INCLUDE_DIR})
    target_link_libraries(mproc_mpi_mpich PUBLIC mproc_static ${MPROC_MPICH_LIBRARY})
    mproc_mpi_layer_flags(mproc_mpi_mpich ON)
    message(STATUS "mproc: MPI layer also built against MPICH (${MPROC_MPICH_LIBRARY})")
  elseif(MPROC_MPI_MPICH STREQUAL "ON")
    message(FATAL_ERROR "MPROC_MPI_MPICH=ON but MPICH was not found; install it "
                        "(apt-get install libmpich-dev mpich) or set it to AUTO")
  endif()
endif()

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
  # The demo against MPICH too (only the public headers: the same sources).
  if(TARGET hogwild AND MPROC_MPICH_FOUND)
    get_target_property(srcs hogwild SOURCES)
    add_executable(hogwild_mpich ${srcs})
    target_link_libraries(hogwild_mpich PRIVATE mproc_example_common mproc_mpi_mpich)
    mproc_use_flags(hogwild_mpich)
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL mproc_mpi_link_programs)
