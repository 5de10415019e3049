// The engine's limits (docs/daemon.md, "Limits"): a request over a limit
// fails cleanly with RESOURCE_EXHAUSTED and a message with the figures,
// is counted, leaks nothing, and the next request is served; jobs with
// the same tensor names keep separate codec state.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/in_process_group.h"
#include "service/collective/local_collective.h"
#include "service/engine/engine.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::string Floats(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = scale * (std::sin(0.37f * static_cast<float>(i)) + 0.01f);
  }
  std::string out(n * sizeof(float), '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

class EngineLimitsTest : public ::testing::Test {
 protected:
  void Build(const EngineOptions& options) {
    auto engine = Engine::Create(options, codecs::BuiltinCodecs(), &store_,
                                 &collective_, &metrics_, Policy());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // An n x n fp32 reduce of `data` for `job`.
  ReduceInput Square(const std::string& data, int64_t n,
                     const std::string& job = "job",
                     const std::string& tensor = "w") {
    ReduceInput in;
    in.job = job;
    in.tensor = tensor;
    in.dtype = DType::kFloat32;
    in.shape = {n, n};
    in.data = data;
    return in;
  }

  double Metric(absl::string_view name,
                const std::map<std::string, std::string>& labels = {}) {
    return MetricValue(*metrics_.collectable(), name, labels);
  }
  double Exhausted(const std::string& resource) {
    return Metric("gradcomp_resource_exhausted_total",
                  {{"resource", resource}});
  }
  double InUse() { return Metric("gradcomp_memory_budget_in_use_bytes"); }

  codecs::StateStore store_;
  Metrics metrics_{&store_, "test"};
  LocalCollective collective_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineLimitsTest, TensorOverMaxBytesFailsAndTheNextIsServed) {
  EngineOptions options;
  options.max_tensor_bytes = 4096;
  Build(options);
  const std::string big = Floats(64 * 64, 1);
  auto refused = engine_->Reduce(Square(big, 64));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("over max_tensor_bytes 4096"));
  EXPECT_EQ(Exhausted("tensor_bytes"), 1);
  const std::string small = Floats(32 * 32, 1);
  auto served = engine_->Reduce(Square(small, 32));
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->data, small);
  // A zero dimension after a huge one holds nothing: not over the limit.
  ReduceInput empty = Square("", 0, "job", "empty");
  empty.shape = {int64_t{1} << 40, 0};
  auto nothing = engine_->Reduce(empty);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_TRUE(nothing->data.empty());
}

TEST_F(EngineLimitsTest, ReduceLargerThanTheBudgetFailsAtOnceWithFigures) {
  EngineOptions options;
  options.memory_budget_bytes = 100 << 10;
  Build(options);
  // 128 x 128 fp32: payload + average + response = 3 x 64 KiB, and the
  // error sample (every reduce by default here) 2 x 64 KiB more, > 100 KiB.
  const std::string big = Floats(128 * 128, 1);
  auto refused = engine_->Reduce(Square(big, 128));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("tensor 'w' step 0: memory budget: this reduce needs "
                        "327680 bytes, more than the whole budget of 102400 "
                        "bytes"));
  EXPECT_EQ(Exhausted("memory"), 1);
  EXPECT_EQ(Metric("gradcomp_reduce_total",
                   {{"codec", "unresolved"}, {"code", "RESOURCE_EXHAUSTED"}}),
            1);
  EXPECT_EQ(InUse(), 0);
  const std::string small = Floats(64 * 64, 1);
  auto served = engine_->Reduce(Square(small, 64));
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->data, small);
  EXPECT_EQ(InUse(), 0);  // dense: no state, everything given back
}

TEST_F(EngineLimitsTest, FullBudgetWaitsBoundedThenFailsAndRecovers) {
  EngineOptions options;
  options.memory_budget_bytes = 100 << 10;
  options.memory_wait = absl::Milliseconds(20);
  Build(options);
  auto held = engine_->ReserveInput(80 << 10, "another request");
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string data = Floats(64 * 64, 1);  // needs 5 x 16 KiB
  auto refused = engine_->Reduce(Square(data, 64));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("this reduce needs 81920 bytes, but 81920 of the "
                        "budget's 102400 bytes are in use (0 by codec state) "
                        "and none came free within 20ms"));
  EXPECT_EQ(InUse(), 80 << 10);  // the refusal holds nothing
  held->Release();
  auto served = engine_->Reduce(Square(data, 64));
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(InUse(), 0);
}

