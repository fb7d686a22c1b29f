# CUDA support (issue 8). Included by CMakeLists.txt, which has collected
# MPROC_SOURCES (without src/cuda/) and MPROC_LIBS.
#
# MPROC_CUDA: AUTO (default; on when the CUDA toolkit is found), ON (the
# toolkit is required), OFF. The CPU-side files of src/cuda/ (shared
# reference counts, pending-free list, frame fields, fork guard) are built in
# every configuration; src/cuda/gpu_*.c need the toolkit, and
# src/cuda/cuda_stub.c stands in for them when CUDA is off, so every public
# CUDA call then returns MP_ENOTSUP saying how to enable it.
set(MPROC_CUDA AUTO CACHE STRING "CUDA support: AUTO, ON or OFF")
set_property(CACHE MPROC_CUDA PROPERTY STRINGS AUTO ON OFF)

set(MPROC_CUDA_ENABLED OFF)
if(MPROC_CUDA STREQUAL "ON")
  find_package(CUDAToolkit REQUIRED)
  set(MPROC_CUDA_ENABLED ON)
elseif(MPROC_CUDA STREQUAL "AUTO")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(MPROC_CUDA_ENABLED ON)
  endif()
elseif(NOT MPROC_CUDA STREQUAL "OFF")
  message(FATAL_ERROR "MPROC_CUDA must be AUTO, ON or OFF, not '${MPROC_CUDA}'")
endif()

file(GLOB mproc_cuda_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/cuda/*.c)
# The library's sources as a build without CUDA has them (the stub instead of
# gpu_*.c), for targets compiled outside CMake's toolchain setup, such as the
# libFuzzer build in tests/fuzz/fuzz.cmake.
set(mproc_cuda_host ${mproc_cuda_sources})
list(FILTER mproc_cuda_host EXCLUDE REGEX "/gpu_[^/]*\\.c$")
set(MPROC_HOST_SOURCES ${MPROC_SOURCES} ${mproc_cuda_host})
if(MPROC_CUDA_ENABLED)
  list(FILTER mproc_cuda_sources EXCLUDE REGEX "/cuda_stub\\.c$")
  list(APPEND MPROC_LIBS CUDA::cudart)
  # The object library is built before MPROC_LIBS is linked anywhere, so it
  # needs the toolkit's headers directly.
  include_directories(${CUDAToolkit_INCLUDE_DIRS})
  # For mproc.pc (cmake/install.cmake): static links need the runtime too.
  set(MPROC_PC_EXTRA_LIBS " ${CUDA_cudart_LIBRARY}")
  # Seen by every target that links mproc (tests, examples, bench), so they
  # can tell a CUDA build from a stub build at compile time.
  add_compile_definitions(MPROC_HAVE_CUDA=1)
  message(STATUS "mproc: CUDA support ON (toolkit ${CUDAToolkit_VERSION})")
else()
  set(MPROC_PC_EXTRA_LIBS "")
  list(FILTER mproc_cuda_sources EXCLUDE REGEX "/gpu_[^/]*\\.c$")
  message(STATUS "mproc: CUDA support OFF (rebuild with -DMPROC_CUDA=ON and the CUDA toolkit)")
endif()
list(APPEND MPROC_SOURCES ${mproc_cuda_sources})
