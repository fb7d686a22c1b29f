# examples/cuda_share as a test: on a machine without a GPU (or a build
# without CUDA) it prints "skipped: no CUDA device" and exits 0, which ctest
# then reports as skipped (SKIP_REGULAR_EXPRESSION), not passed.
if(TARGET cuda_share)
  add_test(NAME example_cuda_share COMMAND cuda_share)
  set_tests_properties(example_cuda_share PROPERTIES TIMEOUT 120 LABELS cuda
                       SKIP_REGULAR_EXPRESSION "skipped: no CUDA device")
endif()
