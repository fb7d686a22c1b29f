# bench_cuda --quick as a smoke test: on the fake CUDA runtime in CUDA builds
# (it must exit 0 and print its four JSON lines), and without CUDA headers
# (a note, exit 0 and no JSON line: bench_all's "skipped"). The shell keeps the exit status, which
# PASS_REGULAR_EXPRESSION would ignore (a leak report at exit, say).
if(TARGET bench_cuda)
  if(MPROC_CUDA_ENABLED)
    set(check "out=$(\"$0\" --quick) && echo \"$out\"")
    foreach(op cuda_handoff_first cuda_handoff_repeat cuda_handoff_repeat_raw
               cuda_handoff_repeat_busy)
      string(APPEND check " && echo \"$out\" | grep -q '\"op\":\"${op}\"'")
    endforeach()
    add_test(NAME bench_cuda_smoke COMMAND sh -c "${check}" $<TARGET_FILE:bench_cuda>)
    set_tests_properties(bench_cuda_smoke PROPERTIES ENVIRONMENT MPROC_BENCH_FAKE_CUDA=1)
  else()
    # Without CUDA it measures nothing: ctest reports that as skipped.
    add_test(NAME bench_cuda_smoke COMMAND bench_cuda --quick)
    set_tests_properties(bench_cuda_smoke PROPERTIES
                         SKIP_REGULAR_EXPRESSION "nothing measured|without CUDA")
  endif()
  set_tests_properties(bench_cuda_smoke PROPERTIES TIMEOUT 120 LABELS cuda)
endif()
