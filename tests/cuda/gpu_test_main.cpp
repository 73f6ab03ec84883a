// main() of the GPU tests: --kla_path=NAME pins the chunkwise path (path_pin.hpp),
// --kla_mutant=NAME activates a planted kernel fault (mutant_flag.hpp), then GoogleTest.
#include <gtest/gtest.h>

#include "mutant_flag.hpp"
#include "path_pin.hpp"

int main(int argc, char** argv) {
  kla::test::parse_path_flag(argc, argv);
  kla::test::parse_mutant_flag(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
