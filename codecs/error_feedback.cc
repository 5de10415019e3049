#include "codecs/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace gradcomp::codecs {
namespace {

// p += g, keeping the old p in `old`, in one pass; returns whether every new
// p is finite (|p| <= FLT_MAX is false for NaN and Inf).
bool AddKeepingOld(const float* __restrict g, float* __restrict p,
                   float* __restrict old, size_t n) {
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    old[i] = p[i];
    p[i] += g[i];
    finite &= std::fabs(p[i]) <= std::numeric_limits<float>::max();
  }
  return finite;
}

// Buffers for the copy of the residual that Encode keeps while its step may
// still fail, reused across steps and tensors: a fresh tensor-sized buffer
// per step would fault in new pages, which costs more than the copy. Shared
// by all threads (the daemon runs up to hundreds), so that what it keeps
// follows how many encodes ran at once, not how many threads ever ran one,
// and never more than kMaxIdle buffers between steps.
class ScratchPool {
 public:
  // A buffer of at least n floats: the smallest idle one large enough, else
  // the largest idle one grown, else a new one.
  std::vector<float> Take(size_t n) {
    std::vector<float> buffer;
    {
      absl::MutexLock lock(&mu_);
      auto pick = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (pick == idle_.end() || Better(it->size(), pick->size(), n)) {
          pick = it;
        }
      }
      if (pick != idle_.end()) {
        buffer = std::move(*pick);
        idle_.erase(pick);
      }
    }
    if (buffer.size() < n) buffer.resize(n);
    return buffer;
  }

  void Give(std::vector<float> buffer) {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(buffer));
  }

 private:
  // Encodes are CPU-bound: more than a few rarely overlap for long, and a
  // buffer beyond these is freed rather than kept for a peak.
  static constexpr size_t kMaxIdle = 8;

  // Whether an idle buffer of `size` floats serves a request for n better
  // than one of `than`: one that fits beats one that does not; of two that
  // fit, the smaller (the larger stays for larger tensors); of two that do
  // not, the larger (less to grow).
  static bool Better(size_t size, size_t than, size_t n) {
    if ((size >= n) != (than >= n)) return size >= n;
    return size >= n ? size < than : size > than;
  }

  absl::Mutex mu_;
  std::vector<std::vector<float>> idle_ ABSL_GUARDED_BY(mu_);
};

ScratchPool& Scratch() {
  static ScratchPool* const pool = new ScratchPool();
  return *pool;
}

}  // namespace

ErrorFeedback::ErrorFeedback(std::unique_ptr<SingleRoundCodec> inner)
    : inner_(std::move(inner)), info_(inner_->info()) {
  info_.stateful = true;
  info_.unbiased = false;
}

absl::Status ErrorFeedback::Encode(const TensorView& grad, TensorState& state,
                                   const StepContext& ctx,
                                   Bytes* payload) const {
  const size_t n = grad.numel();
  // The residual buffer itself holds p = g + e and then becomes
  // p - D(payload): no per-step tensor for p. A step that fails must leave
  // e as it was, bit for bit, and p - g does not give e back (rounding, and
  // NaN where g or g + e is not finite), so the pass that forms p keeps the
  // old e in reused scratch.
  absl::Span<float> p = state.Buffer(kErrorFeedbackBuffer, n);
  std::vector<float> old = Scratch().Take(n);
  const bool finite =
      AddKeepingOld(grad.values.data(), p.data(), old.data(), n);
  // A NaN or Inf kept in the residual would fail every later step (or, with
  // an inner codec that sends only some values, stay there unseen).
  absl::Status status = finite ? absl::OkStatus() : NonFiniteError(p);
  if (status.ok()) {
    status = inner_->Encode(TensorView{p, grad.shape}, state, ctx, payload);
  }
  if (status.ok()) status = inner_->DecodeAdd(*payload, -1.0f, p);
  if (!status.ok()) std::copy_n(old.begin(), n, p.begin());
  Scratch().Give(std::move(old));
  return status;
}

absl::Status ErrorFeedback::NonFiniteError(absl::Span<const float> p) const {
  const auto bad = std::find_if(p.begin(), p.end(),
                                [](float x) { return !std::isfinite(x); });
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: the gradient plus its error-feedback residual holds NaN or Inf "
      "(first at index %d: %g); expected finite values",
      info_.name, bad - p.begin(), bad == p.end() ? 0.0f : *bad));
}

absl::Status ErrorFeedback::DecodeAdd(absl::string_view payload, float alpha,
                                      absl::Span<float> acc) const {
  return inner_->DecodeAdd(payload, alpha, acc);
}

absl::Status ErrorFeedback::FinishSum(absl::Span<const float> sum,
                                      int world_size, const StepContext& ctx,
                                      absl::Span<float> out) const {
  return inner_->FinishSum(sum, world_size, ctx, out);
}

absl::Status ErrorFeedback::FinishGather(absl::Span<const Bytes> payloads,
                                         const StepContext& ctx,
                                         absl::Span<float> out) const {
  return inner_->FinishGather(payloads, ctx, out);
}

}  // namespace gradcomp::codecs
