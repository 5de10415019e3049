// Replays the seed corpus of request_fuzzer under the normal build, so that
// every seed (and every crash input added to the corpus) stays a test. The
// seeds are valid requests, so each must parse and reach its handler.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/api/fuzz/request_checker.h"

namespace gradcomp::service {
namespace {

TEST(RequestCorpusTest, EverySeedReachesItsHandlerAndGetsAStatus) {
  const std::filesystem::path dir = "service/api/fuzz/corpus/request";
  int seeds = 0;
  std::vector<int> codes;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    const int code = RequestChecker::Get().Check(
        reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    EXPECT_GE(code, 0) << entry.path() << " does not parse";
    codes.push_back(code);
    ++seeds;
  }
  EXPECT_GE(seeds, 6);
  // The seeds include requests that are served, not only refusals.
  EXPECT_NE(std::count(codes.begin(), codes.end(), 0), 0);
}

TEST(RequestCorpusTest, ARegionOutsideThePrefixIsRefused) {
  v1::RegisterSystemSharedMemoryRequest request;
  request.set_name("outside");
  request.set_shm_key("/not-gradcomp");
  request.set_byte_size(8);
  std::string bytes(1,
                    static_cast<char>(FuzzedRpc::kRegisterSystemSharedMemory));
  bytes += request.SerializeAsString();
  EXPECT_EQ(RequestChecker::Get().Check(
                reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
            static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
}

}  // namespace
}  // namespace gradcomp::service
