#include "service/collective/batching_collective.h"

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/counting_collective.h"
#include "service/collective/gather_batch_message.h"
#include "service/collective/in_process_group.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// W ranks, each with a BatchingCollective over its in-process peer.
class Ranks {
 public:
  Ranks(int world, absl::Duration member_timeout,
        absl::Duration collective_timeout = absl::Seconds(60))
      : group_(world, collective_timeout) {
    for (int r = 0; r < world; ++r) {
      counting_.push_back(
          std::make_unique<CountingCollective>(&group_.collective(r)));
      batching_.push_back(std::make_unique<BatchingCollective>(
          counting_.back().get(), member_timeout));
    }
  }
  BatchingCollective& batching(int rank) { return *batching_[rank]; }
  PeerCollective& peer(int rank) { return group_.collective(rank); }
  int inner_runs(int rank) const { return counting_[rank]->runs(); }
  std::vector<std::string> inner_forgotten(int rank) const {
    return counting_[rank]->forgotten();
  }

 private:
  InProcessGroup group_;
  std::vector<std::unique_ptr<CountingCollective>> counting_;
  std::vector<std::unique_ptr<BatchingCollective>> batching_;
};

std::vector<float> Values(int rank, int member, int round, int step, size_t n) {
  std::mt19937 gen(1000 * rank + 100 * member + 10 * round + step);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

codecs::Round SumRound(int round, absl::Span<const float> values,
                       codecs::ElemType type = codecs::ElemType::kF32) {
  codecs::Round r;
  r.collective = codecs::Collective::kSum;
  codecs::WireHeader header;
  header.codec = codecs::CodecId::kPowerSgd;
  header.round = round;
  header.numel = 1000;
  codecs::WriteDensePayload(header, type, values, &r.payload);
  return r;
}

// SumRound's payload with an 8-byte parameter block carrying `divisor`, as
// the dense codecs write a prescale divisor.
codecs::Round PrescaledSumRound(absl::Span<const float> values,
                                uint32_t divisor) {
  codecs::Round r;
  r.collective = codecs::Collective::kSum;
  codecs::WireHeader header;
  header.codec = codecs::CodecId::kPowerSgd;
  header.flags = codecs::kFlagDenseBody;
  header.numel = 1000;
  char params[8] = {static_cast<char>(codecs::ElemType::kF32)};
  std::memcpy(params + 4, &divisor, sizeof(divisor));
  char* body = codecs::BeginPayload(header, absl::string_view(params, 8),
                                    values.size() * sizeof(float), &r.payload);
  std::memcpy(body, values.data(), values.size() * sizeof(float));
  return r;
}

BatchSpec Spec(const std::string& id, std::vector<std::string> members) {
  return *MakeBatchSpec(id, std::move(members));
}

// Runs fn(rank, member) on one thread each and joins them.
void OnThreads(int world, int members,
               const std::function<void(int, int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    for (int m = 0; m < members; ++m) threads.emplace_back(fn, r, m);
  }
  for (std::thread& t : threads) t.join();
}

TEST(MakeBatchSpecTest, SortsAndRefusesBadLists) {
  absl::StatusOr<BatchSpec> spec = MakeBatchSpec("b", {"c", "a", "b"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->members, ::testing::ElementsAre("a", "b", "c"));

  EXPECT_THAT(MakeBatchSpec("", {"a"}).status().message(),
              HasSubstr("batch id is empty"));
  EXPECT_THAT(MakeBatchSpec(std::string(1025, 'b'), {"a"}).status().message(),
              HasSubstr("batch id has 1025 bytes, expected at most 1024"));
  EXPECT_THAT(MakeBatchSpec("b", {"a", "a"}).status().message(),
              HasSubstr("names member 'a' twice"));
  EXPECT_THAT(MakeBatchSpec("b", {"a", ""}).status().message(),
              HasSubstr("empty member"));
  EXPECT_THAT(MakeBatchSpec("b", {"a", "x#y"}).status().message(),
              HasSubstr("holds '#'"));
  std::vector<std::string> many;
  for (size_t i = 0; i <= kMaxBatchMembers; ++i)
    many.push_back(absl::StrCat(i));
  EXPECT_EQ(MakeBatchSpec("b", many).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckBatchMemberTest, NamesTheMembersOfABatchWithoutTheTensor) {
  const BatchSpec spec = Spec("b", {"y", "x"});
  EXPECT_TRUE(CheckBatchMember(spec, "x").ok());
  EXPECT_THAT(CheckBatchMember(spec, "a").message(),
              HasSubstr("does not name tensor 'a' among its members [x, y]"));
}

TEST(MakeBatchSpecTest, KeyDependsOnTheMemberList) {
  EXPECT_NE(Spec("b", {"a", "c"}).key, Spec("b", {"a", "d"}).key);
  EXPECT_EQ(Spec("b", {"c", "a"}).key, Spec("b", {"a", "c"}).key);
  EXPECT_EQ(Spec("b", {"a", "c"}).key.rfind("#batch:b#", 0), 0u);
}

// Five members, two rounds, two steps: each member's result is bit-for-bit
// its own unbatched allreduce, on every rank, with one inner collective
// per round per rank.
TEST(BatchingCollectiveTest, EqualsPerTensorSumsWithOneCollectivePerRound) {
  constexpr int kWorld = 4, kMembers = 5, kRounds = 2, kSteps = 2;
  constexpr size_t kElements = 37;
  Ranks ranks(kWorld, absl::Seconds(60));
  const std::vector<std::string> names = {"m0", "m1", "m2", "m3", "m4"};
  const BatchSpec spec = *MakeBatchSpec("bucket0", names);
  std::vector<std::vector<float>> batched(kWorld * kMembers * kRounds * kSteps);
  std::vector<std::vector<float>> plain(batched.size());
  auto slot = [&](int r, int m, int round, int step) {
    return ((r * kMembers + m) * kRounds + round) * kSteps + step;
  };
  OnThreads(kWorld, kMembers, [&](int r, int m) {
    for (int step = 0; step < kSteps; ++step) {
      for (int round = 0; round < kRounds; ++round) {
        const std::vector<float> v = Values(r, m, round, step, kElements);
        const RoundKey key{"job", names[m], step, round};
        absl::StatusOr<codecs::RoundResult> result =
            ranks.batching(r).RunBatched(key, spec, SumRound(round, v));
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_EQ(result->world_size, kWorld);
        batched[slot(r, m, round, step)] = result->sum;
        absl::StatusOr<codecs::RoundResult> alone = ranks.peer(r).Run(
            {"job", absl::StrCat("plain.", names[m]), step, round},
            SumRound(round, v));
        ASSERT_TRUE(alone.ok()) << alone.status();
        plain[slot(r, m, round, step)] = alone->sum;
      }
      ranks.batching(r).Leave({"job", names[m], step, kRounds}, spec);
    }
  });
  for (size_t i = 0; i < batched.size(); ++i) {
    ASSERT_EQ(batched[i].size(), kElements);
    EXPECT_EQ(batched[i], plain[i]) << "slot " << i;
  }
  for (int m = 0; m < kMembers; ++m) {
    for (int r = 1; r < kWorld; ++r) {
      EXPECT_EQ(batched[slot(r, m, 1, 1)], batched[slot(0, m, 1, 1)]);
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ranks.inner_runs(r), kRounds * kSteps) << "rank " << r;
  }
}

// bf16 holds whole numbers exactly only to 256: 257 ranks' presences,
// summed in bf16, read 256, as if a rank had left. The batch counts
// absences instead, which stay non-zero: at 257 ranks one summed round
// still tells a member present everywhere from one that left on one rank.
TEST(BatchingCollectiveTest, Bf16MembersOfMoreRanksThanBf16CountsAreSummed) {
  constexpr int kWorld = 257, kMembers = 2, kLeaver = 5;
  constexpr size_t kElements = 4;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("bucket0", {"m0", "m1"});
  std::vector<absl::StatusOr<codecs::RoundResult>> got(
      kWorld * kMembers, absl::UnknownError("not run"));
  OnThreads(kWorld, kMembers, [&](int r, int m) {
    if (r == kLeaver && m == 1) {
      ranks.batching(r).Leave({"job", "m1", 0, 0}, spec);
      return;
    }
    const std::vector<float> ones(kElements, 1.0f);
    got[r * kMembers + m] = ranks.batching(r).RunBatched(
        {"job", spec.members[m], 0, 0}, spec,
        SumRound(0, ones, codecs::ElemType::kBF16));
  });
  for (int r = 0; r < kWorld; ++r) {
    const absl::StatusOr<codecs::RoundResult>& m0 = got[r * kMembers];
    ASSERT_TRUE(m0.ok()) << "rank " << r << ": " << m0.status();
    EXPECT_EQ(m0->world_size, kWorld);
    for (float v : m0->sum) EXPECT_NEAR(v, kWorld, 2.0) << "rank " << r;
    if (r != kLeaver) {
      const absl::StatusOr<codecs::RoundResult>& m1 = got[r * kMembers + 1];
      EXPECT_EQ(m1.status().code(), absl::StatusCode::kFailedPrecondition)
          << "rank " << r << ": " << m1.status();
      EXPECT_THAT(m1.status().message(),
                  HasSubstr("'m1' was in the sum of 256 of 257 ranks"));
    }
    EXPECT_EQ(ranks.inner_runs(r), 1) << "rank " << r;
  }
}

// A member that leaves on every rank: the others go on without it.
TEST(BatchingCollectiveTest, AMemberThatLeavesEverywhereLetsTheOthersGoOn) {
  constexpr int kWorld = 3;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b", "c"});
  std::vector<std::vector<float>> results(kWorld * 3);
  OnThreads(kWorld, 3, [&](int r, int m) {
    const std::string name = spec.members[m];
    if (name == "b") {
      ranks.batching(r).Leave({"job", name, 0, 0}, spec);
      return;
    }
    absl::StatusOr<codecs::RoundResult> result = ranks.batching(r).RunBatched(
        {"job", name, 0, 0}, spec, SumRound(0, Values(r, m, 0, 0, 4)));
    ASSERT_TRUE(result.ok()) << result.status();
    results[r * 3 + m] = result->sum;
    ranks.batching(r).Leave({"job", name, 0, 1}, spec);
  });
  for (int m : {0, 2}) {
    std::vector<float> expected(4, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      const std::vector<float> v = Values(r, m, 0, 0, 4);
      for (int i = 0; i < 4; ++i) expected[i] += v[i];
    }
    for (int r = 0; r < kWorld; ++r) EXPECT_EQ(results[r * 3 + m], expected);
  }
}

// A member that leaves while the others already wait for it wakes them,
// and they go on without it. Their member deadline is an hour away, so a
// lost wake-up shows as this test hanging until Bazel's timeout, not as a
// time measured here. The pause makes the others wait first in nearly
// every run; if they have not arrived within it, Leave comes first and the
// test checks the other order, which must succeed too.
TEST(BatchingCollectiveTest, AMemberLeavingWakesTheMembersWaitingForIt) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Hours(1));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<absl::Status> status(kWorld);
  OnThreads(kWorld, 2, [&](int r, int m) {
    if (m == 1) {
      absl::SleepFor(absl::Milliseconds(200));
      ranks.batching(r).Leave({"job", "b", 0, 0}, spec);
      return;
    }
    status[r] = ranks.batching(r)
                    .RunBatched({"job", "a", 0, 0}, spec,
                                SumRound(0, Values(r, 0, 0, 0, 4)))
                    .status();
    ranks.batching(r).Leave({"job", "a", 0, 1}, spec);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(status[r].ok()) << status[r];
}

// A member that leaves on one rank only: the others succeed everywhere;
// it fails on the ranks that sent it, naming how many ranks contributed.
TEST(BatchingCollectiveTest, AMemberLeftOnOneRankFailsOnlyThatMember) {
  constexpr int kWorld = 4;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<absl::Status> status(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    const std::string name = spec.members[m];
    if (name == "b" && r == 0) {
      ranks.batching(r).Leave({"job", name, 0, 0}, spec);
      return;
    }
    status[r * 2 + m] = ranks.batching(r)
                            .RunBatched({"job", name, 0, 0}, spec,
                                        SumRound(0, Values(r, m, 0, 0, 8)))
                            .status();
    ranks.batching(r).Leave({"job", name, 0, 1}, spec);
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(status[r * 2].ok()) << r;
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(status[r * 2 + 1].code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status[r * 2 + 1].message(),
                HasSubstr("'b' was in the sum of 3 of 4 ranks"));
  }
}

// A member that never comes: every member fails at the deadline with an
// error naming it, on every rank. The deadline leaves the members that do
// come time to arrive on a loaded machine (the error names every absent
// one).
TEST(BatchingCollectiveTest, AMissingMemberFailsTheBatchNamingIt) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(2));
  const BatchSpec spec = Spec("b", {"a", "b", "late"});
  std::vector<absl::Status> status(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    status[r * 2 + m] = ranks.batching(r)
                            .RunBatched({"job", spec.members[m], 0, 0}, spec,
                                        SumRound(0, Values(r, m, 0, 0, 8)))
                            .status();
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    // A member that a loaded machine held back past the deadline is named
    // beside it.
    EXPECT_THAT(std::string(s.message()),
                ::testing::ContainsRegex(
                    "members \\[([a-z]+, )*late(, [a-z]+)*\\] of 3"));
    EXPECT_THAT(s.message(), HasSubstr("batch 'b' round 0"));
  }
}

// Members whose rounds differ (not the same codec plan) fail with an error
// naming both.
// SUM members whose bodies differ in shape (a bucket's biases, which the
// policy sends dense) travel as one allgather message, and each sums every
// rank's body in rank order: the same bits on every rank.
TEST(BatchingCollectiveTest, SumMembersOfDifferentShapesShareOneAllgather) {
  constexpr int kWorld = 3;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<std::vector<float>> got(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    absl::StatusOr<codecs::RoundResult> result = ranks.batching(r).RunBatched(
        {"job", spec.members[m], 0, 0}, spec,
        SumRound(0, Values(r, m, 0, 0, 4 + 2 * m)));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->world_size, kWorld);
    got[r * 2 + m] = result->sum;
  });
  for (int m = 0; m < 2; ++m) {
    std::vector<float> expected(4 + 2 * m, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      const std::vector<float> v = Values(r, m, 0, 0, 4 + 2 * m);
      for (size_t i = 0; i < v.size(); ++i) expected[i] += v[i];
    }
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(got[r * 2 + m], expected) << "member " << m << " rank " << r;
    }
  }
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(ranks.inner_runs(r), 1);
}

