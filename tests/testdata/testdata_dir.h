// Where a test finds the test models: $MOESHARD_TESTDATA when set, else the folder the build
// assembled them in (MOESHARD_TESTDATA_DIR, from add_gtest). A missing model is the test's
// failure, never a skip: the models live in the repository (tests/testdata/README.md).
#pragma once

#include <cstdlib>
#include <string>

namespace moeshard::test {

inline std::string TestDataDir() {
  const char* dir = std::getenv("MOESHARD_TESTDATA");
  if (dir != nullptr && *dir != '\0') return dir;
#ifdef MOESHARD_TESTDATA_DIR
  return MOESHARD_TESTDATA_DIR;
#else
  return "";
#endif
}

}  // namespace moeshard::test
