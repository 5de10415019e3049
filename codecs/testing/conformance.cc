#include "codecs/testing/conformance.h"

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/builtin.h"
#include "codecs/wire.h"

namespace gradcomp::codecs::testing {

std::string ConformanceCaseName(
    const ::testing::TestParamInfo<ConformanceCase>& info) {
  std::string name = info.param.codec;
  if (!info.param.label.empty()) absl::StrAppend(&name, "_", info.param.label);
  return name;
}

absl::StatusOr<std::vector<float>> SumDenseBodies(
    const std::vector<Bytes>& payloads) {
  std::vector<float> sum;
  absl::string_view first_params;
  for (size_t r = 0; r < payloads.size(); ++r) {
    GC_ASSIGN_OR_RETURN(ParsedPayload parsed, PeekPayload(payloads[r]));
    // Bodies can be added only when they mean the same thing: same element
    // type, same scale, same layout, i.e. the same parameter block.
    if (r == 0) {
      first_params = parsed.params;
      GC_ASSIGN_OR_RETURN(const size_t elements, DenseBodyElements(parsed));
      sum.assign(elements, 0.0f);
    } else if (parsed.params != first_params) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sum collective: payload of rank %d has other parameters than rank 0",
          r));
    }
    GC_RETURN_IF_ERROR(AddDenseBody(parsed, 1.0f, absl::MakeSpan(sum)));
  }
  return sum;
}

absl::StatusOr<SimulatedStep> SimulateStep(
    const Codec& codec, const std::vector<std::vector<float>>& grads,
    absl::Span<const int64_t> shape, std::vector<TensorState>& states,
    StepContext ctx, std::optional<int> fail_round) {
  const int world = static_cast<int>(grads.size());
  if (world < 1 || states.size() != grads.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SimulateStep: expected one state per gradient (>= 1), got %d and %d",
        states.size(), grads.size()));
  }
  std::vector<std::unique_ptr<CodecSession>> sessions;
  for (int r = 0; r < world; ++r) {
    StepContext worker = ctx;
    worker.rank = r;
    worker.world_size = world;
    GC_ASSIGN_OR_RETURN(
        std::unique_ptr<CodecSession> session,
        codec.Start(TensorView{grads[r], shape}, states[r], worker));
    sessions.push_back(std::move(session));
  }
  SimulatedStep step;
  // No codec has more rounds than this; a session that never ends is a bug.
  constexpr int kMaxRounds = 16;
  for (int round = 0;; ++round) {
    if (round == kMaxRounds) {
      return absl::InternalError(
          absl::StrFormat("SimulateStep: %s still has rounds after %d",
                          codec.info().name, kMaxRounds));
    }
    std::vector<Bytes> payloads;
    std::optional<Collective> collective;
    int done = 0;
    for (int r = 0; r < world; ++r) {
      GC_ASSIGN_OR_RETURN(std::optional<Round> next, sessions[r]->NextRound());
      if (!next.has_value()) {
        ++done;
        continue;
      }
      if (collective.has_value() && *collective != next->collective) {
        return absl::InternalError(
            "SimulateStep: workers asked for different collectives");
      }
      collective = next->collective;
      payloads.push_back(std::move(next->payload));
    }
    if (done == world) break;
    if (done != 0) {
      return absl::InternalError(absl::StrFormat(
          "SimulateStep: round %d: %d of %d workers had no round", round, done,
          world));
    }
    if (fail_round == round) {
      return absl::AbortedError(
          absl::StrFormat("SimulateStep: round %d failed, as asked", round));
    }
    RoundResult result;
    result.world_size = world;
    if (*collective == Collective::kSum) {
      GC_ASSIGN_OR_RETURN(result.sum, SumDenseBodies(payloads));
    } else {
      result.payloads = payloads;
    }
    for (int r = 0; r < world; ++r) {
      GC_RETURN_IF_ERROR(sessions[r]->Absorb(result));
    }
    step.payloads.push_back(std::move(payloads));
    step.collectives.push_back(*collective);
  }
  for (int r = 0; r < world; ++r) {
    std::vector<float> out(grads[r].size(), std::nanf(""));
    std::vector<float> own(grads[r].size(), std::nanf(""));
    GC_RETURN_IF_ERROR(sessions[r]->Finish(absl::MakeSpan(out)));
    GC_RETURN_IF_ERROR(sessions[r]->DecodeOwn(absl::MakeSpan(own)));
    step.out.push_back(std::move(out));
    step.own.push_back(std::move(own));
  }
  return step;
}

