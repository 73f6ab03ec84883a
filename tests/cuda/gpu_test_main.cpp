// main() of the GPU tests: --kla_path=NAME pins the chunkwise path (path_pin.hpp), then GoogleTest.
#include <gtest/gtest.h>

#include "path_pin.hpp"

int main(int argc, char** argv) {
  kla::test::parse_path_flag(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
