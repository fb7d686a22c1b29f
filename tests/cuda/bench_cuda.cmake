# bench_cuda --quick as a smoke test: on the fake device in CUDA builds (its
# two JSON lines must appear), plain (a note, exit 0) without CUDA.
if(TARGET bench_cuda)
  add_test(NAME bench_cuda_smoke COMMAND bench_cuda --quick)
  set_tests_properties(bench_cuda_smoke PROPERTIES TIMEOUT 120 LABELS cuda)
  if(MPROC_CUDA_ENABLED)
    set_tests_properties(bench_cuda_smoke PROPERTIES ENVIRONMENT MPROC_BENCH_FAKE_CUDA=1
      PASS_REGULAR_EXPRESSION "\"op\":\"cuda_handoff_first\".*\"op\":\"cuda_handoff_repeat\"")
  endif()
endif()
