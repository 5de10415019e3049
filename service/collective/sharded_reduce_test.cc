#include "service/collective/sharded_reduce.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/builtin.h"
#include "codecs/cpu/momentum.h"
#include "codecs/error_feedback.h"
#include "codecs/params.h"
#include "codecs/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/in_process_group.h"
#include "service/collective/slice.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<codecs::Codec> Make(
    const std::string& name, std::map<std::string, std::string> params = {}) {
  auto codec =
      codecs::BuiltinCodecs().Create(name, codecs::CodecParams(params));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return *std::move(codec);
}

// W daemons in one process: collectives over an InProcessHub, and each
// rank's StateStore.
class Group : public InProcessGroup {
 public:
  explicit Group(int world_size, absl::Duration timeout = absl::Seconds(60))
      : InProcessGroup(world_size, timeout), stores_(world_size) {}
  codecs::StateStore& store(int rank) { return stores_[rank]; }

 private:
  std::vector<codecs::StateStore> stores_;
};

codecs::StepContext Context(const std::string& tensor, int64_t step, int rank,
                            int world_size) {
  codecs::StepContext ctx;
  ctx.seed = 11;
  ctx.tensor_id = codecs::TensorId(tensor);
  ctx.step = step;
  ctx.rank = rank;
  ctx.world_size = world_size;
  return ctx;
}

std::vector<float> Gradient(int rank, int tensor, int64_t step, size_t n) {
  std::mt19937 rng(rank * 100003 + tensor * 1009 + static_cast<int>(step));
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  return g;
}

using Outputs = std::vector<absl::StatusOr<std::vector<float>>>;