// fp16 bodies keep their type in the batch payload (absence slots too).
TEST(BatchingCollectiveTest, HalfPrecisionBodiesSumAsTheyWould) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<std::vector<float>> batched(kWorld * 2), plain(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    const std::vector<float> v = Values(r, m, 0, 0, 16);
    absl::StatusOr<codecs::RoundResult> result =
        ranks.batching(r).RunBatched({"job", spec.members[m], 0, 0}, spec,
                                     SumRound(0, v, codecs::ElemType::kF16));
    ASSERT_TRUE(result.ok()) << result.status();
    batched[r * 2 + m] = result->sum;
    absl::StatusOr<codecs::RoundResult> alone = ranks.peer(r).Run(
        {"job", absl::StrCat("plain.", spec.members[m]), 0, 0},
        SumRound(0, v, codecs::ElemType::kF16));
    ASSERT_TRUE(alone.ok()) << alone.status();
    plain[r * 2 + m] = alone->sum;
  });
  EXPECT_EQ(batched, plain);
}

// Many batches of several jobs and steps at once, two rounds each: every
// member gets its own sum.
TEST(BatchingCollectiveTest, ManyBatchesConcurrently) {
  constexpr int kWorld = 3, kBatches = 6, kMembers = 4;
  constexpr size_t kElements = 5;
  Ranks ranks(kWorld, absl::Seconds(60));
  std::vector<BatchSpec> specs;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<std::string> names;
    for (int m = 0; m < kMembers; ++m) names.push_back(absl::StrCat(b, ".", m));
    specs.push_back(*MakeBatchSpec(absl::StrCat("batch", b), names));
  }
  std::vector<std::vector<float>> results(kWorld * kBatches * kMembers * 2);
  OnThreads(kWorld, kBatches * kMembers, [&](int r, int i) {
    const int b = i / kMembers, m = i % kMembers;
    const std::string job = absl::StrCat("job", b % 2);
    for (int round = 0; round < 2; ++round) {
      absl::StatusOr<codecs::RoundResult> result = ranks.batching(r).RunBatched(
          {job, specs[b].members[m], b, round}, specs[b],
          SumRound(round, Values(r, i, round, b, kElements)));
      ASSERT_TRUE(result.ok()) << result.status();
      results[(r * kBatches * kMembers + i) * 2 + round] = result->sum;
    }
    ranks.batching(r).Leave({job, specs[b].members[m], b, 2}, specs[b]);
  });
  for (int i = 0; i < kBatches * kMembers; ++i) {
    for (int round = 0; round < 2; ++round) {
      std::vector<float> expected(kElements, 0.0f);
      for (int r = 0; r < kWorld; ++r) {
        const std::vector<float> v =
            Values(r, i, round, i / kMembers, kElements);
        for (size_t k = 0; k < kElements; ++k) expected[k] += v[k];
      }
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(results[(r * kBatches * kMembers + i) * 2 + round], expected)
            << "member " << i << " round " << round << " rank " << r;
      }
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ranks.inner_runs(r), kBatches * 2);
  }
}

