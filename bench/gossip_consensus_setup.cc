#include "bench/gossip_consensus_setup.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradcomp::bench {
namespace {

constexpr int kSide = 28;  // Fashion-MNIST images are 28 x 28
constexpr int kTile = 2;   // a kTile x kTile tile of images per rank
static_assert(kRows == kSide * kTile && kCols == kSide * kTile);

uint32_t BigEndian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

absl::StatusOr<std::vector<std::vector<float>>> FashionMnist(int workers) {
  gzFile file = gzopen(kFashionMnistImages, "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "Fashion-MNIST images not found at ", kFashionMnistImages,
        ": expected the Debian package dataset-fashion-mnist (tools/setup "
        "installs it)"));
  }
  const int images = workers * kTile * kTile;
  std::vector<unsigned char> bytes(16 + images * kSide * kSide);
  const int got = gzread(file, bytes.data(), bytes.size());
  gzclose(file);
  if (got != static_cast<int>(bytes.size()) ||
      BigEndian(bytes.data()) != 0x803 ||
      BigEndian(bytes.data() + 4) < static_cast<uint32_t>(images) ||
      BigEndian(bytes.data() + 8) != kSide ||
      BigEndian(bytes.data() + 12) != kSide) {
    return absl::DataLossError(absl::StrCat(
        kFashionMnistImages, " is not an IDX file of at least ", images, " ",
        kSide, " x ", kSide, " images (read ", got, " bytes)"));
  }
  std::vector<std::vector<float>> xs(workers, std::vector<float>(kN));
  for (int r = 0; r < workers; ++r) {
    for (int t = 0; t < kTile * kTile; ++t) {
      const unsigned char* image =
          bytes.data() + 16 + (r * kTile * kTile + t) * kSide * kSide;
      const int row0 = (t / kTile) * kSide, col0 = (t % kTile) * kSide;
      for (int i = 0; i < kSide; ++i) {
        for (int j = 0; j < kSide; ++j) {
          xs[r][(row0 + i) * kCols + col0 + j] = image[i * kSide + j] / 255.0f;
        }
      }
    }
  }
  return xs;
}

// bench/gossip_weights.py's file: "GCWT", int32 W, rows, cols
// (little-endian, as on every machine this runs on), W x rows x cols fp32.
absl::StatusOr<std::vector<std::vector<float>>> Weights(const std::string& path,
                                                        int workers) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "trained weights not found at ", path,
        ": write them with `/usr/bin/python3 bench/gossip_weights.py ", path,
        workers == kW ? "" : absl::StrCat(" --workers=", workers), "`"));
  }
  char magic[4];
  int32_t dims[3];
  in.read(magic, sizeof(magic));
  in.read(reinterpret_cast<char*>(dims), sizeof(dims));
  if (!in || std::memcmp(magic, "GCWT", 4) != 0 || dims[0] != workers ||
      dims[1] != kRows || dims[2] != kCols) {
    return absl::DataLossError(absl::StrCat(
        path, " is not bench/gossip_weights.py's file of ", workers, " ", kRows,
        " x ", kCols, " matrices (header ",
        in ? absl::StrCat(dims[0], " x ", dims[1], " x ", dims[2])
           : "truncated",
        "): write it again with `/usr/bin/python3 bench/gossip_weights.py ",
        path, workers == kW ? "" : absl::StrCat(" --workers=", workers), "`"));
  }
  std::vector<std::vector<float>> xs(workers, std::vector<float>(kN));
  for (auto& x : xs) {
    in.read(reinterpret_cast<char*>(x.data()), kN * sizeof(float));
  }
  if (!in || in.peek() != std::ifstream::traits_type::eof()) {
    return absl::DataLossError(absl::StrCat(
        path, ": expected exactly ", workers * kN,
        " floats after the header: write it again with `/usr/bin/python3 "
        "bench/gossip_weights.py ",
        path, "`"));
  }
  return xs;
}

}  // namespace

std::string DataName(Data data) {
  switch (data) {
    case Data::kRandom:
      return "random";
    case Data::kFashionMnist:
      return "fashion-mnist";
    case Data::kWeights:
      return "weights";
  }
  return "";
}

absl::StatusOr<Data> ParseData(const std::string& name) {
  for (Data data : kData) {
    if (DataName(data) == name) return data;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "data '", name, "': expected random, fashion-mnist or weights"));
}

absl::StatusOr<std::vector<std::vector<float>>> Start(
    Data data, const std::string& weights_file, int workers) {
  switch (data) {
    case Data::kFashionMnist:
      return FashionMnist(workers);
    case Data::kWeights:
      return Weights(weights_file, workers);
    case Data::kRandom:
      break;
  }
  return StartRandom(kRows, kCols, 1, workers);
}

std::vector<std::vector<float>> StartRandom(int rows, int cols, uint32_t seed,
                                            int workers) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> xs(
      workers, std::vector<float>(static_cast<size_t>(rows) * cols));
  for (auto& x : xs) {
    for (float& v : x) v = normal(rng);
  }
  return xs;
}

std::vector<Method> Methods(int rows, int cols) {
  using Kind = Method::Kind;
  // Exact gossip at diffusion 1 (the mixing matrix itself) stays beside
  // the tuned one: the grid has no 1, and the rule tunes for 1e-4 only.
  std::vector<Method> methods = {{Kind::kExact, "exact", 0, 0, false},
                                 {Kind::kExact, "exact-tuned"}};
  for (bool tuned : {false, true}) {
    for (int rank : {1, 2}) {
      methods.push_back(
          {Kind::kPowerGossip,
           absl::StrCat("powergossip-r", rank, tuned ? "-tuned" : ""), rank, 0,
           tuned});
    }
  }
  for (int rank : {4, 8}) {
    methods.push_back({Kind::kPowerGossip,
                       absl::StrCat("powergossip-r", rank, "-tuned"), rank});
  }
  const int entries = rows * cols;
  for (int k : {(rows + cols) / 4, (rows + cols) / 2,
                static_cast<int>(std::ceil(0.05 * entries))}) {
    methods.push_back({Kind::kChoco, absl::StrCat("choco-k", k), 0, k});
  }
  return methods;
}

std::vector<Method> AllMethods(int rows, int cols) {
  std::vector<Method> methods = Methods(rows, cols);
  for (int rank : {1, 2}) {
    Method cold = {Method::Kind::kPowerGossip,
                   absl::StrCat("powergossip-r", rank, "-cold-tuned"), rank};
    cold.warm_start = false;
    methods.push_back(cold);
  }
  return methods;
}

}  // namespace gradcomp::bench
