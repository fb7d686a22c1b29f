# examples/tensor_share.c runs as a test: it exits 0 only when the parent
# sees its forked child's writes under both sharing strategies.
if(TARGET tensor_share)
  add_test(NAME example_tensor_share COMMAND tensor_share)
  set_tests_properties(example_tensor_share PROPERTIES TIMEOUT 60 LABELS tensor)
endif()