// Each rank reduces every tensor of `step` at once, started in a random
// order of its own; grads[t][r] is rank r's gradient of tensor t. Sharded
// when `sharded`, else by allgather and the codec's FinishGather. With
// `parts`, (*parts)[t][r] gets rank r's slice payloads of tensor t (sharded).
std::vector<Outputs> Reduce(
    Group& group, const codecs::Codec& codec, const std::string& prefix,
    int64_t step, const std::vector<std::vector<std::vector<float>>>& grads,
    bool sharded,
    std::vector<std::vector<std::vector<codecs::Bytes>>>* parts = nullptr) {
  const int w = group.world_size();
  const int tensors = static_cast<int>(grads.size());
  if (parts != nullptr) {
    parts->assign(tensors, std::vector<std::vector<codecs::Bytes>>(w));
  }
  const auto& single = dynamic_cast<const codecs::SingleRoundCodec&>(codec);
  std::vector<Outputs> out(tensors, Outputs(w, absl::UnknownError("not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    std::vector<int> order(tensors);
    for (int t = 0; t < tensors; ++t) order[t] = t;
    std::shuffle(order.begin(), order.end(), std::mt19937(r + 31 * step));
    for (int t : order) {
      threads.emplace_back([&, r, t] {
        const std::string tensor = absl::StrCat(prefix, t);
        const std::vector<float>& g = grads[t][r];
        const int64_t shape[] = {static_cast<int64_t>(g.size())};
        codecs::StateStore::Locked state =
            group.store(r).Acquire("job", tensor, shape, 1);
        const codecs::StepContext ctx = Context(tensor, step, r, w);
        std::vector<float> avg(g.size());
        const RoundKey key{"job", tensor, step, 0};
        absl::Status status;
        if (sharded) {
          status = ShardedReduce(group.collective(r), group.store(r), single,
                                 key, g, ctx, absl::MakeSpan(avg),
                                 parts == nullptr ? nullptr : &(*parts)[t][r])
                       .status();
        } else {
          codecs::Bytes payload;
          status = single.Encode({g, shape}, *state, ctx, &payload);
          absl::StatusOr<codecs::RoundResult> got =
              status.ok() ? group.collective(r).Run(
                                key, {codecs::Collective::kGather, payload})
                          : status;
          status = got.ok() ? single.FinishGather(got->payloads, ctx,
                                                  absl::MakeSpan(avg))
                            : got.status();
        }
        out[t][r] =
            status.ok() ? absl::StatusOr<std::vector<float>>(avg) : status;
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
  return out;
}

std::vector<float> Mean(const std::vector<std::vector<float>>& by_rank) {
  std::vector<float> mean(by_rank[0].size(), 0.0f);
  for (const auto& g : by_rank) {
    for (size_t i = 0; i < g.size(); ++i) mean[i] += g[i];
  }
  for (float& m : mean) m /= by_rank.size();
  return mean;
}

double SquaredDistance(absl::Span<const float> a, absl::Span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d += (double{a[i]} - b[i]) * (a[i] - b[i]);
  return d;
}

double SquaredNorm(absl::Span<const float> a) {
  double s = 0;
  for (float v : a) s += double{v} * v;
  return s;
}

TEST(ShardedStateNamesTest, EachEntryHasItsTensorAsOwner) {
  EXPECT_EQ(StateOwner(SliceStateName("fc.weight", 3)), "fc.weight");
  EXPECT_EQ(StateOwner(SliceStateName("a#b", 12)), "a#b");
  EXPECT_EQ(StateOwner(OwnerStateName("fc.weight")), "fc.weight");
  for (const char* own : {"fc.weight", "x#slice", "x#slicea", "x#slice1a"}) {
    EXPECT_EQ(StateOwner(own), own);
  }
}

TEST(ShardableCodecTest, OnlyShardableGatherCodecsAndAutoByWorldAndSize) {
  auto topk = Make("topk", {{"ratio", "0.01"}, {"momentum", "0"}});
  auto topk_momentum = Make("topk", {{"ratio", "0.01"}});
  auto qsgd = Make("qsgd");
  const uint64_t big = kAutoMinNumel;
  EXPECT_NE(ShardableCodec(Aggregation::kSharded, *topk, 2, 100), nullptr);
  EXPECT_NE(ShardableCodec(Aggregation::kSharded, *qsgd, 4, 4), nullptr);
  EXPECT_NE(ShardableCodec(Aggregation::kSharded, *Make("efsign"), 4, 9),
            nullptr);
  // A momentum correction would run twice (at the owner too).
  EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *topk_momentum, 4, big),
            nullptr);
  // Matrix codecs, summable codecs.
  EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *Make("atomo"), 4, big),
            nullptr);
  EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *Make("onebit"), 4, big),
            nullptr);
  EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *Make("none"), 4, big),
            nullptr);
  EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *Make("powersgd"), 4, big),
            nullptr);
  // One rank, or fewer elements than ranks.
  EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *qsgd, 1, big), nullptr);
  EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *qsgd, 4, 3), nullptr);
  EXPECT_EQ(ShardableCodec(Aggregation::kAllgather, *qsgd, 4, big), nullptr);
  // auto: by world size and tensor size.
  EXPECT_EQ(
      ShardableCodec(Aggregation::kAuto, *qsgd, kAutoMinWorldSize - 1, big),
      nullptr);
  EXPECT_EQ(
      ShardableCodec(Aggregation::kAuto, *qsgd, kAutoMinWorldSize, big - 1),
      nullptr);
  EXPECT_NE(ShardableCodec(Aggregation::kAuto, *qsgd, kAutoMinWorldSize, big),
            nullptr);
}

// QSGD's expected squared error for one quantisation of `v`, bucket by
// bucket from its start (d values, s levels): a value at level y = |x| s /
// ||bucket|| rounds up with probability p = y - floor(y), which costs
// (||bucket|| / s)^2 p (1 - p) in expectation.
double QsgdExpectedError(absl::Span<const float> v, size_t d, double s) {
  double total = 0;
  for (size_t begin = 0; begin < v.size(); begin += d) {
    const absl::Span<const float> bucket = v.subspan(begin, d);
    const double norm = std::sqrt(SquaredNorm(bucket));
    if (norm == 0) continue;
    for (float x : bucket) {
      const double y = std::fabs(x) * s / norm;
      const double p = y - std::floor(y);
      total += (norm / s) * (norm / s) * p * (1 - p);
    }
  }
  return total;
}

