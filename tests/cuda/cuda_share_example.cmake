# examples/cuda_share as a test: on a machine without a GPU (or a build
# without CUDA) it prints "skipped: no CUDA device (why)" and exits 77, which
# CTest reports as skipped.
if(TARGET cuda_share)
  add_test(NAME example_cuda_share COMMAND cuda_share)
  set_tests_properties(example_cuda_share PROPERTIES TIMEOUT 120 LABELS cuda
                       SKIP_RETURN_CODE 77)
endif()