TEST_F(EngineLimitsTest, CallersReservationGrowsByTheWorkingMemory) {
  EngineOptions options;
  options.memory_budget_bytes = 1 << 20;
  options.error_sample_rate = 0.5;  // the first reduce is sampled, not the 2nd
  Build(options);
  const std::string data = Floats(64 * 64, 1);
  auto held = engine_->ReserveInput(data.size(), "its input");
  ASSERT_TRUE(held.ok());
  ReduceInput in = Square(data, 64);
  in.reservation = &*held;
  ASSERT_TRUE(engine_->Reduce(in).ok());
  // Input, payload, average and response, and the error sample's payload
  // copy and decode: the caller releases it all.
  EXPECT_EQ(held->bytes(), 6 * data.size());
  EXPECT_EQ(InUse(), 6 * data.size());
  held->Release();
  EXPECT_EQ(InUse(), 0);

  // Not sampled, into an fp32 output one byte off alignment: input,
  // payload, average and the output's fp32 scratch (no response data).
  std::string output(data.size() + 1, '\0');
  held = engine_->ReserveInput(data.size(), "its input");
  ASSERT_TRUE(held.ok());
  in.step = 1;
  in.output = absl::MakeSpan(output.data() + 1, data.size());
  in.reservation = &*held;
  ASSERT_TRUE(engine_->Reduce(in).ok());
  EXPECT_EQ(held->bytes(), 4 * data.size());
  EXPECT_EQ(output.substr(1), data);
  held->Release();
}

TEST_F(EngineLimitsTest, AStatefulCodecsUndoCopyCountsWithItsPayload) {
  // Top-k keeps a copy of its payload to give its state back should the
  // step fail: the reservation grows by the payload's size once encoded.
  // Not sampled: with a sample the session keeps the copy for the sample.
  EngineOptions options;
  options.memory_budget_bytes = 1 << 20;
  options.error_sample_rate = 0;
  Build(options);
  const std::string data = Floats(64 * 64, 1);
  ReduceInput in = Square(data, 64);
  in.codec = CodecSpec{"topk", {{"ratio", "0.25"}}};
  auto held = engine_->ReserveInput(data.size(), "its input");
  ASSERT_TRUE(held.ok());
  in.reservation = &*held;
  absl::StatusOr<ReduceOutput> out = engine_->Reduce(in);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_GT(out->stats.wire_bytes, 0u);
  // Input, payload, average and response, and the copy.
  EXPECT_EQ(held->bytes(), 4 * data.size() + out->stats.wire_bytes);
  held->Release();

  // QSGD keeps no state, so no copy.
  held = engine_->ReserveInput(data.size(), "its input");
  ASSERT_TRUE(held.ok());
  in.codec = CodecSpec{"qsgd", {}};
  in.tensor = "v";
  in.reservation = &*held;
  ASSERT_TRUE(engine_->Reduce(in).ok());
  EXPECT_EQ(held->bytes(), 4 * data.size());
  held->Release();
}

TEST_F(EngineLimitsTest, CodecStateCountsAgainstTheBudget) {
  Build(EngineOptions());
  const std::string data = Floats(64 * 64, 1);
  ReduceInput in = Square(data, 64);
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  ASSERT_TRUE(engine_->Reduce(in).ok());
  const double state = Metric("gradcomp_state_bytes");
  EXPECT_GE(state, 64 * 64 * 4);  // at least the residual
  EXPECT_EQ(InUse(), state);
  in.step = 1;
  ASSERT_TRUE(engine_->Reduce(in).ok());
  EXPECT_EQ(InUse(), Metric("gradcomp_state_bytes"));
}

