// The engine's batched reduces (ReduceInput::batch) over W in-process
// peers: the same averages as unbatched reduces with fewer collectives,
// validation of the batch, and a member that fails on one rank.
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/batching_collective.h"
#include "service/collective/counting_collective.h"
#include "service/collective/in_process_group.h"
#include "service/engine/engine.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 2;
constexpr int kMembers = 6;
constexpr int64_t kRows = 24, kCols = 16;

class EngineBatchTest : public ::testing::Test {
 protected:
  EngineBatchTest() : group_(kWorld, absl::Seconds(30)) {
    EngineOptions options;
    options.seed = 11;
    options.batch_timeout = absl::Seconds(30);
    for (int r = 0; r < kWorld; ++r) {
      stores_.push_back(std::make_unique<codecs::StateStore>());
      metrics_.push_back(
          std::make_unique<Metrics>(stores_.back().get(), "test"));
      counting_.push_back(
          std::make_unique<CountingCollective>(&group_.collective(r)));
      auto engine = Engine::Create(options, codecs::BuiltinCodecs(),
                                   stores_.back().get(), counting_.back().get(),
                                   metrics_.back().get(), Policy());
      EXPECT_TRUE(engine.ok()) << engine.status();
      engines_.push_back(std::move(*engine));
    }
    for (int m = 0; m < kMembers; ++m) {
      names_.push_back(absl::StrCat("layer", m, ".weight"));
    }
  }

  static std::string Gradient(int rank, int member, int64_t step) {
    std::mt19937 gen(100 * rank + 10 * member + static_cast<int>(step));
    std::normal_distribution<float> normal;
    std::vector<float> v(kRows * kCols);
    for (float& x : v) x = normal(gen);
    std::string bytes(v.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return bytes;
  }

  static std::shared_ptr<const BatchSpec> Batch(
      std::vector<std::string> members) {
    return std::make_shared<const BatchSpec>(
        *MakeBatchSpec("bucket0", std::move(members)));
  }

  ReduceInput Input(const std::string& job, int member, int64_t step,
                    const std::string& data, bool batched) {
    ReduceInput in;
    in.job = job;
    in.tensor = names_[member];
    in.step = step;
    in.shape = {kRows, kCols};
    in.data = data;
    in.codec = CodecSpec{"powersgd", {{"rank", "2"}}};
    if (batched) in.batch = Batch(names_);
    return in;
  }

  InProcessGroup group_;
  std::vector<std::unique_ptr<codecs::StateStore>> stores_;
  std::vector<std::unique_ptr<Metrics>> metrics_;
  std::vector<std::unique_ptr<CountingCollective>> counting_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::string> names_;
};

// Three PowerSGD steps (warm start and error feedback carried): batched
// averages equal unbatched ones bit for bit on every rank, with 2
// collectives per step instead of 2 per tensor.
TEST_F(EngineBatchTest, BatchedPowerSgdEqualsUnbatchedWithFewerCollectives) {
  constexpr int kSteps = 3;
  std::vector<std::string> results[2];  // [batched][(rank, member, step)]
  for (bool batched : {false, true}) {
    const std::string job = batched ? "batched" : "plain";
    results[batched].resize(kWorld * kMembers * kSteps);
    for (int r = 0; r < kWorld; ++r) counting_[r]->Reset();
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<std::thread> threads;
      for (int r = 0; r < kWorld; ++r) {
        for (int m = 0; m < kMembers; ++m) {
          threads.emplace_back([&, r, m, step] {
            const std::string data = Gradient(r, m, step);
            absl::StatusOr<ReduceOutput> out =
                engines_[r]->Reduce(Input(job, m, step, data, batched));
            ASSERT_TRUE(out.ok()) << out.status();
            EXPECT_EQ(out->stats.codec, "powersgd");
            results[batched][(r * kMembers + m) * kSteps + step] = out->data;
          });
        }
      }
      for (std::thread& t : threads) t.join();
    }
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(counting_[r]->runs(), (batched ? 2 : 2 * kMembers) * kSteps)
          << (batched ? "batched" : "plain") << " rank " << r;
    }
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_EQ(results[1][i], results[0][i]) << "slot " << i;
  }
  for (int m = 0; m < kMembers; ++m) {
    EXPECT_EQ(results[1][(kMembers + m) * kSteps + 2],
              results[1][m * kSteps + 2]);
  }
}

