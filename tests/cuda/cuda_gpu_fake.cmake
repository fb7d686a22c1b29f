# cuda_gpu_test once more on the fake device (tests/cuda/fake_device.h), so
# its scenarios and helper processes run on machines without a GPU as well.
if(TARGET cuda_gpu_test)
  add_test(NAME cuda_gpu_test_fake COMMAND cuda_gpu_test)
  set_tests_properties(cuda_gpu_test_fake PROPERTIES TIMEOUT 240 LABELS cuda
                       ENVIRONMENT MPROC_TEST_FAKE_CUDA=1)
endif()