void CodecConformanceTest::SetUp() {
  const ConformanceCase& c = GetParam();
  const CodecRegistry& registry =
      c.registry != nullptr ? *c.registry : BuiltinCodecs();
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      registry.Create(c.codec, CodecParams(c.params));
  ASSERT_TRUE(codec.ok()) << codec.status();
  codec_ = std::move(*codec);
  single_ = dynamic_cast<const SingleRoundCodec*>(codec_.get());
}

// Codecs register this suite's rows in their own tests; a binary that links
// the suite without rows is not an error.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CodecConformanceTest);

namespace {

const std::vector<int64_t> kShape = {17, 241};
constexpr size_t kNumel = 17 * 241;

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

double Norm(absl::Span<const float> a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double Distance(absl::Span<const float> a, absl::Span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s);
}

double Dot(absl::Span<const float> a, absl::Span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Student's t of the mean of `samples` against `expected`: (mean -
// expected) / (sd / sqrt(K)). Samples with no spread beyond the rounding of
// their sum (a deterministic codec) must equal `expected` to float
// rounding and give 0; otherwise they give +-infinity.
double StudentT(absl::Span<const double> samples, double expected) {
  const double k = static_cast<double>(samples.size());
  double sum = 0;
  for (double x : samples) sum += x;
  const double mean = sum / k;
  double square_sum = 0;
  for (double x : samples) square_sum += (x - mean) * (x - mean);
  const double standard_error = std::sqrt(square_sum / (k - 1) / k);
  const double gap = mean - expected;
  const double scale = std::abs(expected) + 1;
  if (standard_error <= 1e-12 * scale) {
    return std::abs(gap) <= 1e-6 * scale ? 0 : std::copysign(INFINITY, gap);
  }
  return gap / standard_error;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

StepContext Context(int64_t step = 5) {
  StepContext ctx;
  ctx.seed = 0x5eed;
  ctx.tensor_id = 77;
  ctx.step = step;
  return ctx;
}

// One worker's step on fresh state.
absl::StatusOr<SimulatedStep> Single(const Codec& codec,
                                     const std::vector<float>& g,
                                     absl::Span<const int64_t> shape,
                                     StepContext ctx = Context()) {
  std::vector<TensorState> states(1);
  return SimulateStep(codec, {g}, shape, states, ctx);
}

TEST_P(CodecConformanceTest, RoundTripErrorIsWithinTheDeclaredBound) {
  const std::vector<float> g = Gaussian(kNumel, 1);
  absl::StatusOr<SimulatedStep> step = Single(*codec_, g, kShape);
  ASSERT_TRUE(step.ok()) << step.status();
  const double rel = Distance(step->out[0], g) / Norm(g);
  if (GetParam().max_rel_error != kNoErrorBound) {
    EXPECT_LE(rel, GetParam().max_rel_error);
  }
  // With one worker, the average is the worker's own decode.
  EXPECT_LE(Distance(step->out[0], step->own[0]), 1e-6 * Norm(g));
}

TEST_P(CodecConformanceTest, InfoMatchesWhatTheCodecDoes) {
  const ConformanceCase& c = GetParam();
  EXPECT_EQ(codec_->info().name, c.codec);
  absl::StatusOr<SimulatedStep> step =
      Single(*codec_, Gaussian(kNumel, 2), kShape);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(static_cast<int>(step->payloads.size()), codec_->info().rounds);
  for (size_t round = 0; round < step->payloads.size(); ++round) {
    absl::StatusOr<ParsedPayload> parsed =
        PeekPayload(step->payloads[round][0]);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->header.codec, codec_->info().id);
    EXPECT_EQ(parsed->header.round, round);
    EXPECT_EQ(parsed->header.numel, kNumel);
    EXPECT_EQ(step->collectives[round] == Collective::kSum,
              codec_->info().summable);
  }
}

TEST_P(CodecConformanceTest, DecodeOwnIsDecodeAddOfTheOwnPayload) {
  if (single_ == nullptr) GTEST_SKIP() << "not a single-round codec";
  const std::vector<float> g = Gaussian(kNumel, 3);
  absl::StatusOr<SimulatedStep> step = Single(*codec_, g, kShape);
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<float> decoded(kNumel, 0.0f);
  ASSERT_TRUE(
      single_->DecodeAdd(step->payloads[0][0], 1.0f, absl::MakeSpan(decoded))
          .ok());
  EXPECT_TRUE(SameBits(decoded, step->own[0]));
  // alpha scales, and the accumulator's content is added to.
  std::vector<float> acc(kNumel, 1.0f);
  ASSERT_TRUE(
      single_->DecodeAdd(step->payloads[0][0], -2.0f, absl::MakeSpan(acc))
          .ok());
  for (size_t i = 0; i < kNumel; ++i) {
    ASSERT_NEAR(acc[i], 1.0f - 2.0f * decoded[i],
                1e-6f * (1.0f + 2.0f * std::fabs(decoded[i])))
        << i;
  }
}

// Small payloads, so that every byte and every length can be tried.
class PayloadAbuse {
 public:
  PayloadAbuse(const SingleRoundCodec& codec, Bytes payload, size_t numel)
      : codec_(codec), payload_(std::move(payload)), numel_(numel) {}

  const Bytes& payload() const { return payload_; }

  // Decodes `bad` into a sentinel accumulator: must be InvalidArgument and
  // leave it untouched, unless `may_pass`, when OK is also fine.
  void Expect(const Bytes& bad, const std::string& what,
              bool may_pass = false) {
    std::vector<float> acc(numel_, 7.0f);
    const absl::Status s = codec_.DecodeAdd(bad, 1.0f, absl::MakeSpan(acc));
    if (may_pass && s.ok()) return;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << s;
    EXPECT_TRUE(SameBits(acc, std::vector<float>(numel_, 7.0f)))
        << what << ": the accumulator changed";
  }

 private:
  const SingleRoundCodec& codec_;
  Bytes payload_;
  size_t numel_;
};

}  // namespace

TEST_P(CodecConformanceTest, EveryCorruptHeaderByteIsRejected) {
  if (single_ == nullptr) GTEST_SKIP() << "not a single-round codec";
  absl::StatusOr<SimulatedStep> step =
      Single(*codec_, Gaussian(100, 4), {10, 10});
  ASSERT_TRUE(step.ok()) << step.status();
  PayloadAbuse abuse(*single_, step->payloads[0][0], 100);
  for (size_t i = 0; i < kWireHeaderBytes; ++i) {
    for (unsigned mask : {0x01u, 0x02u, 0x80u, 0xFFu}) {
      Bytes bad = abuse.payload();
      bad[i] = static_cast<char>(bad[i] ^ mask);
      abuse.Expect(bad, absl::StrFormat("header byte %d ^ 0x%02x", i, mask));
    }
  }
}

TEST_P(CodecConformanceTest, EveryTruncationAndAnyPaddingIsRejected) {
  if (single_ == nullptr) GTEST_SKIP() << "not a single-round codec";
  absl::StatusOr<SimulatedStep> step =
      Single(*codec_, Gaussian(100, 4), {10, 10});
  ASSERT_TRUE(step.ok()) << step.status();
  PayloadAbuse abuse(*single_, step->payloads[0][0], 100);
  const Bytes& p = abuse.payload();
  for (size_t len = 0; len < p.size(); ++len) {
    abuse.Expect(p.substr(0, len), absl::StrCat("truncated to ", len));
  }
  abuse.Expect(p + "x", "one byte appended");
  abuse.Expect(p + std::string(8, '\0'), "eight zero bytes appended");
  // Bytes appended with a body length that claims them: consistent for the
  // wire format, so the codec itself must notice the body is too long.
  for (size_t extra : {1, 4, 8}) {
    Bytes longer = p + std::string(extra, '\0');
    uint64_t body_len = 0;
    for (int b = 0; b < 8; ++b) {
      body_len |=
          static_cast<uint64_t>(static_cast<unsigned char>(longer[24 + b]))
          << (8 * b);
    }
    body_len += extra;
    for (int b = 0; b < 8; ++b)
      longer[24 + b] = static_cast<char>(body_len >> (8 * b));
    abuse.Expect(longer, absl::StrCat(extra, " bytes appended to the body"));
  }
}

TEST_P(CodecConformanceTest, CorruptBodiesNeverCrashOrHalfWrite) {
  if (single_ == nullptr) GTEST_SKIP() << "not a single-round codec";
  absl::StatusOr<SimulatedStep> step =
      Single(*codec_, Gaussian(100, 4), {10, 10});
  ASSERT_TRUE(step.ok()) << step.status();
  PayloadAbuse abuse(*single_, step->payloads[0][0], 100);
  const Bytes& p = abuse.payload();
  if (p.size() == kWireHeaderBytes) GTEST_SKIP() << "no parameters or body";
  std::mt19937 gen(11);
  for (int trial = 0; trial < 500; ++trial) {
    Bytes bad = p;
    const int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f) {
      const size_t at =
          kWireHeaderBytes + gen() % (p.size() - kWireHeaderBytes);
      bad[at] = static_cast<char>(gen());
    }
    // A changed value can be a valid payload; a rejected one must be clean.
    abuse.Expect(bad, absl::StrCat("body corruption ", trial),
                 /*may_pass=*/true);
  }
}

