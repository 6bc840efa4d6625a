# Read by ctest after the discovered GoogleTest list (see jinja_tests.cmake): the parity cases need
# the oracle's output, so they require the JinjaOracle.Setup fixture.
foreach(t IN LISTS dsinfer_tests_TESTS)
  if(t MATCHES "^JinjaParity\\.")
    set_tests_properties("${t}" PROPERTIES FIXTURES_REQUIRED dsi_jinja_oracle)
  endif()
endforeach()
