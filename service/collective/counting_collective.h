// A Collective decorator for tests that counts the Runs it forwards: how
// many collectives a caller ran, without a metrics registry; and keeps the
// jobs it was told to forget.
//
//   CountingCollective counting(&group.collective(0));
//   ... counting.runs() ...
#ifndef GRADCOMP_SERVICE_COLLECTIVE_COUNTING_COLLECTIVE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_COUNTING_COLLECTIVE_H_

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "service/collective/collective.h"

namespace gradcomp::service {

class CountingCollective : public Collective {
 public:
  explicit CountingCollective(Collective* inner) : inner_(inner) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                          codecs::Round round) override {
    runs_.fetch_add(1, std::memory_order_relaxed);
    return inner_->Run(key, std::move(round));
  }
  absl::StatusOr<std::vector<codecs::Bytes>> AllToAll(
      const RoundKey& key, std::vector<codecs::Bytes> parts) override {
    return inner_->AllToAll(key, std::move(parts));
  }
  absl::StatusOr<std::vector<codecs::Bytes>> Allgather(
      const RoundKey& key, codecs::Bytes part) override {
    return inner_->Allgather(key, std::move(part));
  }
  absl::StatusOr<std::vector<codecs::Bytes>> ExchangeWithNeighbours(
      const RoundKey& key, absl::Span<const int> neighbours,
      std::vector<codecs::Bytes> parts) override {
    return inner_->ExchangeWithNeighbours(key, neighbours, std::move(parts));
  }
  void ForgetJob(const std::string& job) override {
    {
      absl::MutexLock lock(&mu_);
      forgotten_.push_back(job);
    }
    inner_->ForgetJob(job);
  }
  void Shutdown(const absl::Status& why) override { inner_->Shutdown(why); }

  int runs() const { return runs_.load(std::memory_order_relaxed); }
  void Reset() { runs_.store(0, std::memory_order_relaxed); }
  // The jobs passed to ForgetJob, in order.
  std::vector<std::string> forgotten() const {
    absl::MutexLock lock(&mu_);
    return forgotten_;
  }

 private:
  Collective* const inner_;
  std::atomic<int> runs_{0};
  mutable absl::Mutex mu_;
  std::vector<std::string> forgotten_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_COUNTING_COLLECTIVE_H_
