# Read by ctest after the discovered GoogleTest list (see tokenizer_tests.cmake): the parity cases
# need the oracle's output, so they require the TokenizerOracle.Setup fixture.
foreach(t IN LISTS dsinfer_tests_TESTS)
  if(t MATCHES "^TokenizerParity\\.")
    set_tests_properties("${t}" PROPERTIES FIXTURES_REQUIRED dsi_tokenizer_oracle)
  endif()
endforeach()