// One engine per rank of `group`, each with its own store and metrics.
struct RankEngines {
  std::vector<std::unique_ptr<codecs::StateStore>> stores;
  std::vector<std::unique_ptr<Metrics>> metrics;
  std::vector<std::unique_ptr<Engine>> engines;
};
RankEngines MakeRankEngines(InProcessGroup& group, int world,
                            const EngineOptions& options,
                            const Policy& policy) {
  RankEngines ranks;
  for (int r = 0; r < world; ++r) {
    ranks.stores.push_back(std::make_unique<codecs::StateStore>());
    ranks.metrics.push_back(
        std::make_unique<Metrics>(ranks.stores.back().get(), "test"));
    auto engine = Engine::Create(
        options, codecs::BuiltinCodecs(), ranks.stores.back().get(),
        &group.collective(r), ranks.metrics.back().get(), policy);
    EXPECT_TRUE(engine.ok()) << engine.status();
    ranks.engines.push_back(engine.ok() ? std::move(*engine) : nullptr);
  }
  return ranks;
}

// Sharded aggregation keeps top-k's residuals in per-slice entries of the
// state store; they count against the budget like the tensor's own state.
TEST(EngineShardedLimitsTest, ShardedStateCountsAgainstTheBudget) {
  constexpr int kWorld = 2;
  InProcessGroup group(kWorld);
  Policy policy;
  policy.aggregation = Aggregation::kSharded;
  RankEngines ranks = MakeRankEngines(group, kWorld, EngineOptions(), policy);
  std::vector<std::unique_ptr<Metrics>>& metrics = ranks.metrics;
  std::vector<std::unique_ptr<Engine>>& engines = ranks.engines;
  ASSERT_TRUE(engines[0] && engines[1]);
  const std::string data = Floats(64 * 64, 1);
  // Step `step` of 'w' on every rank at once.
  const auto reduce_on_every_rank = [&](int64_t step) {
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        ReduceInput in;
        in.job = "job";
        in.tensor = "w";
        in.step = step;
        in.dtype = DType::kFloat32;
        in.shape = {64, 64};
        in.data = data;
        // Momentum correction is not shardable (topk.cc).
        in.codec = CodecSpec{"topk", {{"ratio", "0.01"}, {"momentum", "0"}}};
        absl::StatusOr<ReduceOutput> out = engines[r]->Reduce(in);
        ASSERT_TRUE(out.ok()) << out.status();
      });
    }
    for (std::thread& t : threads) t.join();
  };
  reduce_on_every_rank(0);
  for (int r = 0; r < kWorld; ++r) {
    const double state =
        MetricValue(*metrics[r]->collectable(), "gradcomp_state_bytes", {});
    EXPECT_GE(state, 64 * 64 * 4 / kWorld) << "rank " << r;
    EXPECT_EQ(MetricValue(*metrics[r]->collectable(),
                          "gradcomp_memory_budget_in_use_bytes", {}),
              state)
        << "rank " << r;
  }

  // Resumed on one rank (a smaller job): the slice entries, which one rank
  // never uses, are left out of the import rather than held uncounted.
  {
    absl::StatusOr<std::string> blob = engines[0]->ExportState("job");
    ASSERT_TRUE(blob.ok()) << blob.status();
    ASSERT_THAT(*blob, HasSubstr("w#slice1"));
    codecs::StateStore store;
    Metrics single_metrics(&store, "test");
    LocalCollective local;
    auto single = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(),
                                 &store, &local, &single_metrics, policy);
    ASSERT_TRUE(single.ok()) << single.status();
    ASSERT_TRUE((*single)->ImportState("job", *blob).ok());
    absl::StatusOr<std::string> kept = (*single)->ExportState("job");
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_THAT(*kept, ::testing::Not(HasSubstr("#slice")));
    EXPECT_THAT(*kept, ::testing::Not(HasSubstr("#shard")));
    EXPECT_EQ(
        MetricValue(*single_metrics.collectable(),
                    "gradcomp_memory_budget_in_use_bytes", {}),
        MetricValue(*single_metrics.collectable(), "gradcomp_state_bytes", {}));
  }

  // Exported and imported back (a checkpoint): the slice entries belong to
  // 'w', so the next step's record of 'w' does not count them again.
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<std::string> blob = engines[r]->ExportState("job");
    ASSERT_TRUE(blob.ok()) << blob.status();
    ASSERT_TRUE(engines[r]->ImportState("job", *blob).ok());
  }
  reduce_on_every_rank(1);
  // Switched to allgather: the tensor gets residuals of its own, and the
  // slice entries, which stay in the store, stay in the count.
  for (int r = 0; r < kWorld; ++r) {
    Policy allgather = policy;
    allgather.aggregation = Aggregation::kAllgather;
    ASSERT_TRUE(engines[r]->SetPolicy(allgather).ok());
  }
  reduce_on_every_rank(2);
  // A blob of the tensor's own state alone (as an allgather job exports
  // it), imported over this one: the slice entries it does not replace
  // stay in the store, and in the count. Before, the import's count was
  // the blob's alone, the slices' bytes held uncounted until the next
  // reduce of 'w'.
  {
    codecs::StateStore scratch;
    scratch.Acquire("x", "w", {64, 64}, static_cast<int>(DType::kFloat32))
        ->Buffer("ef.residual", 64 * 64);
    absl::StatusOr<std::string> own = scratch.Export("x");
    ASSERT_TRUE(own.ok()) << own.status();
    ASSERT_TRUE(engines[0]->ImportState("job", *own).ok());
    absl::StatusOr<std::string> now = engines[0]->ExportState("job");
    ASSERT_TRUE(now.ok()) << now.status();
    ASSERT_THAT(*now, HasSubstr("w#slice1"));
    EXPECT_EQ(
        MetricValue(*metrics[0]->collectable(),
                    "gradcomp_memory_budget_in_use_bytes", {}),
        MetricValue(*metrics[0]->collectable(), "gradcomp_state_bytes", {}));
  }
  for (int r = 0; r < kWorld; ++r) {
    const double state =
        MetricValue(*metrics[r]->collectable(), "gradcomp_state_bytes", {});
    EXPECT_EQ(MetricValue(*metrics[r]->collectable(),
                          "gradcomp_memory_budget_in_use_bytes", {}),
              state)
        << "rank " << r;
    absl::StatusOr<ReleasedJob> released = engines[r]->ReleaseJob("job");
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_EQ(released->tensors, 1u) << "rank " << r;
    EXPECT_EQ(released->state_bytes, state) << "rank " << r;
  }
}