TEST_P(CodecConformanceTest, ZeroGradientGivesZeroAverage) {
  const std::vector<float> zero(kNumel, 0.0f);
  for (int world : {1, 3}) {
    std::vector<TensorState> states(world);
    absl::StatusOr<SimulatedStep> step =
        SimulateStep(*codec_, std::vector<std::vector<float>>(world, zero),
                     kShape, states, Context());
    ASSERT_TRUE(step.ok()) << step.status();
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < kNumel; ++i) {
        ASSERT_EQ(step->out[r][i], 0.0f) << "rank " << r << " element " << i;
      }
    }
  }
}

TEST_P(CodecConformanceTest, TinyAndEmptyTensorsWork) {
  const std::vector<std::vector<int64_t>> shapes = {
      {0}, {1}, {2}, {3}, {1, 1}, {2, 3}, {3, 1}, {0, 5}};
  for (const std::vector<int64_t>& shape : shapes) {
    size_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<TensorState> states(2);
    absl::StatusOr<SimulatedStep> step = SimulateStep(
        *codec_, {Gaussian(n, 5), Gaussian(n, 6)}, shape, states, Context());
    ASSERT_TRUE(step.ok()) << "numel " << n << ": " << step.status();
    for (const std::vector<float>& out : step->out) {
      ASSERT_EQ(out.size(), n);
      for (float v : out) EXPECT_TRUE(std::isfinite(v)) << "numel " << n;
      EXPECT_TRUE(SameBits(out, step->out[0])) << "numel " << n;
    }
    if (n == 0) continue;
    // Not just finite: the mean of what each worker sent, as for large
    // tensors; and exact where the row says the codec is (its bound is
    // for standard-normal tensors of 4097 values, which a few values need
    // not meet: an absolute threshold sends none of them, a majority vote
    // of two is a coin's sign).
    const std::vector<float> g0 = Gaussian(n, 5), g1 = Gaussian(n, 6);
    std::vector<float> mean(n), mean_own(n);
    for (size_t i = 0; i < n; ++i) {
      mean[i] = 0.5f * (g0[i] + g1[i]);
      mean_own[i] = 0.5f * (step->own[0][i] + step->own[1][i]);
    }
    if (single_ != nullptr && !codec_->info().majority_vote) {
      EXPECT_LE(Distance(step->out[0], mean_own),
                1e-5 * (Norm(mean_own) + 1e-6))
          << "numel " << n;
    }
    if (GetParam().max_rel_error <= 1e-5) {
      EXPECT_LE(Distance(step->out[0], mean),
                GetParam().max_rel_error * 0.5 * (Norm(g0) + Norm(g1)) + 1e-6)
          << "numel " << n;
    }
  }
}