// Top-k (DGC, error feedback carried) of members of different sizes: the
// GATHER rounds of a batch travel as one collective per step, and every
// average equals its unbatched one bit for bit.
TEST_F(EngineBatchTest, BatchedTopKOfDifferentShapesEqualsUnbatched) {
  constexpr int kSteps = 3;
  auto shape = [](int m) { return std::vector<int64_t>{kRows + 8 * m, kCols}; };
  auto data = [&](int r, int m, int64_t step) {
    std::mt19937 gen(100 * r + 10 * m + static_cast<int>(step));
    std::normal_distribution<float> normal;
    std::vector<float> v(shape(m)[0] * shape(m)[1]);
    for (float& x : v) x = normal(gen);
    return std::string(reinterpret_cast<const char*>(v.data()),
                       v.size() * sizeof(float));
  };
  std::vector<std::string> results[2];  // [batched][(rank, member, step)]
  for (bool batched : {false, true}) {
    const std::string job = batched ? "topk-batched" : "topk-plain";
    results[batched].resize(kWorld * kMembers * kSteps);
    for (int r = 0; r < kWorld; ++r) counting_[r]->Reset();
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<std::thread> threads;
      for (int r = 0; r < kWorld; ++r) {
        for (int m = 0; m < kMembers; ++m) {
          threads.emplace_back([&, r, m, step] {
            const std::string bytes = data(r, m, step);
            ReduceInput in = Input(job, m, step, bytes, batched);
            in.shape = shape(m);
            in.codec = CodecSpec{"topk", {{"ratio", "0.1"}}};
            absl::StatusOr<ReduceOutput> out = engines_[r]->Reduce(in);
            ASSERT_TRUE(out.ok()) << out.status();
            EXPECT_EQ(out->stats.codec, "topk");
            results[batched][(r * kMembers + m) * kSteps + step] = out->data;
          });
        }
      }
      for (std::thread& t : threads) t.join();
    }
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(counting_[r]->runs(), (batched ? 1 : kMembers) * kSteps)
          << (batched ? "batched" : "plain") << " rank " << r;
    }
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    ASSERT_FALSE(results[0][i].empty()) << "slot " << i;
    EXPECT_EQ(results[1][i], results[0][i]) << "slot " << i;
  }
}

TEST_F(EngineBatchTest,
       ABatchWithoutTheTensorIsInvalidArgumentBeforeAnyCollective) {
  const std::string data = Gradient(0, 0, 0);
  ReduceInput in = Input("job", 0, 0, data, true);
  in.batch = Batch({"other", "another"});
  absl::StatusOr<ReduceOutput> out = engines_[0]->Reduce(in);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              HasSubstr("does not name tensor 'layer0.weight'"));
  EXPECT_EQ(counting_[0]->runs(), 0);
}

