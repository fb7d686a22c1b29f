# cuda_gpu_test once more on the fake CUDA runtime (tests/cuda/fake_cudart.c,
# loaded through MPROC_CUDART), so its scenarios and helper processes run on
# machines without a GPU as well. Only CUDA builds have a runtime to fake.
if(TARGET cuda_gpu_test AND MPROC_CUDA_ENABLED)
  add_test(NAME cuda_gpu_test_fake COMMAND cuda_gpu_test)
  set_tests_properties(cuda_gpu_test_fake PROPERTIES TIMEOUT 240 LABELS cuda
                       ENVIRONMENT MPROC_TEST_FAKE_CUDA=1)
endif()
