# The Jinja engine's parity tests against Python jinja2 (included by tests/CMakeLists.txt after
# gtest_discover_tests). JinjaOracle.Setup runs run_oracle.sh (a venv with the pinned jinja2, then
# oracle.py); every JinjaParity.* case requires it as a ctest fixture.
set(DSI_JINJA_ORACLE_DIR ${CMAKE_CURRENT_BINARY_DIR}/jinja_oracle)
target_compile_definitions(dsinfer_tests PRIVATE DSI_JINJA_ORACLE_DIR="${DSI_JINJA_ORACLE_DIR}")
add_test(NAME JinjaOracle.Setup
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_oracle.sh ${DSI_JINJA_ORACLE_DIR})
set_tests_properties(JinjaOracle.Setup PROPERTIES FIXTURES_SETUP dsi_jinja_oracle TIMEOUT 600)
# The GoogleTest cases exist only once ctest has read gtest_discover_tests' list: a test include
# file, read after that list, attaches the fixture to them.
set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_CURRENT_LIST_DIR}/parity_fixture.cmake)