// QSGD, sharded and by allgather. Allgather's error is W independent
// quantisations of the whole tensors averaged, E = sum_r E_r / W^2. Sharded
// quantises each rank's slices, which the owner averages to a (its error
// from the mean, E = sum over ranks and slices / W^2), then re-quantises a
// slice by slice: E ||out - a||^2 given a. Each measured error must be
// within 10 % of its expectation (20000 values: about 1 % spread), which
// catches an owner that quantises coarser or twice, or a worker that
// skips its own quantisation. Results are bit-identical on every rank.
TEST(ShardedReduceTest, QsgdIsBitIdenticalOnEveryRankWithItsExpectedError) {
  constexpr int kW = 4, kTensors = 6;
  constexpr size_t kBucket = 512;
  constexpr double kLevels = 7;  // 4 bits
  Group group(kW);
  auto codec = Make("qsgd", {{"bits", "4"}, {"bucket", "512"}});
  const auto& single = dynamic_cast<const codecs::SingleRoundCodec&>(*codec);
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<std::vector<std::vector<float>>> grads(kTensors);
    for (int t = 0; t < kTensors; ++t) {
      // Sizes not divisible by W.
      for (int r = 0; r < kW; ++r)
        grads[t].push_back(Gradient(r, t, step, 20001 + 7 * t));
    }
    std::vector<std::vector<std::vector<codecs::Bytes>>> parts;
    const std::vector<Outputs> sharded =
        Reduce(group, *codec, "s", step, grads, true, &parts);
    const std::vector<Outputs> gathered =
        Reduce(group, *codec, "a", step, grads, false);
    for (int t = 0; t < kTensors; ++t) {
      for (int r = 0; r < kW; ++r) {
        ASSERT_TRUE(sharded[t][r].ok()) << sharded[t][r].status();
        ASSERT_TRUE(gathered[t][r].ok()) << gathered[t][r].status();
        EXPECT_TRUE(*sharded[t][r] == *sharded[t][0])
            << "tensor " << t << ": rank " << r << " differs from rank 0";
        EXPECT_TRUE(*gathered[t][r] == *gathered[t][0]);
      }
      const size_t n = grads[t][0].size();
      const std::vector<float> mean = Mean(grads[t]);
      double gather_expected = 0, worker_expected = 0;
      // a: what the owners averaged, from every rank's slice payloads.
      std::vector<std::vector<float>> decoded(kW, std::vector<float>(n));
      for (int r = 0; r < kW; ++r) {
        gather_expected += QsgdExpectedError(grads[t][r], kBucket, kLevels);
        for (int j = 0; j < kW; ++j) {
          const Slice slice = SliceOf(n, kW, j);
          worker_expected += QsgdExpectedError(
              absl::MakeConstSpan(grads[t][r]).subspan(slice.begin, slice.size),
              kBucket, kLevels);
        }
        ASSERT_TRUE(
            DecodeSlices(single, parts[t][r], absl::MakeSpan(decoded[r])).ok());
      }
      gather_expected /= kW * kW;
      worker_expected /= kW * kW;
      const std::vector<float> average = Mean(decoded);
      double owner_expected = 0;
      for (int j = 0; j < kW; ++j) {
        const Slice slice = SliceOf(n, kW, j);
        owner_expected += QsgdExpectedError(
            absl::MakeConstSpan(average).subspan(slice.begin, slice.size),
            kBucket, kLevels);
      }
      const double gather_err = SquaredDistance(*gathered[t][0], mean);
      const double worker_err = SquaredDistance(average, mean);
      const double owner_err = SquaredDistance(*sharded[t][0], average);
      EXPECT_NEAR(gather_err / gather_expected, 1.0, 0.1) << "tensor " << t;
      EXPECT_NEAR(worker_err / worker_expected, 1.0, 0.1) << "tensor " << t;
      EXPECT_NEAR(owner_err / owner_expected, 1.0, 0.1) << "tensor " << t;
    }
  }
}

