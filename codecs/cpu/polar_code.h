// Polar codes for lossy source coding of bits (Korada & Urbanke, IEEE T-IT
// 2010): a block of N = 2^n source bits is described by K = round(R * N)
// bits, with Hamming distortion approaching the bound h2^-1(1 - R).
//
//   GC_ASSIGN_OR_RETURN(PolarCode code, PolarCode::Create(/*log2_n=*/11, 0.5));
//   code.Encode(source, uniforms, absl::MakeSpan(info),
//   absl::MakeSpan(approx)); code.Decode(info, absl::MakeSpan(approx));  // the
//   same `approx` again
//
// Bits are one per byte (0 or 1). The transform is x = u F^(x)n over GF(2),
// F = [[1, 0], [1, 1]], without bit reversal, so index i of u is split by
// its most significant bit first.
#ifndef GRADCOMP_CODECS_CPU_POLAR_CODE_H_
#define GRADCOMP_CODECS_CPU_POLAR_CODE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace gradcomp::codecs {

// Binary entropy in bits, h2(p) = -p log2 p - (1-p) log2 (1-p).
double BinaryEntropy(double p);

// The p in [0, 1/2] with h2(p) = h, for h in [0, 1] (bisection).
double InverseBinaryEntropy(double h);

// x <- x F^(x)n in place, for x.size() a power of two. Its own inverse.
void PolarTransform(absl::Span<uint8_t> bits);

class PolarCode {
 public:
  static constexpr int kMaxLog2N = 16;

  // The code of length 2^log2_n (log2_n in [0, kMaxLog2N]) with
  // K = round(rate * N) information bits (rate in [0, 1]), built from the
  // Bhattacharyya parameters of the test channel BSC(D), h2(D) = 1 - rate:
  // the N - K indices with the largest parameter are frozen to 0.
  static absl::StatusOr<PolarCode> Create(int log2_n, double rate);

  int n() const { return static_cast<int>(is_info_.size()); }
  int k() const { return k_; }
  // D of the test channel, which also scales the encoder's LLRs.
  double design_distortion() const { return design_distortion_; }
  bool is_info(int i) const { return is_info_[i] != 0; }

  // Successive-cancellation encoding of `source` (n bits), best of
  // uniforms.size() / n draws (at least 1): in draw a, information bit u_i
  // is 1 with probability 1 / (1 + exp(4 L_i)) for its leaf LLR L_i, decided
  // by uniforms[a * n + i] (values in [0, 1); only information indices are
  // read), and frozen bits are 0. Writes the k information bits of the draw
  // closest to `source` in index order to `info`, and Decode(info) to
  // `approx` (n bits); returns its Hamming distance to `source`. Each draw
  // costs O(N log N).
  int Encode(absl::Span<const uint8_t> source, absl::Span<const float> uniforms,
             absl::Span<uint8_t> info, absl::Span<uint8_t> approx) const;

  // out = T(u), u zero but for `info` (k bits) at the information indices.
  void Decode(absl::Span<const uint8_t> info, absl::Span<uint8_t> out) const;

 private:
  PolarCode(std::vector<uint8_t> is_info, int k, double design_distortion);

  struct Scratch;
  // SC over the sub-block [first, first + size) given its LLRs; writes its
  // codeword to x[first, first + size) and its u bits to u[...].
  void EncodeNode(const float* llr, int first, int size,
                  absl::Span<const float> uniforms, Scratch& scratch) const;
  int InfoCount(int first, int size) const {
    return info_before_[first + size] - info_before_[first];
  }

  std::vector<uint8_t> is_info_;  // [n]
  std::vector<int> info_before_;  // [n + 1]: information indices below i
  int k_ = 0;
  double design_distortion_ = 0.5;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_POLAR_CODE_H_
