#include "service/collective/peer_collective.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/mailbox.h"
#include "service/metrics/metrics_testing.h"
#include "service/metrics/peer_metrics.h"
#include "service/transport/in_process_transport.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// W daemons' collectives in one process, over an InProcessHub.
class Group {
 public:
  explicit Group(int world_size, absl::Duration timeout = absl::Seconds(60))
      : hub_(world_size) {
    for (int r = 0; r < world_size; ++r) {
      metrics_.push_back(std::make_unique<PeerMetrics>(r, world_size));
      mailboxes_.push_back(std::make_unique<Mailbox>(
          world_size, MailboxOptions{}, metrics_[r].get()));
      transports_.push_back(hub_.Connect(r, mailboxes_[r].get()));
      collectives_.push_back(std::make_unique<PeerCollective>(
          transports_[r].get(), mailboxes_[r].get(),
          PeerCollectiveOptions{timeout}, metrics_[r].get()));
    }
  }
  InProcessHub& hub() { return hub_; }
  PeerCollective& collective(int rank) { return *collectives_[rank]; }
  double Waiting(int rank, int peer) const {
    return MetricValue(*metrics_[rank]->collectable(), "gradcomp_peer_waiting",
                       {{"peer", std::to_string(peer)}});
  }

 private:
  InProcessHub hub_;
  std::vector<std::unique_ptr<PeerMetrics>> metrics_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<PeerCollective>> collectives_;
};

codecs::Bytes DensePayload(const std::vector<float>& values,
                           codecs::ElemType type = codecs::ElemType::kF32,
                           codecs::CodecId codec = codecs::CodecId::kNone) {
  codecs::WireHeader header;
  header.codec = codec;
  header.numel = values.size();
  codecs::Bytes payload;
  codecs::WriteDensePayload(header, type, values, &payload);
  return payload;
}

std::vector<float> Values(int rank, int tensor, int step, size_t n) {
  std::mt19937 rng(rank * 100003 + tensor * 1009 + step);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * (1.0f + tensor);
  return v;
}

using Results = std::vector<std::vector<absl::StatusOr<codecs::RoundResult>>>;