codecs::Round GatherRound(codecs::Bytes payload) {
  codecs::Round r;
  r.collective = codecs::Collective::kGather;
  r.payload = std::move(payload);
  return r;
}

// Member m's payload on rank r at `step`: a length that differs by member
// (m = 1 sends nothing) and bytes that differ by rank and step, all 256
// byte values among them.
codecs::Bytes GatherPayload(int r, int m, int step) {
  codecs::Bytes b;
  const size_t n = m == 1 ? 0 : 300 * m + 7 * r;
  for (size_t i = 0; i < n; ++i) {
    b.push_back(static_cast<char>((i * 31 + r * 7 + m * 3 + step) & 0xff));
  }
  return b;
}

// GATHER rounds of members of different sizes: each member gets every
// rank's payload of its own, in rank order, as an unbatched allgather
// would give it, with one inner collective per step and rank.
TEST(BatchingCollectiveTest, GatherRoundsTravelAsOneCollective) {
  constexpr int kWorld = 4, kMembers = 4, kSteps = 3;
  Ranks ranks(kWorld, absl::Seconds(60));
  const std::vector<std::string> names = {"m0", "m1", "m2", "m3"};
  const BatchSpec spec = *MakeBatchSpec("bucket0", names);
  std::vector<std::vector<codecs::Bytes>> got(kWorld * kMembers * kSteps);
  OnThreads(kWorld, kMembers, [&](int r, int m) {
    for (int step = 0; step < kSteps; ++step) {
      absl::StatusOr<codecs::RoundResult> result =
          ranks.batching(r).RunBatched({"job", names[m], step, 0}, spec,
                                       GatherRound(GatherPayload(r, m, step)));
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->world_size, kWorld);
      got[(r * kMembers + m) * kSteps + step] = result->payloads;
      ranks.batching(r).Leave({"job", names[m], step, 1}, spec);
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    for (int m = 0; m < kMembers; ++m) {
      for (int step = 0; step < kSteps; ++step) {
        const std::vector<codecs::Bytes>& payloads =
            got[(r * kMembers + m) * kSteps + step];
        ASSERT_EQ(payloads.size(), static_cast<size_t>(kWorld));
        for (int from = 0; from < kWorld; ++from) {
          EXPECT_EQ(payloads[from], GatherPayload(from, m, step))
              << "rank " << r << " member " << m << " step " << step << " from "
              << from;
        }
      }
    }
    EXPECT_EQ(ranks.inner_runs(r), kSteps) << "rank " << r;
  }
}

// A member left out on one rank fails on the others, naming how many
// ranks sent it; the rest of the batch goes on.
TEST(BatchingCollectiveTest, AGatherMemberLeftOnOneRankFailsOnlyThatMember) {
  constexpr int kWorld = 3;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<absl::Status> status(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    const std::string name = spec.members[m];
    if (name == "b" && r == 0) {
      ranks.batching(r).Leave({"job", name, 0, 0}, spec);
      return;
    }
    absl::StatusOr<codecs::RoundResult> result = ranks.batching(r).RunBatched(
        {"job", name, 0, 0}, spec, GatherRound(GatherPayload(r, m + 2, 0)));
    status[r * 2 + m] = result.status();
    ranks.batching(r).Leave({"job", name, 0, 1}, spec);
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(status[r * 2].ok()) << status[r * 2];
  }
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_EQ(status[r * 2 + 1].code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status[r * 2 + 1].message(),
                HasSubstr("'b' was gathered from 2 of 3 ranks; it left the "
                          "batch on rank 0 (an error there)"));
  }
}

