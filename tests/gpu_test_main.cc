// The main() of the tests labelled `gpu`: runs every test, then exits 77 (ctest's
// SKIP_RETURN_CODE, set by add_gtest) when no CUDA device was there to run the GPU cases, or
// when any case skipped itself (a multi-GPU case on a one-GPU machine), so that ctest reports
// SKIPPED instead of a pass that no GPU earned.
#include <cuda_runtime.h>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  int n = 0;
  if (rc == 0 && (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)) return 77;
  if (rc == 0 && ::testing::UnitTest::GetInstance()->skipped_test_count() > 0) return 77;
  return rc;
}