// Every rank runs `tensors` tensors of `step` at once, each rank starting
// them in its own random order; make(rank, tensor) is the round.
template <typename Make>
Results RunAll(Group& group, int world_size, int tensors, int step, Make make) {
  Results results(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    results[r].resize(tensors, absl::UnknownError("not run"));
    std::vector<int> order(tensors);
    for (int t = 0; t < tensors; ++t) order[t] = t;
    std::shuffle(order.begin(), order.end(), std::mt19937(r + 17 * step));
    for (int t : order) {
      threads.emplace_back([&, r, t] {
        results[r][t] = group.collective(r).Run(
            {"job", absl::StrCat("t", t), step, 0}, make(r, t));
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

TEST(PeerCollectiveTest, GatherHandsEveryRankAllPayloadsInRankOrder) {
  constexpr int kW = 4, kTensors = 12;
  Group group(kW);
  for (int step = 0; step < 3; ++step) {
    Results results = RunAll(group, kW, kTensors, step, [&](int r, int t) {
      return codecs::Round{codecs::Collective::kGather,
                           absl::StrCat("payload r", r, " t", t, " s", step)};
    });
    for (int r = 0; r < kW; ++r) {
      for (int t = 0; t < kTensors; ++t) {
        ASSERT_TRUE(results[r][t].ok()) << results[r][t].status();
        EXPECT_EQ(results[r][t]->world_size, kW);
        std::vector<std::string> expected;
        for (int from = 0; from < kW; ++from) {
          expected.push_back(
              absl::StrCat("payload r", from, " t", t, " s", step));
        }
        EXPECT_EQ(results[r][t]->payloads, expected);
      }
    }
  }
}

TEST(PeerCollectiveTest, SumIsTheRankOrderFp32SumBitForBitOnEveryRank) {
  constexpr int kW = 4, kTensors = 8;
  Group group(kW);
  // Sizes not divisible by W, and smaller than W (empty slices).
  auto size_of = [](int t) {
    return t % 2 == 0 ? static_cast<size_t>(1001 + t) : size_t(t);
  };
  for (int step = 0; step < 2; ++step) {
    Results results = RunAll(group, kW, kTensors, step, [&](int r, int t) {
      return codecs::Round{codecs::Collective::kSum,
                           DensePayload(Values(r, t, step, size_of(t)))};
    });
    for (int t = 0; t < kTensors; ++t) {
      std::vector<float> expected(size_of(t), 0.0f);
      for (int r = 0; r < kW; ++r) {
        const std::vector<float> v = Values(r, t, step, size_of(t));
        for (size_t i = 0; i < v.size(); ++i) expected[i] += v[i];
      }
      for (int r = 0; r < kW; ++r) {
        ASSERT_TRUE(results[r][t].ok()) << results[r][t].status();
        const std::vector<float>& sum = results[r][t]->sum;
        ASSERT_EQ(sum.size(), expected.size());
        EXPECT_EQ(std::memcmp(sum.data(), expected.data(),
                              sum.size() * sizeof(float)),
                  0)
            << "rank " << r << " tensor " << t;
      }
    }
  }
}

TEST(PeerCollectiveTest, SumIntoTheRoundsBufferIsTheSameSumBitForBit) {
  constexpr int kW = 4, kTensors = 4;
  constexpr size_t kSize = 1003;
  Group group(kW);
  // Tensors 0 and 1 fp32, 2 fp16, 3 with a buffer of the wrong size (the
  // sum then comes in the result's vector and the buffer stays as it was).
  const float kSentinel = -7.5f;
  std::vector<std::vector<std::vector<float>>> into(
      kW, std::vector<std::vector<float>>(kTensors));
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < kTensors; ++t) {
      into[r][t].assign(t == 3 ? kSize - 1 : kSize, kSentinel);
    }
  }
  Results results = RunAll(group, kW, kTensors, 0, [&](int r, int t) {
    codecs::Round round{
        codecs::Collective::kSum,
        t == 2 ? DensePayload(Values(r, t, 0, kSize), codecs::ElemType::kF16,
                              codecs::CodecId::kFp16)
               : DensePayload(Values(r, t, 0, kSize))};
    round.sum_into = absl::MakeSpan(into[r][t]);
    return round;
  });
  Group reference(kW);
  Results plain = RunAll(reference, kW, kTensors, 0, [&](int r, int t) {
    return codecs::Round{
        codecs::Collective::kSum,
        t == 2 ? DensePayload(Values(r, t, 0, kSize), codecs::ElemType::kF16,
                              codecs::CodecId::kFp16)
               : DensePayload(Values(r, t, 0, kSize))};
  });
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < kTensors; ++t) {
      ASSERT_TRUE(results[r][t].ok()) << results[r][t].status();
      ASSERT_TRUE(plain[r][t].ok()) << plain[r][t].status();
      const std::vector<float>& expected = plain[r][t]->sum;
      ASSERT_EQ(expected.size(), kSize);
      if (t == 3) {
        EXPECT_TRUE(results[r][t]->summed_into.empty());
        EXPECT_EQ(results[r][t]->sum, expected);
        EXPECT_EQ(into[r][t], std::vector<float>(kSize - 1, kSentinel));
        continue;
      }
      EXPECT_TRUE(results[r][t]->sum.empty());
      EXPECT_EQ(results[r][t]->summed_into.data(), into[r][t].data());
      EXPECT_EQ(results[r][t]->summed_into.size(), kSize);
      EXPECT_EQ(std::memcmp(into[r][t].data(), expected.data(),
                            kSize * sizeof(float)),
                0)
          << "rank " << r << " tensor " << t;
    }
  }
}

TEST(PeerCollectiveTest, Fp16SumsTravelAsFp16UnlessTheyOverflow) {
  constexpr int kW = 4;
  Group group(kW);
  Results results = RunAll(group, kW, 2, 0, [&](int r, int t) {
    // Tensor 1 sums to 4 * 40000, above fp16's largest finite 65504.
    std::vector<float> v = t == 0 ? std::vector<float>{0.5f, -1.25f, 3.0f}
                                  : std::vector<float>{40000.0f, 1.0f};
    return codecs::Round{
        codecs::Collective::kSum,
        DensePayload(v, codecs::ElemType::kF16, codecs::CodecId::kFp16)};
  });
  for (int r = 0; r < kW; ++r) {
    ASSERT_TRUE(results[r][0].ok()) << results[r][0].status();
    EXPECT_THAT(results[r][0]->sum, ::testing::ElementsAre(2.0f, -5.0f, 12.0f));
    ASSERT_TRUE(results[r][1].ok()) << results[r][1].status();
    EXPECT_THAT(results[r][1]->sum, ::testing::ElementsAre(160000.0f, 4.0f));
  }
}

// Summed in place, a slice this rank sends as fp16 is written back rounded
// as the others decode it; one that overflows fp16 travels as fp32 and stays.
TEST(PeerCollectiveTest, Fp16SumsIntoTheRoundsBufferMatchTheVectorSums) {
  constexpr int kW = 4;
  std::vector<std::vector<std::vector<float>>> into(
      kW, std::vector<std::vector<float>>(2, std::vector<float>(kW, -7.5f)));
  const auto values = [](int r, int t) {
    // Tensor 1's slices 0 and 2 sum to 4 * 40000, above fp16's 65504.
    return t == 0 ? std::vector<float>{0.1f * r, -1.3f, 3.7f + r, 0.01f}
                  : std::vector<float>{40000.0f, 1.1f * r, 40000.0f, 2.0f};
  };
  Group group(kW);
  Results results = RunAll(group, kW, 2, 0, [&](int r, int t) {
    codecs::Round round{codecs::Collective::kSum,
                        DensePayload(values(r, t), codecs::ElemType::kF16,
                                     codecs::CodecId::kFp16)};
    round.sum_into = absl::MakeSpan(into[r][t]);
    return round;
  });
  Group reference(kW);
  Results plain = RunAll(reference, kW, 2, 0, [&](int r, int t) {
    return codecs::Round{codecs::Collective::kSum,
                         DensePayload(values(r, t), codecs::ElemType::kF16,
                                      codecs::CodecId::kFp16)};
  });
  for (int r = 0; r < kW; ++r) {
    for (int t = 0; t < 2; ++t) {
      ASSERT_TRUE(results[r][t].ok()) << results[r][t].status();
      ASSERT_TRUE(plain[r][t].ok()) << plain[r][t].status();
      ASSERT_EQ(plain[r][t]->sum.size(), size_t{kW});
      EXPECT_EQ(std::memcmp(into[r][t].data(), plain[r][t]->sum.data(),
                            kW * sizeof(float)),
                0)
          << "rank " << r << " tensor " << t;
    }
  }
  EXPECT_EQ(into[1][1][0], 160000.0f);
  EXPECT_EQ(into[3][1][2], 160000.0f);
}

TEST(PeerCollectiveTest, RanksWithDifferentCodecsAreRefusedNamingBoth) {
  constexpr int kW = 3;
  Group group(kW);
  Results results = RunAll(group, kW, 1, 0, [&](int r, int) {
    return codecs::Round{
        codecs::Collective::kSum,
        DensePayload({1, 2, 3}, codecs::ElemType::kF32,
                     r == 1 ? codecs::CodecId::kFp16 : codecs::CodecId::kNone)};
  });
  ASSERT_EQ(results[0][0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(results[0][0].status().message(),
              HasSubstr("rank 1 encoded codec id 2 round 0, rank 0 encoded "
                        "codec id 1 round 0"));
  EXPECT_EQ(results[1][0].status().code(), absl::StatusCode::kInvalidArgument);
}

// A dense payload whose parameter block carries a prescale divisor, as the
// dense codecs write it (type, 3 bytes of padding, divisor little-endian).
codecs::Bytes PrescaledPayload(const std::vector<float>& values,
                               uint32_t divisor) {
  codecs::WireHeader header;
  header.codec = codecs::CodecId::kNone;
  header.flags = codecs::kFlagDenseBody;
  header.numel = values.size();
  char params[8] = {static_cast<char>(codecs::ElemType::kF32)};
  std::memcpy(params + 4, &divisor, sizeof(divisor));
  codecs::Bytes payload;
  char* body = codecs::BeginPayload(header, absl::string_view(params, 8),
                                    values.size() * sizeof(float), &payload);
  std::memcpy(body, values.data(), values.size() * sizeof(float));
  return payload;
}

// Codecs finish a sum by their parameters (a prescaled sum is the mean
// already): ranks whose blocks differ would each return another result,
// so the owner of every slice refuses the sum, naming both blocks.
TEST(PeerCollectiveTest, RanksWithDifferentCodecParametersAreRefused) {
  constexpr int kW = 3;
  Group group(kW);
  Results results = RunAll(group, kW, 1, 0, [&](int r, int) {
    return codecs::Round{codecs::Collective::kSum,
                         PrescaledPayload({1, 2, 3, 4, 5, 6}, r == 1 ? 1 : 3)};
  });
  for (int r = 0; r < kW; ++r) {
    EXPECT_EQ(results[r][0].status().code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << results[r][0].status();
  }
  EXPECT_THAT(results[0][0].status().message(),
              HasSubstr("rank 1 encoded codec id 1 with parameter block "
                        "0100000001000000, rank 0 with 0100000003000000"));
  Results same = RunAll(group, kW, 1, 1, [&](int, int) {
    return codecs::Round{codecs::Collective::kSum,
                         PrescaledPayload({1, 2, 3, 4, 5, 6}, 3)};
  });
  for (int r = 0; r < kW; ++r) {
    ASSERT_TRUE(same[r][0].ok()) << same[r][0].status();
    EXPECT_EQ(same[r][0]->sum, std::vector<float>({3, 6, 9, 12, 15, 18}));
  }
}

// The deadline leaves the live ranks time to arrive on a loaded machine:
// the error names every rank it has no message from.
TEST(PeerCollectiveTest, AMissingRankFailsTheOthersAtTheDeadlineNamingIt) {
  constexpr int kW = 4;
  Group group(kW, absl::Seconds(2));
  std::vector<absl::Status> status(kW - 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < kW - 1; ++r) {
    threads.emplace_back([&, r] {
      status[r] = group.collective(r)
                      .Run({"job", "fc1.weight", 9, 0},
                           {codecs::Collective::kGather, "p"})
                      .status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < kW - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded);
    // A live rank that a loaded machine held back past the deadline is
    // named beside it.
    EXPECT_THAT(
        std::string(status[r].message()),
        ::testing::ContainsRegex("no message from (rank [0-9], )*rank 3"));
    EXPECT_THAT(status[r].message(), HasSubstr("tensor 'fc1.weight' step 9"));
  }
}

TEST(PeerCollectiveTest, AKilledRankFailsTheWaitersAndTheNextStepWorks) {
  constexpr int kW = 4;
  Group group(kW);
  std::vector<absl::Status> status(kW - 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < kW - 1; ++r) {
    threads.emplace_back([&, r] {
      status[r] = group.collective(r)
                      .Run({"job", "w", 0, 0},
                           {codecs::Collective::kSum, DensePayload({1, 2})})
                      .status();
    });
  }
  for (int r = 0; r < kW - 1; ++r) {
    while (group.Waiting(r, 3) == 0) absl::SleepFor(absl::Milliseconds(1));
  }
  group.hub().Kill(3);
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < kW - 1; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(status[r].message(), HasSubstr("rank 3 was lost"));
    EXPECT_EQ(group.Waiting(r, 3), 0);
  }
  group.hub().Revive(3);
  Results results = RunAll(group, kW, 1, 1, [&](int, int) {
    return codecs::Round{codecs::Collective::kSum, DensePayload({1, 2})};
  });
  for (int r = 0; r < kW; ++r) {
    ASSERT_TRUE(results[r][0].ok()) << results[r][0].status();
    EXPECT_THAT(results[r][0]->sum, ::testing::ElementsAre(4.0f, 8.0f));
  }
}

// Keeps the keys of what arrives (on the sender's thread: InProcessHub).
class KeyRecorder : public Receiver {
 public:
  void OnMessage(int from, const MessageKey& key, codecs::Bytes) override {
    absl::MutexLock lock(&mu_);
    keys_.push_back(key);
  }
  void OnPeerLost(int, const absl::Status&) override {}
  void OnCorruptMessage(int, const MessageKey&, const absl::Status&) override {}
  std::vector<MessageKey> keys() {
    absl::MutexLock lock(&mu_);
    return keys_;
  }

 private:
  absl::Mutex mu_;
  std::vector<MessageKey> keys_;
};

// Rank 0 sends to rank 1 first, and rank 1 is unreachable: each exchange
// still hands rank 2 its message before failing with rank 1's error, so
// that rank 2 does not wait for rank 0 and blame it.
TEST(PeerCollectiveTest, AnUnreachableRankDoesNotKeepTheMessageFromTheOthers) {
  InProcessHub hub(3);
  PeerMetrics metrics(0, 3);
  Mailbox mailbox(3, MailboxOptions{}, &metrics);
  KeyRecorder one;
  KeyRecorder two;
  std::unique_ptr<Transport> transport = hub.Connect(0, &mailbox);
  std::unique_ptr<Transport> transport1 = hub.Connect(1, &one);
  std::unique_ptr<Transport> transport2 = hub.Connect(2, &two);
  PeerCollective collective(transport.get(), &mailbox,
                            PeerCollectiveOptions{absl::Seconds(60)}, &metrics);
  hub.Kill(1);
  std::vector<absl::Status> status;
  status.push_back(collective
                       .Run({"job", "w", 0, 0},
                            {codecs::Collective::kGather, DensePayload({1, 2})})
                       .status());
  status.push_back(collective
                       .Run({"job", "w", 1, 0},
                            {codecs::Collective::kSum, DensePayload({1, 2})})
                       .status());
  status.push_back(
      collective.AllToAll({"job", "w", 2, 0}, {"a", "b", "c"}).status());
  status.push_back(collective.Allgather({"job", "w", 3, 0}, "a").status());
  status.push_back(
      collective.ExchangeWithNeighbours({"job", "w", 4, 0}, {1, 2}, {"b", "c"})
          .status());
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 1 (in-process) is not reachable"));
  }
  std::vector<Phase> phases;
  for (const MessageKey& key : two.keys()) phases.push_back(key.phase);
  EXPECT_THAT(phases,
              ::testing::ElementsAre(Phase::kGather, Phase::kReduceScatter,
                                     Phase::kShardScatter, Phase::kShardGather,
                                     Phase::kNeighbours));
}

// Forwards to `inner` and records the rounds withdrawn through it.
class WithdrawRecorder : public Transport {
 public:
  explicit WithdrawRecorder(std::unique_ptr<Transport> inner)
      : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string PeerName(int rank) const override {
    return inner_->PeerName(rank);
  }
  absl::Status SendMessage(int to, const MessageKey& key,
                           OutgoingMessage message,
                           absl::Time deadline) override {
    return inner_->SendMessage(to, key, std::move(message), deadline);
  }
  void Withdraw(absl::string_view job, absl::string_view tensor, int64_t step,
                int round) override {
    absl::MutexLock lock(&mu_);
    withdrawn_.push_back(absl::StrCat(job, "/", tensor, "/", step, "/", round));
  }
  std::vector<std::string> withdrawn() {
    absl::MutexLock lock(&mu_);
    return withdrawn_;
  }

 private:
  const std::unique_ptr<Transport> inner_;
  absl::Mutex mu_;
  std::vector<std::string> withdrawn_;
};

// Every exchange that fails withdraws its round's messages still queued
// (for a peer that restarts, they would be stale in a rerun of the round);
// one that succeeds leaves them to go.
TEST(PeerCollectiveTest, AFailedExchangeWithdrawsItsRoundAndOnlyThatRound) {
  InProcessHub hub(2);
  PeerMetrics metrics0(0, 2);
  PeerMetrics metrics1(1, 2);
  Mailbox mailbox0(2, MailboxOptions{}, &metrics0);
  Mailbox mailbox1(2, MailboxOptions{}, &metrics1);
  WithdrawRecorder transport0(hub.Connect(0, &mailbox0));
  std::unique_ptr<Transport> transport1 = hub.Connect(1, &mailbox1);
  const PeerCollectiveOptions options{absl::Seconds(60)};
  PeerCollective collective0(&transport0, &mailbox0, options, &metrics0);
  PeerCollective collective1(transport1.get(), &mailbox1, options, &metrics1);
  std::thread other([&] {
    EXPECT_TRUE(collective1
                    .Run({"job", "w", 0, 1},
                         {codecs::Collective::kSum, DensePayload({1, 2})})
                    .ok());
  });
  EXPECT_TRUE(collective0
                  .Run({"job", "w", 0, 1},
                       {codecs::Collective::kSum, DensePayload({1, 2})})
                  .ok());
  other.join();
  EXPECT_THAT(transport0.withdrawn(), ::testing::IsEmpty());

  hub.Kill(1);
  EXPECT_FALSE(collective0
                   .Run({"job", "w", 1, 2},
                        {codecs::Collective::kGather, DensePayload({1, 2})})
                   .ok());
  EXPECT_FALSE(collective0
                   .Run({"job", "w", 2, 0},
                        {codecs::Collective::kSum, DensePayload({1, 2})})
                   .ok());
  EXPECT_FALSE(collective0.AllToAll({"job", "w", 3, 0}, {"a", "b"}).ok());
  EXPECT_FALSE(collective0.Allgather({"job", "w", 4, 1}, "a").ok());
  EXPECT_FALSE(
      collective0.ExchangeWithNeighbours({"job", "w", 5, 0}, {1}, {"b"}).ok());
  EXPECT_THAT(transport0.withdrawn(),
              ::testing::ElementsAre("job/w/1/2", "job/w/2/0", "job/w/3/0",
                                     "job/w/4/1", "job/w/5/0"));
}

}  // namespace
}  // namespace gradcomp::service
