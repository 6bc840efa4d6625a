# The tokenizer's parity tests against Hugging Face `tokenizers` (included by tests/CMakeLists.txt
# after gtest_discover_tests). TokenizerOracle.Setup runs run_oracle.sh (a venv with tokenizers
# from PyPI, then oracle.py); every TokenizerParity.* case requires it as a ctest fixture.
set(DSI_TOKENIZER_ORACLE_DIR ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_oracle)
target_compile_definitions(dsinfer_tests PRIVATE
  DSI_TOKENIZER_ORACLE_DIR="${DSI_TOKENIZER_ORACLE_DIR}")
add_test(NAME TokenizerOracle.Setup
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/run_oracle.sh ${DSI_TOKENIZER_ORACLE_DIR})
set_tests_properties(TokenizerOracle.Setup PROPERTIES FIXTURES_SETUP dsi_tokenizer_oracle
                     TIMEOUT 600)
# The GoogleTest cases exist only once ctest has read gtest_discover_tests' list: a test include
# file, read after that list, attaches the fixture to them.
set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES
             ${CMAKE_CURRENT_LIST_DIR}/parity_fixture.cmake)