// Determinism from run to run; the same bytes whatever the core count is
// codecs/cpu/thread_count_test.cc.
TEST_P(CodecConformanceTest, SameInputsGiveSameBytesInEveryRun) {
  constexpr int kWorld = 3;
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < kWorld; ++r) grads.push_back(Gaussian(kNumel, 10 + r));
  std::vector<std::vector<std::vector<Bytes>>> runs;
  for (int run = 0; run < 2; ++run) {
    std::vector<TensorState> states(kWorld);
    std::vector<std::vector<Bytes>> payloads;
    // Three steps, so that state carried between steps is covered.
    for (int64_t s = 0; s < 3; ++s) {
      absl::StatusOr<SimulatedStep> step =
          SimulateStep(*codec_, grads, kShape, states, Context(s));
      ASSERT_TRUE(step.ok()) << step.status();
      for (auto& round : step->payloads) payloads.push_back(round);
    }
    runs.push_back(std::move(payloads));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(runs[0][i][r] == runs[1][i][r])
          << "round " << i << " rank " << r;
    }
  }
}

// A step whose collective fails (a peer died) ends every session unfinished.
// The state must then be as if the step had never started, so that what
// the trainer does next gives what it gives without the failure, to within
// rounding: running the step again, or skipping it. Otherwise error
// feedback or momentum would have lost, or counted twice, what the failed
// step took.
TEST_P(CodecConformanceTest, AStepWhoseRoundFailsLeavesTheStateAsItWas) {
  constexpr int kWorld = 2;
  // A wrong momentum reaches v, and so the payload, a step later than it
  // reaches u: three steps follow the failed one.
  constexpr int kSteps = 6;
  constexpr int kFailedStep = 2;
  std::vector<std::vector<std::vector<float>>> grads(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    for (int r = 0; r < kWorld; ++r) {
      grads[s].push_back(Gaussian(kNumel, 200 + 10 * s + r));
    }
  }
  // The outputs of the steps after the failed one (or of where it would
  // be), by step. `fail_round`: the failed step's round that fails, or none
  // for a run without the failure; `rerun`: whether the failed step runs.
  const auto run = [&](std::optional<int> fail_round, bool rerun) {
    std::vector<TensorState> states(kWorld);
    std::map<int, std::vector<std::vector<float>>> outs;
    for (int s = 0; s < kSteps; ++s) {
      if (s == kFailedStep && fail_round.has_value()) {
        absl::StatusOr<SimulatedStep> failed = SimulateStep(
            *codec_, grads[s], kShape, states, Context(s), fail_round);
        EXPECT_TRUE(absl::IsAborted(failed.status())) << failed.status();
      }
      if (s == kFailedStep && !rerun) continue;
      absl::StatusOr<SimulatedStep> step =
          SimulateStep(*codec_, grads[s], kShape, states, Context(s));
      EXPECT_TRUE(step.ok()) << step.status();
      if (step.ok() && s >= kFailedStep) outs[s] = std::move(step->out);
    }
    return outs;
  };
  for (const bool rerun : {true, false}) {
    const auto clean = run(std::nullopt, rerun);
    for (int round = 0; round < codec_->info().rounds; ++round) {
      const auto failed = run(round, rerun);
      ASSERT_EQ(failed.size(), clean.size());
      for (const auto& [s, outs] : clean) {
        for (int r = 0; r < kWorld; ++r) {
          EXPECT_LE(Distance(failed.at(s)[r], outs[r]), 1e-5 * Norm(outs[r]))
              << (rerun ? "rerun" : "skipped") << " after round " << round
              << " failed; step " << s << ", rank " << r;
        }
      }
    }
  }
}