// Top-k with error feedback has no per-step bound; what it guarantees is
// that nothing is lost: the sum of the outputs over the steps plus what the
// residuals still hold equals the sum of the true means. Sharded keeps two
// residuals, each worker's (its slices of "dgc.v") and each owner's; both
// must be in that sum, and allgather's identity holds beside it.
TEST(ShardedReduceTest, TopKLosesNothingOutsideTheWorkerAndOwnerResiduals) {
  constexpr int kW = 4, kSteps = 8;
  constexpr size_t kN = 30011;
  Group group(kW);
  auto codec = Make("topk", {{"ratio", "0.01"}, {"momentum", "0"}});
  std::vector<double> mean_sum(kN, 0), shard_sum(kN, 0), gather_sum(kN, 0);
  for (int64_t step = 0; step < kSteps; ++step) {
    std::vector<std::vector<std::vector<float>>> grads(1);
    for (int r = 0; r < kW; ++r) grads[0].push_back(Gradient(r, 0, step, kN));
    const std::vector<float> mean = Mean(grads[0]);
    const std::vector<Outputs> sharded =
        Reduce(group, *codec, "s", step, grads, true);
    const std::vector<Outputs> gathered =
        Reduce(group, *codec, "a", step, grads, false);
    for (int r = 0; r < kW; ++r) {
      ASSERT_TRUE(sharded[0][r].ok()) << sharded[0][r].status();
      ASSERT_TRUE(gathered[0][r].ok()) << gathered[0][r].status();
      ASSERT_TRUE(*sharded[0][r] == *sharded[0][0]) << "rank " << r;
    }
    for (size_t i = 0; i < kN; ++i) {
      mean_sum[i] += mean[i];
      shard_sum[i] += (*sharded[0][0])[i];
      gather_sum[i] += (*gathered[0][0])[i];
    }
  }
  const std::string velocity = codecs::MomentumCorrection::kVelocityBuffer;
  std::vector<double> shard_held(kN, 0), gather_held(kN, 0);
  // The velocity (DGC's accumulator; with momentum 0 the residual) of the
  // state named `name`, `size` values.
  auto residual = [&](int rank, const std::string& name, size_t size) {
    const int64_t shape[] = {static_cast<int64_t>(size)};
    auto state =
        group.store(rank).Acquire("job", name, shape, name == "a0" ? 1 : 0);
    std::optional<absl::Span<float>> found = state->Find(velocity);
    EXPECT_TRUE(found.has_value()) << name;
    return found.has_value() ? std::vector<float>(found->begin(), found->end())
                             : std::vector<float>(size);
  };
  for (int r = 0; r < kW; ++r) {
    const std::vector<float> gather_residual = residual(r, "a0", kN);
    for (size_t i = 0; i < kN; ++i) gather_held[i] += gather_residual[i] / kW;
    for (int j = 0; j < kW; ++j) {
      const size_t begin = kN * j / kW, size = kN * (j + 1) / kW - begin;
      const std::vector<float> worker =
          residual(r, SliceStateName("s0", j), size);
      for (size_t i = 0; i < size; ++i) shard_held[begin + i] += worker[i] / kW;
      if (j == r) {
        const std::vector<float> owner =
            residual(r, OwnerStateName("s0"), size);
        for (size_t i = 0; i < size; ++i) shard_held[begin + i] += owner[i];
      }
    }
  }
  double scale = 0, shard_gap = 0, gather_gap = 0, owner_mass = 0;
  for (size_t i = 0; i < kN; ++i) {
    scale = std::max(scale, std::fabs(mean_sum[i]));
    shard_gap = std::max(shard_gap,
                         std::fabs(shard_sum[i] + shard_held[i] - mean_sum[i]));
    gather_gap = std::max(
        gather_gap, std::fabs(gather_sum[i] + gather_held[i] - mean_sum[i]));
    owner_mass = std::max(owner_mass, std::fabs(shard_sum[i] - gather_sum[i]));
  }
  // fp32 accumulations over 8 steps and 4 ranks.
  EXPECT_LE(shard_gap, 1e-5 * scale);
  EXPECT_LE(gather_gap, 1e-5 * scale);
  EXPECT_GT(owner_mass, 1e-3 * scale) << "sharded equals allgather";
}