// A round that mixes SUM and GATHER members (a top-k layer and its bias,
// sent dense) travels as one allgather: each member gets what its own
// collective would give it.
TEST(BatchingCollectiveTest, SumAndGatherMembersShareOneAllgather) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<codecs::RoundResult> got(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    const std::string name = spec.members[m];
    codecs::Round round = m == 0 ? SumRound(0, Values(r, m, 0, 0, 4))
                                 : GatherRound(GatherPayload(r, m + 2, 0));
    absl::StatusOr<codecs::RoundResult> result = ranks.batching(r).RunBatched(
        {"job", name, 0, 0}, spec, std::move(round));
    ASSERT_TRUE(result.ok()) << result.status();
    got[r * 2 + m] = *std::move(result);
    ranks.batching(r).Leave({"job", name, 0, 1}, spec);
  });
  std::vector<float> sum(4, 0.0f);
  for (int r = 0; r < kWorld; ++r) {
    const std::vector<float> v = Values(r, 0, 0, 0, 4);
    for (int i = 0; i < 4; ++i) sum[i] += v[i];
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(got[r * 2].sum, sum) << "rank " << r;
    EXPECT_THAT(
        got[r * 2 + 1].payloads,
        ::testing::ElementsAre(GatherPayload(0, 3, 0), GatherPayload(1, 3, 0)));
    EXPECT_EQ(ranks.inner_runs(r), 1) << "rank " << r;
  }
}

