#include "codecs/cpu/momentum.h"

#include <cmath>
#include <cstddef>

#include "codecs/cpu/kernels.h"
#include "codecs/cpu/parallel.h"

namespace gradcomp::codecs {

float ClipScale(absl::Span<const float> g, double clip_norm) {
  if (clip_norm <= 0) return 1.0f;
  const double norm = std::sqrt(SumOfSquares(g));
  if (norm <= clip_norm) return 1.0f;
  return static_cast<float>(clip_norm / norm);
}

namespace {

void AccumulateClassic(const float* __restrict g, float scale, float m,
                       float* __restrict u, float* __restrict v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    u[i] = m * u[i] + scale * g[i];
    v[i] += u[i];
  }
}

void AccumulateNesterov(const float* __restrict g, float scale, float m,
                        float* __restrict u, float* __restrict v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = scale * g[i];
    u[i] = (u[i] + gi) * m;
    v[i] += u[i] + gi;
  }
}

}  // namespace

absl::Span<float> MomentumCorrection::Accumulate(absl::Span<const float> g,
                                                 float scale,
                                                 TensorState& state) const {
  const size_t n = g.size();
  float* u = state.Buffer(kMomentumBuffer, n).data();
  absl::Span<float> velocity = state.Buffer(kVelocityBuffer, n);
  float* v = velocity.data();
  const float* grad = g.data();
  const float m = options_.momentum;
  const auto accumulate =
      options_.nesterov ? AccumulateNesterov : AccumulateClassic;
  ParallelFor(n, {}, [=](size_t begin, size_t end, int) {
    accumulate(grad + begin, scale, m, u + begin, v + begin, end - begin);
  });
  return velocity;
}

void MomentumCorrection::Sent(absl::Span<const uint32_t> indices, bool masking,
                              TensorState& state) const {
  absl::Span<float> v = *state.Find(kVelocityBuffer);
  for (uint32_t i : indices) v[i] = 0;
  if (!masking) return;
  absl::Span<float> u = *state.Find(kMomentumBuffer);
  absl::Span<float> masked = state.Buffer(kMaskedBuffer, indices.size());
  for (size_t j = 0; j < indices.size(); ++j) {
    masked[j] = u[indices[j]];
    u[indices[j]] = 0;
  }
}

void MomentumCorrection::Revert(absl::Span<const float> g, float scale,
                                absl::Span<const uint32_t> indices,
                                absl::Span<const float> sent, bool masking,
                                TensorState& state) const {
  const size_t n = g.size();
  float* u = state.Buffer(kMomentumBuffer, n).data();
  float* v = state.Buffer(kVelocityBuffer, n).data();
  for (size_t j = 0; j < indices.size(); ++j) v[indices[j]] = sent[j];
  if (masking) {
    absl::Span<float> masked = state.Buffer(kMaskedBuffer, indices.size());
    for (size_t j = 0; j < indices.size(); ++j) u[indices[j]] = masked[j];
  }
  const float* grad = g.data();
  ParallelFor(n, {}, [=](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      UndoAccumulate(scale * grad[i], u[i], v[i]);
    }
  });
}

void MomentumCorrection::UndoAccumulate(float gi, float& u, float& v) const {
  // Accumulate backwards. With m = 0 the old u never mattered (it was
  // multiplied by 0): it restarts from zero.
  const float m = options_.momentum;
  if (options_.nesterov) {
    v = FiniteOrZero(v - u - gi);
    u = m == 0 ? 0.0f : FiniteOrZero(u / m - gi);
  } else {
    v = FiniteOrZero(v - u);
    u = m == 0 ? 0.0f : FiniteOrZero((u - gi) / m);
  }
}

MomentumCorrection::Reset MomentumCorrection::RefuseNonFinite(
    absl::Span<const float> g, float scale, TensorState& state) const {
  absl::Span<float> v = *state.Find(kVelocityBuffer);
  absl::Span<float> u = *state.Find(kMomentumBuffer);
  Reset reset;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i]) && std::isfinite(u[i])) {
      UndoAccumulate(scale * g[i], u[i], v[i]);
      continue;
    }
    if (reset.count++ == 0) reset.first = i;
    v[i] = 0;
    u[i] = 0;
  }
  return reset;
}

}  // namespace gradcomp::codecs