// signSGD's vote is ternary (a tie of an even W is 0), which its one-bit
// payload cannot carry back from an owner: it is never sharded. efsign,
// which averages decodes, is.
// A change of codec starts the slices' and the owner's state empty, as it
// does a tensor's own: efsign's residuals, left in them, were sent by the
// threshold codec that came next (both keep an error-feedback residual).
TEST(ShardedReduceTest, AnotherCodecStartsFromEmptySliceAndOwnerState) {
  constexpr int kW = 2;
  constexpr size_t kN = 4096;
  Group group(kW);
  auto efsign = Make("efsign");
  auto threshold = Make("threshold", {{"tau", "0.001"}});
  std::vector<std::vector<std::vector<float>>> grads(1);
  for (int r = 0; r < kW; ++r) grads[0].push_back(Gradient(r, 0, 0, kN));
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<Outputs> out =
        Reduce(group, *efsign, "t", step, grads, true);
    for (int r = 0; r < kW; ++r)
      ASSERT_TRUE(out[0][r].ok()) << out[0][r].status();
  }
  std::vector<std::vector<std::vector<float>>> zeros(
      1, std::vector<std::vector<float>>(kW, std::vector<float>(kN, 0.0f)));
  const std::vector<Outputs> out =
      Reduce(group, *threshold, "t", 3, zeros, true);
  for (int r = 0; r < kW; ++r) {
    ASSERT_TRUE(out[0][r].ok()) << out[0][r].status();
    EXPECT_EQ(*out[0][r], zeros[0][r]) << "rank " << r;
  }
}

TEST(ShardedReduceTest, SignSgdIsNeverShardedEfSignIs) {
  auto signsgd = Make("signsgd");
  auto efsign = Make("efsign");
  for (int w : {3, 4, 8}) {
    EXPECT_EQ(ShardableCodec(Aggregation::kSharded, *signsgd, w, 1 << 22),
              nullptr)
        << w;
    EXPECT_NE(ShardableCodec(Aggregation::kSharded, *efsign, w, 1 << 22),
              nullptr)
        << w;
  }
}

// A sign codec that votes, sharded (the owner's path, called directly):
// with W = 3 (no ties) every output sign is the majority of the inputs'.
TEST(ShardedReduceTest, SignSgdOutputsTheMajorityVote) {
  constexpr int kW = 3;
  constexpr size_t kN = 5000;
  Group group(kW);
  auto codec = Make("signsgd");
  std::vector<std::vector<std::vector<float>>> grads(1);
  for (int r = 0; r < kW; ++r) grads[0].push_back(Gradient(r, 0, 0, kN));
  const std::vector<Outputs> out = Reduce(group, *codec, "v", 0, grads, true);
  for (int r = 0; r < kW; ++r) {
    ASSERT_TRUE(out[0][r].ok()) << out[0][r].status();
    ASSERT_TRUE(*out[0][r] == *out[0][0]);
  }
  for (size_t i = 0; i < kN; ++i) {
    int votes = 0;
    for (int r = 0; r < kW; ++r) votes += grads[0][r][i] >= 0 ? 1 : -1;
    EXPECT_EQ((*out[0][0])[i] > 0, votes > 0) << i;
    EXPECT_NE((*out[0][0])[i], 0.0f) << i;
  }
}