// A bucket's top-k layer "w" and two biases sent dense: on rank 0 the
// layer is refused before its round (a NaN) and leaves saying its round
// was GATHER. Rank 0's remaining members are all SUM of one shape, but it
// must still take the batch message, as rank 1 does with "w" there: the
// biases are summed at once on both ranks and "w" fails on rank 1 naming
// rank 0, rather than every member waiting out the deadline on two
// collectives that never meet. (Without the kind the ranks split, as a
// member that leaves before its codec is known still may.)
TEST(BatchingCollectiveTest,
     AGatherMemberLeftOnOneRankKeepsItsRanksOnTheMessage) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(60),
              /*collective_timeout=*/absl::Seconds(5));
  const BatchSpec spec = Spec("bucket", {"b1", "b2", "w"});
  std::vector<absl::StatusOr<codecs::RoundResult>> got(
      kWorld * 3, absl::UnknownError("not run"));
  OnThreads(kWorld, 3, [&](int r, int m) {
    const std::string name = spec.members[m];
    if (name == "w" && r == 0) {
      ranks.batching(r).Leave({"job", name, 0, 0}, spec,
                              codecs::Collective::kGather);
      return;
    }
    codecs::Round round = name == "w" ? GatherRound(GatherPayload(r, m + 2, 0))
                                      : SumRound(0, Values(r, m, 0, 0, 4));
    got[r * 3 + m] = ranks.batching(r).RunBatched({"job", name, 0, 0}, spec,
                                                  std::move(round));
    ranks.batching(r).Leave({"job", name, 0, 1}, spec);
  });
  for (int m = 0; m < 2; ++m) {
    std::vector<float> sum(4, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      const std::vector<float> v = Values(r, m, 0, 0, 4);
      for (int i = 0; i < 4; ++i) sum[i] += v[i];
    }
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(got[r * 3 + m].ok()) << spec.members[m] << " on rank " << r
                                       << ": " << got[r * 3 + m].status();
      EXPECT_EQ(got[r * 3 + m]->sum, sum);
    }
  }
  EXPECT_EQ(got[1 * 3 + 2].status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got[1 * 3 + 2].status().message(),
              HasSubstr("it left the batch on rank 0"));
}

