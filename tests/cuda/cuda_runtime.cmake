# The CUDA runtime loaded at run time (issue 18; src/cuda/cudart.c):
#  - mproc_fake_cudart: the fake CUDA runtime (tests/cuda/fake_cudart.c), a
#    shared library that the CUDA tests and bench_cuda load through mproc's
#    own loader (MPROC_CUDART, set by tests/cuda/fake_device.h from the path
#    compiled in as MP_FAKE_CUDART);
#  - cuda_no_link_deps: readelf/nm of the built and installed library (and
#    of a program), and the installed mproc.pc / CMake package: no CUDA;
#  - cuda_hidden_runtime: a CPU-only program and a CUDA call with every
#    libcudart/libcuda file hidden in a mount namespace (skipped, 77, where
#    unshare -m is not permitted);
#  - exit code 77 means "skipped" for the GPU-only programs.
set(mproc_cuda_tests_dir ${CMAKE_CURRENT_LIST_DIR})

if(MPROC_CUDA_ENABLED)
  add_library(mproc_fake_cudart SHARED ${mproc_cuda_tests_dir}/fake_cudart.c)
  set_target_properties(mproc_fake_cudart PROPERTIES OUTPUT_NAME mproc_fake_cudart)
  foreach(t cuda_fake_test cuda_process_test cuda_gpu_test cuda_loader_test bench_cuda)
    if(TARGET ${t})
      target_compile_definitions(${t} PRIVATE
        MP_FAKE_CUDART="$<TARGET_FILE:mproc_fake_cudart>")
      add_dependencies(${t} mproc_fake_cudart)
    endif()
  endforeach()
  set(mproc_cuda_missing "libcudart.so.${MPROC_CUDART_MAJOR}")
else()
  set(mproc_cuda_missing "-DMPROC_CUDA=ON")
endif()

foreach(t cuda_loader_test cuda_gpu_test)
  if(TARGET ${t})
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endforeach()

add_executable(cuda_probe ${mproc_cuda_tests_dir}/cuda_probe.c)
target_link_libraries(cuda_probe PRIVATE mproc)
mproc_use_flags(cuda_probe)   # the sanitizers too: ASan must come first

add_test(NAME cuda_no_link_deps
         COMMAND sh ${mproc_cuda_tests_dir}/no_cuda_deps.sh $<TARGET_FILE:mproc>
                 $<TARGET_FILE:mproc_static> ${CMAKE_BINARY_DIR} $<TARGET_FILE:cuda_probe>)
set_tests_properties(cuda_no_link_deps PROPERTIES TIMEOUT 120 LABELS cuda)

set(mproc_cpu_programs)
if(TARGET tensor_share)
  list(APPEND mproc_cpu_programs $<TARGET_FILE:tensor_share>)
endif()
add_test(NAME cuda_hidden_runtime
         COMMAND sh ${mproc_cuda_tests_dir}/hidden_cudart.sh $<TARGET_FILE:cuda_probe>
                 ${mproc_cuda_missing} ${mproc_cpu_programs})
set_tests_properties(cuda_hidden_runtime PROPERTIES TIMEOUT 120 LABELS cuda
                     SKIP_RETURN_CODE 77)