// A sharded step of a stateful codec keeps a copy of each slice payload it
// sends (and of its owner's re-encode) to give the state back should the
// step fail: the reservation grows by them, as the allgather path's does by
// its payload, and a budget that cannot hold them refuses the step.
TEST(EngineShardedLimitsTest, SliceUndoCopiesCountWithTheirPayloads) {
  constexpr int kWorld = 2;
  InProcessGroup group(kWorld);
  Policy policy;
  policy.aggregation = Aggregation::kSharded;
  EngineOptions options;
  options.error_sample_rate = 0;
  options.memory_wait = absl::ZeroDuration();  // refused at once
  const std::string data = Floats(64 * 64, 1);
  for (const uint64_t budget : {uint64_t{1} << 20, uint64_t{72} << 10}) {
    SCOPED_TRACE(budget);
    options.memory_budget_bytes = budget;
    RankEngines ranks = MakeRankEngines(group, kWorld, options, policy);
    std::vector<std::unique_ptr<Engine>>& engines = ranks.engines;
    ASSERT_TRUE(engines[0] && engines[1]);
    std::vector<absl::StatusOr<ReduceOutput>> outs(
        kWorld, absl::UnknownError("not run"));
    std::vector<uint64_t> reserved(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        auto held = engines[r]->ReserveInput(data.size(), "its input");
        ASSERT_TRUE(held.ok()) << held.status();
        ReduceInput in;
        in.job = "job";
        in.tensor = absl::StrCat("w", budget);
        in.dtype = DType::kFloat32;
        in.shape = {64, 64};
        in.data = data;
        in.codec = CodecSpec{"topk", {{"ratio", "1"}, {"momentum", "0"}}};
        in.reservation = &*held;
        outs[r] = engines[r]->Reduce(in);
        reserved[r] = held->bytes();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
      if (budget == uint64_t{1} << 20) {
        ASSERT_TRUE(outs[r].ok()) << outs[r].status();
        EXPECT_EQ(outs[r]->stats.codec, "topk");
        // Input, payload, average and response, and the copies: as many
        // bytes as the slices and the re-encode sent.
        EXPECT_EQ(reserved[r], 4 * data.size() + outs[r]->stats.wire_bytes)
            << "rank " << r;
      } else {
        // 64 KiB of working memory; the copies (top-k at ratio 1: twice
        // the tensor's 16 KiB in values and indices) do not fit beside it.
        EXPECT_EQ(outs[r].status().code(), absl::StatusCode::kResourceExhausted)
            << "rank " << r << ": " << outs[r].status();
        EXPECT_THAT(outs[r].status().message(),
                    HasSubstr("this reduce's copies of its slice payloads"));
      }
    }
  }
}