TEST_P(CodecConformanceTest, WorkersAgreeOnTheAverageOfTheirOwnDecodes) {
  constexpr int kWorld = 4;
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < kWorld; ++r) grads.push_back(Gaussian(kNumel, 20 + r));
  std::vector<TensorState> states(kWorld);
  absl::StatusOr<SimulatedStep> step =
      SimulateStep(*codec_, grads, kShape, states, Context());
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<float> mean_own(kNumel, 0.0f);
  for (size_t i = 0; i < kNumel; ++i) {
    double s = 0;
    for (int r = 0; r < kWorld; ++r) s += step->own[r][i];
    mean_own[i] = static_cast<float>(s / kWorld);
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(SameBits(step->out[r], step->out[0])) << "rank " << r;
  }
  // Single-round codecs average what each worker sent; multi-round ones
  // (PowerSGD) decode jointly and majority votes (signSGD) are not means,
  // so only their agreement is checked above.
  if (single_ != nullptr && !codec_->info().majority_vote) {
    EXPECT_LE(Distance(step->out[0], mean_own), 1e-5 * (Norm(mean_own) + 1e-6));
  }
}

// E[decode(g)] = g, tested on K independent draws (the step changes the
// random stream) through their projections on three directions: g itself
// (a wrong scale, or an all-zero decode), an independent Gaussian and the
// all-ones vector (an offset across g). Each draw's projection is one
// sample, so each mean has a t statistic with K - 1 = 63 degrees of
// freedom; |t| > 4.5 has probability about 3e-5 for an unbiased codec.
// At these seeds every row's |t| is below 1.6; an all-zero decode fails
// every row, and a decode scaled by 0.8 every row but spectral ATOMO's
// (whose draws vary too much for 64 to show it; atomo_test checks it per
// element, as each codec's own test does).
TEST_P(CodecConformanceTest, UnbiasedCodecsAreUnbiasedOnAverage) {
  if (!codec_->info().unbiased) GTEST_SKIP() << "not declared unbiased";
  constexpr int kDraws = 64;
  const std::vector<float> g = Gaussian(kNumel, 30);
  const std::vector<float> directions[] = {g, Gaussian(kNumel, 31),
                                           std::vector<float>(kNumel, 1.0f)};
  constexpr const char* kNames[] = {"g", "a random direction", "all ones"};
  std::vector<double> projections[3];
  for (int k = 0; k < kDraws; ++k) {
    absl::StatusOr<SimulatedStep> step = Single(*codec_, g, kShape, Context(k));
    ASSERT_TRUE(step.ok()) << step.status();
    for (int d = 0; d < 3; ++d) {
      projections[d].push_back(Dot(step->own[0], directions[d]));
    }
  }
  for (int d = 0; d < 3; ++d) {
    EXPECT_LE(std::abs(StudentT(projections[d], Dot(g, directions[d]))), 4.5)
        << "the mean decode's projection on " << kNames[d];
  }
}

}  // namespace gradcomp::codecs::testing
