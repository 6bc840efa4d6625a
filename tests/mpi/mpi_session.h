// The MPI test binary's session (created by main in test_mpi_comm.cpp before the tests run).
#pragma once

#include "comm/mpi_comm.h"

namespace dsi::test {
extern MpiSession* g_session;
}  // namespace dsi::test