// What another rank sent for a GATHER batch, as the inner collective
// returns it: `theirs` after this rank's own message.
class FakeGatherCollective : public Collective {
 public:
  explicit FakeGatherCollective(codecs::Bytes theirs)
      : theirs_(std::move(theirs)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  absl::StatusOr<codecs::RoundResult> Run(const RoundKey&,
                                          codecs::Round round) override {
    codecs::RoundResult result;
    result.world_size = 2;
    result.payloads = {std::move(round.payload), theirs_};
    return result;
  }
  absl::StatusOr<std::vector<codecs::Bytes>> AllToAll(
      const RoundKey&, std::vector<codecs::Bytes>) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<std::vector<codecs::Bytes>> Allgather(const RoundKey&,
                                                       codecs::Bytes) override {
    return absl::UnimplementedError("not in this test");
  }

 private:
  const codecs::Bytes theirs_;
};

// A malformed batch message from a peer fails the batch with an error
// naming that rank, never a read past its end.
TEST(BatchingCollectiveTest, AMalformedGatherBatchMessageIsRefused) {
  const BatchSpec spec = Spec("b", {"a"});
  const codecs::Bytes entry_header("\x01\x05\0\0\0\0\0\0\0", 9);
  const std::vector<std::pair<codecs::Bytes, std::string>> cases = {
      {"", "ends at member 0 of 1"},
      {entry_header + "abc", "bad entry for member 0"},
      {codecs::Bytes("\x02\0\0\0\0\0\0\0\0", 9), "presence 2"},
      {entry_header + "abcde" + "x", "1 bytes after its 1 members"},
  };
  for (const auto& [theirs, expected] : cases) {
    FakeGatherCollective inner(theirs);
    BatchingCollective batching(&inner, absl::Seconds(5));
    absl::StatusOr<codecs::RoundResult> result =
        batching.RunBatched({"job", "a", 0, 0}, spec, GatherRound("mine"));
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr("rank 1's batch message"));
    EXPECT_THAT(result.status().message(), HasSubstr(expected));
  }
  // Well formed, it gives both ranks' payloads.
  FakeGatherCollective inner(entry_header + "abcde");
  BatchingCollective batching(&inner, absl::Seconds(5));
  absl::StatusOr<codecs::RoundResult> result =
      batching.RunBatched({"job", "a", 0, 0}, spec, GatherRound("mine"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->payloads, ::testing::ElementsAre("mine", "abcde"));
}

// A SUM body over kMaxGatheredSumBytes (a large tensor sent dense) runs its
// own collective beside the batch's allgather, with the same sum.
TEST(BatchingCollectiveTest, ALargeSumBodyRunsItsOwnCollective) {
  constexpr int kWorld = 2;
  constexpr size_t kLarge = kMaxGatheredSumBytes / sizeof(float) + 1;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b", "c"});
  std::vector<codecs::RoundResult> got(kWorld * 3);
  OnThreads(kWorld, 3, [&](int r, int m) {
    codecs::Round round =
        m == 1 ? GatherRound(GatherPayload(r, 2, 0))
               : SumRound(0, Values(r, m, 0, 0, m == 0 ? kLarge : 4));
    absl::StatusOr<codecs::RoundResult> result = ranks.batching(r).RunBatched(
        {"job", spec.members[m], 0, 0}, spec, std::move(round));
    ASSERT_TRUE(result.ok()) << result.status();
    got[r * 3 + m] = *std::move(result);
  });
  for (int m : {0, 2}) {
    const size_t n = m == 0 ? kLarge : 4;
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < kWorld; ++r) {
      const std::vector<float> v = Values(r, m, 0, 0, n);
      for (size_t i = 0; i < n; ++i) sum[i] += v[i];
    }
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(got[r * 3 + m].sum, sum) << "member " << m << " rank " << r;
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(
        got[r * 3 + 1].payloads,
        ::testing::ElementsAre(GatherPayload(0, 2, 0), GatherPayload(1, 2, 0)));
    EXPECT_EQ(ranks.inner_runs(r), 2) << "rank " << r;
  }
}

