#include "codecs/testing/golden.h"

#include <memory>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/builtin.h"
#include "codecs/random.h"

namespace gradcomp::codecs::testing {

const std::vector<GoldenCase>& GoldenCases() {
  static const auto* const cases = new std::vector<GoldenCase>{
      {"none", "none", {}, {4, 33}},
      {"fp16", "fp16", {}, {4, 33}},
      {"fp16_prescale", "fp16", {{"prescale", "true"}}, {4, 33}, 4, 1},
      {"bf16", "bf16", {}, {4, 33}},
      // Three steps, so that momentum, accumulation and masking are pinned.
      {"topk", "topk", {{"ratio", "0.05"}}, {4, 33}, 1, 0, 2, 2},
      {"topk_nesterov_exact",
       "topk",
       {{"ratio", "0.1"}, {"sample", "1"}, {"nesterov", "true"}},
       {4, 33},
       1,
       0,
       1,
       1},
      {"qsgd", "qsgd", {}, {4, 33}},
      // Rank 1 pins the per-worker rounding stream; 3 bits pins odd packing.
      {"qsgd_3bit_rank1",
       "qsgd",
       {{"bits", "3"}, {"bucket", "50"}},
       {4, 33},
       2,
       1},
      // Polar: 2.5 bits on blocks of 16 pins raw, polar-coded and unsent
      // planes and the tail block; seed mode pins the int16 wrap.
      {"polar_planes",
       "polar",
       {{"bits_per_value", "2.5"}, {"log2_block", "4"}, {"bucket", "50"}},
       {4, 33}},
      {"polar_seed", "polar", {{"mode", "seed"}, {"log2_block", "4"}}, {4, 33}},
      // Random-k pins the Floyd index draw; with error feedback three steps
      // pin the residual.
      {"randomk", "randomk", {{"ratio", "0.1"}}, {4, 33}},
      {"randomk_error_feedback",
       "randomk",
       {{"ratio", "0.1"}, {"error_feedback", "true"}},
       {4, 33},
       1,
       0,
       2,
       2},
      {"threshold", "threshold", {}, {4, 33}, 1, 0, 2, 2},
      {"threshold_absolute", "threshold", {{"tau", "3"}}, {4, 33}, 1, 0, 1, 1},
      {"terngrad", "terngrad", {}, {4, 33}},
      // Buckets of 7 cross code bytes; rank 1 pins the per-worker stream.
      {"terngrad_unclipped_bucket7_rank1",
       "terngrad",
       {{"clip_sigma", "0"}, {"bucket", "7"}},
       {4, 33},
       2,
       1},
      {"int8", "int8", {}, {4, 33}},
      {"int8_stochastic_rank1",
       "int8",
       {{"stochastic", "true"}, {"bucket", "50"}},
       {4, 33},
       2,
       1},
      // Sign family: three steps pin efsign's residual and signum's
      // momentum; onebit as [4, 33] (33 narrow columns) and as one column.
      {"signsgd", "signsgd", {}, {4, 33}},
      {"efsign", "efsign", {}, {4, 33}, 1, 0, 2, 2},
      {"signum", "signum", {}, {4, 33}, 1, 0, 2, 2},
      {"onebit", "onebit", {}, {4, 33}, 1, 0, 2, 2},
      {"onebit_1d", "onebit", {}, {132}},
      // PowerSGD's round 0 (P from the Philox Q) at [8, 33]; [4, 33] is
      // below the compression rate and goes dense.
      {"powersgd", "powersgd", {}, {8, 33}},
      {"powersgd_dense", "powersgd", {}, {4, 33}},
      // ATOMO: spectral atoms, and entry atoms on rank 1's stream.
      {"atomo", "atomo", {}, {4, 33}},
      {"atomo_entry",
       "atomo",
       {{"atoms", "entry"}, {"budget", "0.1"}},
       {4, 33},
       2,
       1},
  };
  return *cases;
}

std::vector<float> GoldenInput(const GoldenCase& c, int64_t step) {
  size_t n = 1;
  for (int64_t d : c.shape) n *= static_cast<size_t>(d);
  std::vector<float> values(n);
  PhiloxStream(/*seed=*/2024, TensorId(c.file), step,
               static_cast<uint32_t>(c.rank))
      .FillUniform(0, absl::MakeSpan(values));
  for (float& v : values) v = (v - 0.5f) * 8.0f;
  const float specials[] = {0.0f, -0.0f, 1e-8f, 65504.0f, -70000.0f, 0.1f};
  for (size_t i = 0; i < n && i < sizeof(specials) / sizeof(specials[0]); ++i) {
    values[i] = specials[i];
  }
  return values;
}

absl::StatusOr<Bytes> MakeGoldenPayload(const GoldenCase& c) {
  GC_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec,
                      BuiltinCodecs().Create(c.codec, CodecParams(c.params)));
  // A single-round codec's Encode itself: each warm-up step's state then
  // stands, as after a step that completed (a session that ends before its
  // round did reverts it).
  const auto* single = dynamic_cast<const SingleRoundCodec*>(codec.get());
  TensorState state;
  Bytes payload;
  for (int64_t step = c.step - c.warmup_steps; step <= c.step; ++step) {
    const std::vector<float> grad = GoldenInput(c, step);
    StepContext ctx;
    ctx.seed = 2024;
    ctx.tensor_id = TensorId(c.file);
    ctx.step = step;
    ctx.rank = c.rank;
    ctx.world_size = c.world_size;
    if (single != nullptr) {
      payload.clear();
      GC_RETURN_IF_ERROR(
          single->Encode(TensorView{grad, c.shape}, state, ctx, &payload));
      continue;
    }
    if (step != c.step) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "golden '%s': warm-up steps need a single-round codec", c.file));
    }
    GC_ASSIGN_OR_RETURN(std::unique_ptr<CodecSession> session,
                        codec->Start(TensorView{grad, c.shape}, state, ctx));
    GC_ASSIGN_OR_RETURN(std::optional<Round> round, session->NextRound());
    if (!round.has_value()) {
      return absl::InternalError(
          absl::StrFormat("golden '%s': the codec produced no round", c.file));
    }
    payload = std::move(round->payload);
  }
  return payload;
}

}  // namespace gradcomp::codecs::testing
