# CUDA support (issues 8 and 18). Included by CMakeLists.txt, which has
# collected MPROC_SOURCES (without src/cuda/) and MPROC_LIBS.
#
# MPROC_CUDA: AUTO (default; on when the CUDA toolkit's headers are found),
# ON (the headers are required), OFF. Only the headers are used at build
# time (cuda_runtime_api.h): libmproc is never linked with the CUDA runtime
# or driver. src/cuda/cudart.c dlopen()s libcudart.so.<major> on the first
# CUDA call (major from the headers' CUDART_VERSION; MPROC_CUDART overrides
# the library at run time), so mproc.pc and mprocConfig.cmake carry no CUDA
# dependency and CPU-only programs run where CUDA is absent.
#
# The CPU-side files of src/cuda/ (shared reference counts, pending-free
# list, frame fields, fork guard) are built in every configuration;
# src/cuda/gpu_*.c and cudart.c need the headers, and src/cuda/cuda_stub.c
# stands in for them without, so every public CUDA call then returns
# MP_ENOTSUP saying how to enable it.
set(MPROC_CUDA AUTO CACHE STRING "CUDA support: AUTO, ON or OFF")
set_property(CACHE MPROC_CUDA PROPERTY STRINGS AUTO ON OFF)
if(NOT MPROC_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MPROC_CUDA must be AUTO, ON or OFF, not '${MPROC_CUDA}'")
endif()

set(MPROC_CUDA_ENABLED OFF)
if(NOT MPROC_CUDA STREQUAL "OFF")
  # FindCUDAToolkit only tells where the toolkit is (nvcc on PATH,
  # CUDAToolkit_ROOT, /usr/local/cuda); nothing links its targets.
  find_package(CUDAToolkit QUIET)
  find_path(MPROC_CUDA_INCLUDE_DIR cuda_runtime_api.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include ENV CUDA_HOME ENV CUDA_PATH
    PATH_SUFFIXES include
    PATHS /usr/local/cuda/include)
  if(MPROC_CUDA_INCLUDE_DIR)
    set(MPROC_CUDA_ENABLED ON)
  elseif(MPROC_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MPROC_CUDA=ON but cuda_runtime_api.h was not found: install the CUDA "
                        "toolkit (its headers) or pass -DMPROC_CUDA_INCLUDE_DIR=<dir>")
  endif()
endif()

# Every file of src/cuda/, listed (no globs).
set(mproc_cuda_sources cuda_stub.c cudart.c device.c event_files.c frame.c
    gpu_core.c gpu_ipc.c gpu_msg.c gpu_share.c gpu_tensor.c guard.c pending.c refseg.c)
list(TRANSFORM mproc_cuda_sources PREPEND ${PROJECT_SOURCE_DIR}/src/cuda/)
# The files that need the CUDA headers; cuda_stub.c replaces them without.
set(mproc_cuda_runtime_regex "/(gpu_[^/]*|cudart)\\.c$")
# The library's sources as a build without CUDA has them (the stub instead of
# gpu_*.c), for targets compiled outside CMake's toolchain setup, such as the
# libFuzzer build in tests/fuzz/fuzz.cmake.
set(mproc_cuda_host ${mproc_cuda_sources})
list(FILTER mproc_cuda_host EXCLUDE REGEX "${mproc_cuda_runtime_regex}")
set(MPROC_HOST_SOURCES ${MPROC_SOURCES} ${mproc_cuda_host})
if(MPROC_CUDA_ENABLED)
  list(FILTER mproc_cuda_sources EXCLUDE REGEX "/cuda_stub\\.c$")
  # The headers only (and for the tests' fake runtime, which includes them).
  include_directories(${MPROC_CUDA_INCLUDE_DIR})
  # Seen by every target that links mproc (tests, examples, bench), so they
  # can tell a CUDA build from a stub build at compile time.
  add_compile_definitions(MPROC_HAVE_CUDA=1)
  file(STRINGS ${MPROC_CUDA_INCLUDE_DIR}/cuda_runtime_api.h mproc_cudart_line
       REGEX "^#define CUDART_VERSION +[0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" mproc_cudart_version "${mproc_cudart_line}")
  math(EXPR MPROC_CUDART_MAJOR "${mproc_cudart_version} / 1000")
  message(STATUS "mproc: CUDA support ON (headers in ${MPROC_CUDA_INCLUDE_DIR}; "
                 "libcudart.so.${MPROC_CUDART_MAJOR} is loaded at run time, not linked)")
else()
  list(FILTER mproc_cuda_sources EXCLUDE REGEX "${mproc_cuda_runtime_regex}")
  message(STATUS "mproc: CUDA support OFF (install the CUDA toolkit's headers, or "
                 "-DMPROC_CUDA=ON to require them)")
endif()
list(APPEND MPROC_SOURCES ${mproc_cuda_sources})
