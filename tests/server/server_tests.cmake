# The server's tests (included by tests/CMakeLists.txt): the GoogleTest cases of tests/test_server_*.cpp
# link the server library and the test double of the engine (tests/server/fake_engine.cpp).
target_sources(dsinfer_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/fake_engine.cpp)
target_include_directories(dsinfer_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dsinfer_tests PRIVATE dsinfer_server)

# The server over the test double, as a process: the live API tests run against it (and against
# `dsinfer serve` with the bundled model).
add_executable(dsinfer_fake_server ${CMAKE_CURRENT_LIST_DIR}/fake_server_main.cpp
                                   ${CMAKE_CURRENT_LIST_DIR}/fake_engine.cpp)
target_include_directories(dsinfer_fake_server PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(dsinfer_fake_server PRIVATE dsinfer_server)

# The live API tests: pytest with the official `openai` client and an SSE parser (httpx-sse) from
# PyPI in a venv of the build directory (ServerApi.Setup), then one run per server: the test
# double (ServerApi.FakeEngine) and `dsinfer serve` with the bundled model (ServerApi.KjvModel).
# Each run starts its server on a free loopback port and stops it with SIGTERM.
set(DSI_SERVER_VENV ${CMAKE_CURRENT_BINARY_DIR}/server_api_venv)
add_test(NAME ServerApi.Setup COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/setup_venv.sh ${DSI_SERVER_VENV})
set_tests_properties(ServerApi.Setup PROPERTIES FIXTURES_SETUP dsi_server_venv TIMEOUT 600)
add_test(NAME ServerApi.FakeEngine
         COMMAND ${DSI_SERVER_VENV}/bin/python -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_LIST_DIR}/test_api.py
                 --server-cmd "$<TARGET_FILE:dsinfer_fake_server> --model ${PROJECT_SOURCE_DIR}/models/kjv-dsa --max-model-len 512"
                 --fake-engine)
add_test(NAME ServerApi.KjvModel
         COMMAND ${DSI_SERVER_VENV}/bin/python -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_LIST_DIR}/test_api.py
                 --server-cmd "$<TARGET_FILE:dsinfer> serve --model ${PROJECT_SOURCE_DIR}/models/kjv-dsa --max-model-len 512 --max-num-seqs 8 --kv-cache-memory 64M --tool-call-parser glm")
set_tests_properties(ServerApi.FakeEngine ServerApi.KjvModel PROPERTIES
                     FIXTURES_REQUIRED dsi_server_venv TIMEOUT 900
                     ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1")
# `dsinfer serve` under mpirun, one process per rank (TP 2): the same API tests against rank 0, but
# the constrained-decoding ones (their constraint stays with rank 0, whose steps the other process
# follows as it follows any other request's; they were most of this run's time).
if(DSI_MPI)
  add_test(NAME ServerApi.KjvModelMpi
           COMMAND ${DSI_SERVER_VENV}/bin/python -m pytest -q -p no:cacheprovider -m "not constrained"
                   ${CMAKE_CURRENT_LIST_DIR}/test_api.py --stop-logged-pid
                   --server-cmd "${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DSI_MPIEXEC_FLAGS} $<TARGET_FILE:dsinfer> serve --model ${PROJECT_SOURCE_DIR}/models/kjv-dsa --tp 2 --max-model-len 512 --max-num-seqs 8 --kv-cache-memory 64M --tool-call-parser glm")
  set_tests_properties(ServerApi.KjvModelMpi PROPERTIES FIXTURES_REQUIRED dsi_server_venv TIMEOUT 900
                       ENVIRONMENT "${DSI_MPI_TEST_ENV}")
endif()