// A peer whose SUM body for a member differs from this rank's (another
// shape, or no dense body) fails that member naming the rank; the batch's
// other members go on.
TEST(BatchingCollectiveTest, APeersSumBodyOfAnotherShapeFailsThatMember) {
  const BatchSpec spec = Spec("b", {"a", "b"});
  const std::vector<std::pair<codecs::Bytes, std::string>> bodies = {
      {SumRound(0, Values(1, 0, 0, 0, 5)).payload, "a body of 5 values"},
      {"not a payload", "rank 1 sent a SUM round without a usable dense body"},
      {PrescaledSumRound(Values(1, 0, 0, 0, 4), 2).payload,
       "parameter block 0100000002000000, rank 0 codec id"},
  };
  for (const auto& [theirs, expected] : bodies) {
    FakeGatherCollective inner(
        GatherMessage({theirs, GatherPayload(1, 2, 0)}, {true, true}));
    BatchingCollective batching(&inner, absl::Seconds(5));
    std::vector<absl::StatusOr<codecs::RoundResult>> got(
        2, absl::UnknownError("not run"));
    OnThreads(1, 2, [&](int, int m) {
      codecs::Round round = m == 0 ? SumRound(0, Values(0, 0, 0, 0, 4))
                                   : GatherRound(GatherPayload(0, 2, 0));
      got[m] = batching.RunBatched({"job", spec.members[m], 0, 0}, spec,
                                   std::move(round));
    });
    EXPECT_EQ(got[0].status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got[0].status().message(), HasSubstr("tensor 'a'"));
    EXPECT_THAT(got[0].status().message(), HasSubstr(expected));
    ASSERT_TRUE(got[1].ok()) << got[1].status();
    EXPECT_THAT(
        got[1]->payloads,
        ::testing::ElementsAre(GatherPayload(0, 2, 0), GatherPayload(1, 2, 0)));
  }
}

// Members summed as one body share a parameter block, which the other
// ranks' must match: a rank whose members differ in it fails them, on
// every rank, instead of each rank finishing the sum by its own.
TEST(BatchingCollectiveTest, SumMembersWhoseParametersDifferAcrossRanksFail) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<absl::StatusOr<codecs::RoundResult>> got(
      kWorld * 2, absl::UnknownError("not run"));
  OnThreads(kWorld, 2, [&](int r, int m) {
    got[r * 2 + m] = ranks.batching(r).RunBatched(
        {"job", spec.members[m], 0, 0}, spec,
        PrescaledSumRound(Values(r, m, 0, 0, 4), r == 0 ? 2 : 1));
  });
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].status().code(), absl::StatusCode::kInvalidArgument)
        << i << ": " << got[i].status();
    EXPECT_THAT(got[i].status().message(), HasSubstr("parameter block"));
  }
}