// With a declared tensor list, a batch's members must be in it, whatever
// their shapes (a bucket's tensors differ): a batch of two declared
// tensors of different shapes reduces on every rank, and one naming an
// undeclared tensor is refused before any collective. Before, members had
// to be declared with the requesting tensor's shape, and the error gave
// the other member's shape as the requesting tensor's.
TEST_F(EngineBatchTest, MembersOfADeclaredJobMustBeDeclaredInAnyShape) {
  const std::vector<std::vector<int64_t>> shapes = {{kRows, kCols},
                                                    {kCols / 2, kRows}};
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::string> hash = engines_[r]->DeclareTensors(
          "job", 0,
          {{names_[0], DType::kFloat32, shapes[0]},
           {names_[1], DType::kFloat32, shapes[1]}});
      ASSERT_TRUE(hash.ok()) << hash.status();
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string data = Gradient(0, 0, 0);
  ReduceInput undeclared = Input("job", 0, 0, data, true);
  undeclared.batch = Batch({names_[0], names_[2]});
  absl::StatusOr<ReduceOutput> refused = engines_[0]->Reduce(undeclared);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("batch 'bucket0' member 'layer2.weight': tensor "
                        "'layer2.weight' is not in job 'job''s declared list"));
  EXPECT_EQ(counting_[0]->runs(), 0);

  threads.clear();
  std::vector<absl::Status> status(kWorld * 2);
  for (int r = 0; r < kWorld; ++r) {
    for (int m = 0; m < 2; ++m) {
      threads.emplace_back([&, r, m] {
        // Member 1 is half member 0's size: the first half of its bytes.
        const std::string bytes = Gradient(r, m, 1).substr(
            0,
            static_cast<size_t>(shapes[m][0] * shapes[m][1]) * sizeof(float));
        ReduceInput in = Input("job", m, 1, bytes, false);
        in.shape = shapes[m];
        in.codec = CodecSpec{"topk", {{"ratio", "0.1"}}};
        in.batch = Batch({names_[0], names_[1]});
        status[r * 2 + m] = engines_[r]->Reduce(in).status();
      });
    }
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

// A member that fails on rank 0 (NaN input, refused before its rounds)
// leaves the batch there: the other members succeed on every rank, and the
// failed member's reduce on rank 1 fails with an error saying why.
TEST_F(EngineBatchTest, AMemberFailingOnOneRankLeavesTheOthersWhole) {
  std::vector<absl::Status> status(kWorld * kMembers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    for (int m = 0; m < kMembers; ++m) {
      threads.emplace_back([&, r, m] {
        std::string data = Gradient(r, m, 0);
        if (r == 0 && m == 3) {
          const float nan = std::nanf("");
          std::memcpy(data.data(), &nan, sizeof(nan));
        }
        status[r * kMembers + m] =
            engines_[r]->Reduce(Input("job", m, 0, data, true)).status();
      });
    }
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    for (int m = 0; m < kMembers; ++m) {
      if (m == 3) continue;
      EXPECT_TRUE(status[r * kMembers + m].ok()) << r << " " << m;
    }
  }
  EXPECT_THAT(status[3].message(), HasSubstr("NaN/Inf"));
  EXPECT_EQ(status[kMembers + 3].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status[kMembers + 3].message(),
              HasSubstr("'layer3.weight' was in the sum of 1 of 2 ranks"));
}

// A mixed batch, as the hook's batch_gather makes: a top-k matrix (GATHER)
// and 1-D members the caller sends dense (SUM, one shape). The matrix
// holds a NaN on rank 0 only and is refused there before its round; rank
// 0's members left are then all SUM of one shape, but both ranks must send
// the batch message: the others succeed at once on both ranks, and the
// matrix fails on rank 1 naming rank 0 (it used to wait out the deadline
// with every member, the ranks on two collectives that never met).
TEST_F(EngineBatchTest, AGatherMemberRefusedOnOneRankLeavesAMixedBatchWhole) {
  const std::shared_ptr<const BatchSpec> batch =
      Batch({names_[0], names_[1], names_[2]});
  std::vector<absl::StatusOr<ReduceOutput>> out(kWorld * 3,
                                                absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    for (int m = 0; m < 3; ++m) {
      threads.emplace_back([&, r, m] {
        std::string data = Gradient(r, m, 0);
        ReduceInput in = Input("mixed", m, 0, data, false);
        in.batch = batch;
        if (m == 0) {
          in.codec = CodecSpec{"topk", {{"ratio", "0.1"}}};
          if (r == 0) {
            const float nan = std::nanf("");
            std::memcpy(data.data(), &nan, sizeof(nan));
            in.data = data;
          }
        } else {
          in.shape = {kRows * kCols};
          in.codec = CodecSpec{"none", {}};
        }
        out[r * 3 + m] = engines_[r]->Reduce(in);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  for (int m = 1; m < 3; ++m) {
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(out[r * 3 + m].ok())
          << r << " " << m << ": " << out[r * 3 + m].status();
      EXPECT_EQ(out[r * 3 + m]->data, out[m]->data) << r << " " << m;
    }
  }
  EXPECT_THAT(out[0].status().message(), HasSubstr("NaN/Inf"));
  EXPECT_EQ(out[3].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out[3].status().message(),
              HasSubstr("it left the batch on rank 0"));
}

// The other members go on without a member whose request is refused
// before its batch is even checked (a bad consensus distance here), or
// that never reaches Reduce (its request refused by the service: it calls
// LeaveBatch). Without the leave they would wait for it until the member
// deadline and then fail.
TEST_F(EngineBatchTest, AMemberRefusedBeforeItsRoundsLeavesTheBatch) {
  for (const bool reaches_reduce : {true, false}) {
    SCOPED_TRACE(reaches_reduce ? "refused by Reduce" : "left by the caller");
    const int64_t step = reaches_reduce ? 0 : 1;
    std::vector<absl::Status> status(kWorld * kMembers);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      for (int m = 0; m < kMembers; ++m) {
        threads.emplace_back([&, r, m] {
          const std::string data = Gradient(r, m, step);
          ReduceInput in = Input("job", m, step, data, true);
          if (r == 0 && m == 3) {
            if (!reaches_reduce) {
              engines_[r]->LeaveBatch("job", in.tensor, step, *in.batch);
              return;
            }
            in.consensus_distance = -1;
          }
          status[r * kMembers + m] = engines_[r]->Reduce(in).status();
        });
      }
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
      for (int m = 0; m < kMembers; ++m) {
        if (m == 3) continue;
        EXPECT_TRUE(status[r * kMembers + m].ok())
            << r << " " << m << ": " << status[r * kMembers + m];
      }
    }
    if (reaches_reduce) {
      EXPECT_THAT(status[3].message(), HasSubstr("consensus_distance is -1"));
    }
    EXPECT_EQ(status[kMembers + 3].code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status[kMembers + 3].message(),
                HasSubstr("'layer3.weight' was in the sum of 1 of 2 ranks"));
  }
}

// A run that ended with a member gone from its batch (its request refused,
// the trainer crashed), released on every rank and run again from the same
// step: the batch starts afresh, instead of its member finding the old
// run's record and failing with "left the batch at round 0".
TEST_F(EngineBatchTest, AReleasedJobsBatchesStartAfresh) {
  const std::shared_ptr<const BatchSpec> batch = Batch(names_);
  for (int r = 0; r < kWorld; ++r) {
    engines_[r]->LeaveBatch("job", names_[0], 0, *batch);
    ASSERT_TRUE(engines_[r]->ReleaseJob("job").ok());
  }
  std::vector<absl::Status> status(kWorld * kMembers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    for (int m = 0; m < kMembers; ++m) {
      threads.emplace_back([&, r, m] {
        const std::string data = Gradient(r, m, 0);
        status[r * kMembers + m] =
            engines_[r]->Reduce(Input("job", m, 0, data, true)).status();
      });
    }
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kWorld * kMembers; ++i) {
    EXPECT_TRUE(status[i].ok()) << i << ": " << status[i];
  }
}

}  // namespace
}  // namespace gradcomp::service
