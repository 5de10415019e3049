// Deep Gradient Compression's per-worker transforms (Lin et al. 2018, steps 1,
// 2 and 5): local gradient clipping and momentum correction, kept in a
// tensor's state so that any sparsifier can send from the accumulated velocity.
//
//   MomentumCorrection mc(MomentumCorrection::Options{0.9, false});
//   absl::Span<float> v = mc.Accumulate(grad, ClipScale(grad, clip), state);
//   ... send v[i] for i in indices ...
//   mc.Sent(indices, /*masking=*/true, state);
#ifndef GRADCOMP_CODECS_CPU_MOMENTUM_H_
#define GRADCOMP_CODECS_CPU_MOMENTUM_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "codecs/state.h"

namespace gradcomp::codecs {

// The factor min(1, clip_norm / ||g||_2) that clips g to L2 norm clip_norm;
// 1 when clip_norm <= 0 (clipping off) or g is zero.
float ClipScale(absl::Span<const float> g, double clip_norm);

class MomentumCorrection {
 public:
  struct Options {
    float momentum = 0.9f;
    bool nesterov = false;
  };

  // State buffers, each of numel floats.
  static constexpr char kMomentumBuffer[] = "dgc.u";
  static constexpr char kVelocityBuffer[] = "dgc.v";
  // With masking, the momentum Sent zeroed (one float per index), for
  // Revert.
  static constexpr char kMaskedBuffer[] = "dgc.u_masked";

  explicit MomentumCorrection(Options options) : options_(options) {}

  // With g' = scale * g, updates the state in one pass over memory:
  //   u <- m*u + g';        v <- v + u        (classic)
  //   u <- (u + g')*m;      v <- v + u + g'   (Nesterov)
  // and returns v, the velocity to sparsify (a view into `state`).
  absl::Span<float> Accumulate(absl::Span<const float> g, float scale,
                               TensorState& state) const;

  // Records that v[i] was sent for every i in `indices` (each < numel), on
  // the state a call to Accumulate has made:
  // v[i] <- 0, and with momentum factor masking u[i] <- 0 too, so that stale
  // momentum does not keep pushing a coordinate that was just applied.
  void Sent(absl::Span<const uint32_t> indices, bool masking,
            TensorState& state) const;

  // Undoes Accumulate(g, scale) and Sent(indices) for a step that failed
  // afterwards; `sent[j]` is the v[indices[j]] that was sent. To within
  // rounding (u is divided by m again), and an entry that comes back
  // non-finite restarts from zero.
  void Revert(absl::Span<const float> g, float scale,
              absl::Span<const uint32_t> indices, absl::Span<const float> sent,
              bool masking, TensorState& state) const;

  // What RefuseNonFinite found: how many coordinates, the first one's index.
  struct Reset {
    size_t count = 0;
    size_t first = 0;
  };
  // For a step refused because the state Accumulate(g, scale) made holds
  // NaN or Inf: zeroes v[i] and u[i] wherever either is non-finite (such a
  // value can go in no payload, and kept it would fail every later step),
  // and gives the step back everywhere else, as Revert does, so that a
  // step run again does not count g twice.
  Reset RefuseNonFinite(absl::Span<const float> g, float scale,
                        TensorState& state) const;

 private:
  // Undoes Accumulate's update of one coordinate, gi = scale * g[i]; a value
  // that comes back non-finite restarts from zero.
  void UndoAccumulate(float gi, float& u, float& v) const;

  Options options_;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_MOMENTUM_H_