TEST(ShardedReduceTest, AMissingRankFailsTheOthersNamingIt) {
  constexpr int kW = 4;
  Group group(kW, absl::Milliseconds(300));
  auto codec = Make("qsgd");
  const auto& single = dynamic_cast<const codecs::SingleRoundCodec&>(*codec);
  std::vector<absl::Status> status(kW - 1);
  std::vector<std::thread> threads;
  // Rank 3 never calls.
  for (int r = 0; r < kW - 1; ++r) {
    threads.emplace_back([&, r] {
      const std::vector<float> g = Gradient(r, 0, 0, 1000);
      std::vector<float> out(g.size());
      status[r] = ShardedReduce(group.collective(r), group.store(r), single,
                                {"job", "x", 0, 0}, g, Context("x", 0, r, kW),
                                absl::MakeSpan(out), nullptr)
                      .status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kW - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded)
        << status[r];
    EXPECT_THAT(status[r].message(), HasSubstr("rank 3"));
  }
}

// A sharded step of a stateful codec that fails after this rank encoded
// gives every state back, as a session does: its slices' (the exchange of
// parts failed) and, once it re-encoded its own slice, the owner's (the
// allgather failed, or the memory budget refused the re-encode's copy).
// Otherwise the residuals would have lost what the failed step took from
// them.
TEST(ShardedReduceTest, AFailedStepLeavesTheStatesAsTheyWere) {
  constexpr int kW = 2;
  constexpr size_t kN = 1000;
  auto codec = Make("efsign");
  const auto& single = dynamic_cast<const codecs::SingleRoundCodec&>(*codec);
  // Rank 0's states of tensor "x0" (Reduce names it): its two slices', then its
  // owner's.
  const auto states = [&](Group& group) {
    std::vector<std::vector<float>> held;
    for (int j = 0; j <= kW; ++j) {
      const int slice = j < kW ? j : 0;
      const size_t begin = kN * slice / kW;
      const int64_t shape[] = {
          static_cast<int64_t>(kN * (slice + 1) / kW - begin)};
      auto state = group.store(0).Acquire(
          "job", j < kW ? SliceStateName("x0", j) : OwnerStateName("x0"), shape,
          0);
      std::optional<absl::Span<float>> residual =
          state->Find(codecs::kErrorFeedbackBuffer);
      EXPECT_TRUE(residual.has_value()) << j;
      held.emplace_back(residual.has_value() ? residual->begin() : nullptr,
                        residual.has_value() ? residual->end() : nullptr);
    }
    return held;
  };
  struct Case {
    const char* what_failed;
    bool peer_sends_parts;
    bool owner_copy_refused;
  };
  for (const Case& c :
       {Case{"exchange", false, false}, Case{"allgather", true, false},
        Case{"owner's copy", true, true}}) {
    // Long enough for a loaded machine's step 0 and for the peer thread's
    // parts; the failing cases wait it out once.
    Group group(kW, absl::Seconds(3));
    std::vector<std::vector<std::vector<float>>> grads(1);
    for (int r = 0; r < kW; ++r) grads[0].push_back(Gradient(r, 0, 0, kN));
    Reduce(group, *codec, "x", 0, grads, true);
    const std::vector<std::vector<float>> before = states(group);
    // Step 1: rank 1 sends its parts and then leaves, or never comes.
    std::thread peer([&] {
      if (!c.peer_sends_parts) return;
      const std::vector<float> g = Gradient(1, 0, 1, kN);
      std::vector<codecs::Bytes> parts(kW);
      codecs::TensorState scratch;
      for (int j = 0; j < kW; ++j) {
        const size_t begin = kN * j / kW, size = kN * (j + 1) / kW - begin;
        const int64_t shape[] = {static_cast<int64_t>(size)};
        ASSERT_TRUE(single
                        .Encode({absl::MakeSpan(g).subspan(begin, size), shape},
                                scratch, Context("x0", 1, 1, kW), &parts[j])
                        .ok());
      }
      (void)group.collective(1).AllToAll({"job", "x0", 1, 0}, std::move(parts));
    });
    const std::vector<float> g = Gradient(0, 0, 1, kN);
    std::vector<float> out(kN);
    // The slices' copies are kept; the owner's, asked for second, only
    // while the budget is not full.
    int asked = 0;
    const KeepCopies keep = [&](uint64_t) {
      return ++asked == 2 && c.owner_copy_refused
                 ? absl::ResourceExhaustedError("the memory budget is full")
                 : absl::OkStatus();
    };
    const absl::Status failed =
        ShardedReduce(group.collective(0), group.store(0), single,
                      {"job", "x0", 1, 0}, g, Context("x0", 1, 0, kW),
                      absl::MakeSpan(out), nullptr, keep)
            .status();
    peer.join();
    if (c.owner_copy_refused) {
      EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
      EXPECT_THAT(std::string(failed.message()),
                  HasSubstr("slice 0 (owner re-encode): the memory budget"));
    } else {
      // Rank 1 is missing from the collective that failed.
      EXPECT_EQ(failed.code(), absl::StatusCode::kDeadlineExceeded) << failed;
    }
    const std::vector<std::vector<float>> after = states(group);
    for (int j = 0; j <= kW; ++j) {
      ASSERT_EQ(after[j].size(), before[j].size());
      for (size_t i = 0; i < before[j].size(); ++i) {
        ASSERT_NEAR(after[j][i], before[j][i], 1e-7)
            << c.what_failed << " failed; " << (j < kW ? "slice " : "owner ")
            << j << " [" << i << "]";
      }
    }
  }
}

// The engine's view: a session whose first NextRound runs the reduce.
TEST(ShardedSessionTest, RunsTheReduceThenFinishesAndDecodesItsOwn) {
  constexpr int kW = 2;
  constexpr size_t kN = 4097;
  Group group(kW);
  auto codec = Make("int8");
  const auto& single = dynamic_cast<const codecs::SingleRoundCodec&>(*codec);
  std::vector<std::vector<float>> grads(kW), out(kW), own(kW);
  std::vector<absl::Status> status(kW);
  std::vector<uint64_t> wire(kW);
  std::vector<std::thread> threads;
  for (int r = 0; r < kW; ++r) {
    grads[r] = Gradient(r, 0, 0, kN);
    threads.emplace_back([&, r] {
      ShardedSession session(group.collective(r), group.store(r), single,
                             {"job", "x", 0, 0}, grads[r],
                             Context("x", 0, r, kW));
      out[r].resize(kN);
      own[r].resize(kN);
      absl::StatusOr<std::optional<codecs::Round>> round = session.NextRound();
      status[r] = round.status();
      if (status[r].ok() && round->has_value()) {
        status[r] = absl::InternalError("a sharded session yielded a round");
      }
      if (status[r].ok()) status[r] = session.Finish(absl::MakeSpan(out[r]));
      if (status[r].ok()) status[r] = session.DecodeOwn(absl::MakeSpan(own[r]));
      wire[r] = session.stats().wire_bytes;
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<float> mean = Mean(grads);
  for (int r = 0; r < kW; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_TRUE(out[r] == out[0]);
    // int8 rounds each bucket to 255 levels of its max: close, not equal,
    // once for own, twice for the average.
    EXPECT_LT(SquaredDistance(own[r], grads[r]), 1e-3 * SquaredNorm(grads[r]));
    EXPECT_GT(SquaredDistance(own[r], grads[r]), 0);
    EXPECT_LT(SquaredDistance(out[r], mean), 1e-3 * SquaredNorm(mean));
    // Two slices of ~kN/2 bytes, then the owner's slice again.
    EXPECT_GT(wire[r], kN * 3 / 2);
    EXPECT_LT(wire[r], kN * 2);
  }
}

}  // namespace
}  // namespace gradcomp::service