TEST_F(EngineLimitsTest, TensorQuotaRefusesNewNamesOfThatJobOnly) {
  EngineOptions options;
  options.quotas.max_tensors_per_job = 1;
  Build(options);
  const std::string data = Floats(16 * 16, 1);
  ASSERT_TRUE(engine_->Reduce(Square(data, 16, "a", "w")).ok());
  auto refused = engine_->Reduce(Square(data, 16, "a", "v"));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("tensor 'v' step 0: job 'a' already has 1 tensors"));
  EXPECT_EQ(Exhausted("job_tensors"), 1);
  EXPECT_TRUE(engine_->Reduce(Square(data, 16, "a", "w")).ok());
  EXPECT_TRUE(engine_->Reduce(Square(data, 16, "b", "v")).ok());
}

// A new tensor refused after admission (NaN under a compressing codec)
// holds no state, so it does not keep a slot of the job's tensor quota.
TEST_F(EngineLimitsTest, ATensorRefusedAfterAdmissionTakesNoQuotaSlot) {
  EngineOptions options;
  options.quotas.max_tensors_per_job = 1;
  Build(options);
  std::vector<float> bad(16 * 16, 1.0f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan_data(reinterpret_cast<const char*>(bad.data()),
                             bad.size() * sizeof(float));
  ReduceInput refused = Square(nan_data, 16, "a", "bad");
  refused.codec = CodecSpec{"topk", {{"ratio", "0.1"}}};
  EXPECT_EQ(engine_->Reduce(refused).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string data = Floats(16 * 16, 1);
  absl::StatusOr<ReduceOutput> good =
      engine_->Reduce(Square(data, 16, "a", "w"));
  EXPECT_TRUE(good.ok()) << good.status();
}

// Two jobs reduce the same tensor name at the same steps with different
// data through a stateful codec: each job's results equal those of an
// engine that saw that job alone.
TEST_F(EngineLimitsTest, JobsWithTheSameTensorNamesKeepTheirOwnState) {
  Build(EngineOptions());
  const CodecSpec topk{"topk", {{"ratio", "0.05"}}};
  const std::string a = Floats(64 * 64, 1), b = Floats(64 * 64, -3);
  std::vector<std::string> mixed_a, mixed_b;
  for (int step = 0; step < 4; ++step) {
    for (auto [job, data, out] : {std::make_tuple("a", &a, &mixed_a),
                                  std::make_tuple("b", &b, &mixed_b)}) {
      ReduceInput in = Square(*data, 64, job);
      in.step = step;
      in.codec = topk;
      auto r = engine_->Reduce(in);
      ASSERT_TRUE(r.ok()) << r.status();
      out->push_back(r->data);
    }
  }
  for (auto [job, data, mixed] : {std::make_tuple("a", &a, &mixed_a),
                                  std::make_tuple("b", &b, &mixed_b)}) {
    codecs::StateStore store;
    Metrics metrics(&store, "test");
    LocalCollective collective;
    auto alone = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(),
                                &store, &collective, &metrics, Policy());
    ASSERT_TRUE(alone.ok());
    for (int step = 0; step < 4; ++step) {
      ReduceInput in = Square(*data, 64, job);
      in.step = step;
      in.codec = topk;
      auto r = (*alone)->Reduce(in);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->data, (*mixed)[step]) << "job " << job << " step " << step;
    }
  }
}

}  // namespace
}  // namespace gradcomp::service
