// `atomo`: ATOMO atomic sparsification (Wang et al., NeurIPS 2018). The
// gradient is written as a sum of atoms lambda_i a_i; atom i is kept with
// probability p_i and scaled by 1 / p_i, an unbiased estimate whose variance
// Algorithm 1's p minimises for an expected count s of atoms.
//
//   GC_ASSIGN_OR_RETURN(auto codec, AtomoCodec::Create(CodecParams(
//                           {{"atoms", "spectral"}, {"budget", "2"}})));
//
// Parameters: `atoms` = `spectral` (default: the SVD of g.view(rows, -1),
// atoms u_i v_i^T with lambda_i = sigma_i; 1-D tensors are a rows x 1
// matrix) or `entry` (atoms are the coordinates, lambda_i = g_i).
// `budget`: for spectral the expected number of atoms s (default 2); for
// entry the expected fraction of coordinates (default 0.01, s = budget * n).
// Keeping draws Uniform(i) < p_i, i the atom's index, from this worker's
// Philox stream (kernels.h WorkerStream, round 0).
//
// Payload (after the wire header, little-endian): parameters are 16 bytes,
// [0] atoms (1 spectral, 2 entry), [1..3] zero, [4..7] u32 count c of kept
// atoms, [8..15] u64 rows (spectral; 0 for entry and for empty tensors).
// Spectral body: per kept atom, in ascending atom order, fp32 u_i * sigma_i
// / p_i (rows values) then v_i (cols = numel / rows values); decoding adds
// sum_i (u_i sigma_i / p_i) v_i^T. Entry body: the c ascending indices,
// gap-coded as index_coding.h describes, then c fp32 values g_i / p_i.
#ifndef GRADCOMP_CODECS_CPU_ATOMO_H_
#define GRADCOMP_CODECS_CPU_ATOMO_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/params.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

// Algorithm 1's probabilities for atoms of weights lambda and budget s:
// p_i = 1 for the atoms with |lambda_i| >= keep_at, else c |lambda_i|;
// sum p = min(s, #nonzero lambda).
struct AtomoProbabilities {
  float keep_at = std::numeric_limits<float>::infinity();
  double c = 0;

  double p(float lambda) const {
    const float a = std::fabs(lambda);
    return a >= keep_at ? 1.0 : std::min(1.0, c * a);
  }
};

// Runs Algorithm 1 (sort |lambda| descending; while |lambda_i| s > the sum of
// the |lambda_j| not yet fixed, p_i = 1 and s <- s - 1; then spread the
// remaining s in proportion to |lambda|). The loop fixes at most ceil(s)
// atoms, so only the ceil(s) + 1 largest magnitudes are sorted: O(n + s log s).
// `lambda` must be finite; s > 0.
AtomoProbabilities ComputeAtomoProbabilities(absl::Span<const float> lambda,
                                             double s);

enum class AtomoAtoms : uint8_t { kSpectral = 1, kEntry = 2 };

struct AtomoOptions {
  AtomoAtoms atoms = AtomoAtoms::kSpectral;
  double budget = 2.0;  // spectral: s > 0; entry: fraction in (0, 1]
};

class AtomoCodec : public SingleRoundCodec {
 public:
  // Parses and checks "atoms" and "budget"; rejects unknown names.
  static absl::StatusOr<std::unique_ptr<AtomoCodec>> Create(
      const CodecParams& params);

  explicit AtomoCodec(const AtomoOptions& options);

  const CodecInfo& info() const override { return info_; }
  const AtomoOptions& options() const { return options_; }

  // InvalidArgument if `grad` holds NaN or Inf, or (entry) has 2^32 or
  // more elements.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // Decodes either kind of atoms, whatever this codec's options.
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

 private:
  AtomoOptions options_;
  CodecInfo info_;
};

CodecInfo AtomoInfo();

// Registers "atomo".
absl::Status RegisterAtomo(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_ATOMO_H_