// A released job's batch records go with it: a rerun of the job (from a
// checkpoint) that reaches the same step finds no member that left the old
// run's batch there (before, it failed with "left the batch at round 0").
// The inner collective forgets the job too.
TEST(BatchingCollectiveTest, ForgetJobLetsARerunReachTheSameStep) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  // The old run: member 'a' failed before the batch, 'b' never came (the
  // trainer died); the record of step 0 stays.
  for (int r = 0; r < kWorld; ++r) {
    ranks.batching(r).Leave({"job", "a", 0, 0}, spec);
    ranks.batching(r).ForgetJob("job");
    EXPECT_THAT(ranks.inner_forgotten(r), ::testing::ElementsAre("job"));
  }
  std::vector<absl::Status> status(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    const std::string name = spec.members[m];
    status[r * 2 + m] = ranks.batching(r)
                            .RunBatched({"job", name, 0, 0}, spec,
                                        SumRound(0, Values(r, m, 0, 0, 4)))
                            .status();
    ranks.batching(r).Leave({"job", name, 0, 1}, spec);
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

// Forgetting a job leaves alone the record of a round a member waits in
// (it holds the record): the member goes on when the others come. The
// pause lets member 'a' wait before the job is forgotten in nearly every
// run; in the other order the test checks that forgetting an idle record
// breaks nothing either. One rank: forgetting the job in the inner
// collective too would drop a faster peer's message for the round.
TEST(BatchingCollectiveTest, ForgetJobLeavesAWaitingMemberAlone) {
  constexpr int kWorld = 1;
  Ranks ranks(kWorld, absl::Seconds(60));
  const BatchSpec spec = Spec("b", {"a", "b"});
  std::vector<absl::Status> status(kWorld * 2);
  OnThreads(kWorld, 2, [&](int r, int m) {
    const std::string name = spec.members[m];
    if (name == "b") {
      absl::SleepFor(absl::Milliseconds(200));
      ranks.batching(r).ForgetJob("job");
    }
    status[r * 2 + m] = ranks.batching(r)
                            .RunBatched({"job", name, 0, 0}, spec,
                                        SumRound(0, Values(r, m, 0, 0, 4)))
                            .status();
    ranks.batching(r).Leave({"job", name, 0, 1}, spec);
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

// Shutdown ends the waits of a batch at once: a member waiting for the
// rest of its batch (member 'b' never comes), and the batch's collective
// waiting for a peer (rank 1 never comes). The pause lets them wait first
// in nearly every run; in the other order they are refused at once with
// the same reason. Without it they would wait for the 60 s deadlines.
TEST(BatchingCollectiveTest, ShutdownEndsTheWaitsForMembersAndPeers) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(60));
  const absl::Status stopping =
      absl::UnavailableError("rank 0 is shutting down (SIGTERM)");
  const BatchSpec alone = Spec("alone", {"a", "b"});
  const BatchSpec whole = Spec("whole", {"c", "d"});
  std::vector<absl::Status> status(3);
  std::vector<std::thread> members;
  members.emplace_back([&] {
    status[0] = ranks.batching(0)
                    .RunBatched({"job", "a", 0, 0}, alone,
                                SumRound(0, Values(0, 0, 0, 0, 4)))
                    .status();
  });
  for (int m = 0; m < 2; ++m) {
    members.emplace_back([&, m] {
      status[1 + m] = ranks.batching(0)
                          .RunBatched({"job", whole.members[m], 0, 0}, whole,
                                      SumRound(0, Values(0, m, 0, 0, 4)))
                          .status();
    });
  }
  absl::SleepFor(absl::Milliseconds(200));
  ranks.batching(0).Shutdown(stopping);
  for (std::thread& t : members) t.join();
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 0 is shutting down")) << s;
  }
  EXPECT_EQ(ranks.batching(0)
                .RunBatched({"job", "b", 1, 0}, alone,
                            SumRound(0, Values(0, 1, 0, 1, 4)))
                .status(),
            stopping);
}

// The plain exchanges reach the inner collective unchanged.
TEST(BatchingCollectiveTest, OtherExchangesPassThrough) {
  constexpr int kWorld = 2;
  Ranks ranks(kWorld, absl::Seconds(60));
  std::vector<std::vector<codecs::Bytes>> gathered(kWorld), swapped(kWorld);
  OnThreads(kWorld, 1, [&](int r, int) {
    const codecs::Bytes mine = absl::StrCat("rank ", r);
    absl::StatusOr<std::vector<codecs::Bytes>> all =
        ranks.batching(r).Allgather({"job", "t", 0, 0}, mine);
    ASSERT_TRUE(all.ok()) << all.status();
    gathered[r] = *all;
    const int other[] = {1 - r};
    absl::StatusOr<std::vector<codecs::Bytes>> theirs =
        ranks.batching(r).ExchangeWithNeighbours({"job", "g", 0, 0}, other,
                                                 {mine});
    ASSERT_TRUE(theirs.ok()) << theirs.status();
    swapped[r] = *theirs;
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(gathered[r], ::testing::ElementsAre("rank 0", "rank 1"));
    EXPECT_THAT(swapped[r],
                ::testing::ElementsAre(absl::StrCat("rank ", 1 - r)));
  }
}

}  // namespace
}  // namespace gradcomp::service
