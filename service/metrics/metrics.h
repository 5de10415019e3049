// The daemon's Prometheus metrics: one object the engine reports into, and
// a Collectable that the /metrics exposer (metrics_server.h) and tests read.
// Labels are bounded sets (codec names, status codes, stages, dense
// reasons), never tensor names.
//
//   codecs::StateStore store;
//   Metrics metrics(&store, kVersion);
//   metrics.CountReduce("topk", absl::StatusCode::kOk);
//   exposer->RegisterCollectable(metrics.collectable());
#ifndef GRADCOMP_SERVICE_METRICS_METRICS_H_
#define GRADCOMP_SERVICE_METRICS_METRICS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "codecs/state.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace gradcomp::service {

enum class Stage { kEncode, kCollective, kDecode, kTotal };

class Metrics {
 public:
  // `state` (may be null) is read at every scrape for the state metrics, so
  // they cost nothing per request; it must outlive this object.
  Metrics(const codecs::StateStore* state, absl::string_view version);

  // One finished Reduce. `code` becomes its gRPC name ("OK",
  // "INVALID_ARGUMENT"); `codec` is a registry name, or "unresolved" when
  // the request failed before a codec was chosen.
  void CountReduce(absl::string_view codec, absl::StatusCode code);
  // One finished gRPC call of any service of the client API; `service` and
  // `method` come from a bounded list (request_counter.h maps the rest to
  // "other").
  void CountRequest(absl::string_view service, absl::string_view method,
                    absl::StatusCode code);
  // The step of a reduce that succeeded: the last one is exported, so that
  // steps per second are its rate of change.
  void SetStep(int64_t step);
  void AddBytes(absl::string_view codec, uint64_t raw_bytes,
                uint64_t wire_bytes);
  void ObserveStage(Stage stage, double seconds);
  void ObserveRelativeError(absl::string_view codec, double relative_error);
  // ||residual|| / ||g|| of an error-feedback codec, measured on the same
  // sampled reduces as the relative error.
  void ObserveResidualNorm(absl::string_view codec, double relative_norm);
  void AddNonfinite(uint64_t count);
  void CountDense(absl::string_view reason);
  // Client shared-memory regions registered now, and their mapped bytes.
  void SetSharedMemory(uint64_t regions, uint64_t bytes);
  // Regions dropped because the client that registered them went away.
  void CountSharedMemoryReclaimed(int regions);
  // A stream cancelled because its client made no progress for the stall
  // timeout (service/api/stall_watchdog.h).
  void CountStalledStream();
  // The daemon found no usable CUDA device when a client asked for one
  // (counted once per process: service/memory/shared_memory_registry.cc).
  void CountGpuUnavailable();
  // A reduce that succeeded, by codec and by where its codec ran: "cuda"
  // (encoded and decoded in GPU memory) or "cpu".
  void CountBackend(absl::string_view codec, absl::string_view backend);
  // A request refused by a limit (docs/daemon.md, "Limits"): `resource` is
  // one of memory, stream_queue, jobs, job_tensors, job_state_bytes,
  // tensor_bytes, shm_regions.
  void CountResourceExhausted(absl::string_view resource);
  // The memory budget's bytes in use (requests and codec state) and total.
  void SetMemoryBudget(uint64_t in_use, uint64_t total);
  // The ReduceStream pool's threads by what they do (running a reduce,
  // waiting in one for peers or batch members, idle) and the stream
  // tensors queued for a thread (service/api/worker_pool.h).
  void SetStreamPool(int running, int waiting, int idle, uint64_t queued);
  // Jobs this daemon keeps state for (until they are released), and those
  // with a reduce in flight.
  void SetJobs(uint64_t held, uint64_t active);
  // Gossip mode (docs/gossip.md): message bytes sent to neighbour rank
  // `peer`, a PowerGossip edge with `peer` started again because its ends
  // were out of step, and the consensus distance a client of `job`
  // reported.
  void AddGossipBytes(int peer, uint64_t bytes);
  void CountGossipEdgeResync(int peer);
  void SetConsensusDistance(absl::string_view job, double distance);
  // `job` was released (Engine::ReleaseJob): counted, and its per-job
  // series (the consensus distance) removed.
  void CountJobReleased(absl::string_view job);

  std::shared_ptr<prometheus::Collectable> collectable() const {
    return collector_;
  }

 private:
  class Collector;

  // The histogram of `family` for `codec`, created on first use.
  prometheus::Histogram& ForCodec(
      absl::flat_hash_map<std::string, prometheus::Histogram*>& cache,
      prometheus::Family<prometheus::Histogram>& family,
      absl::string_view codec,
      prometheus::Histogram::BucketBoundaries (*buckets)())
      ABSL_LOCKS_EXCLUDED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collector_;
  prometheus::Family<prometheus::Counter>& reduce_total_;
  prometheus::Family<prometheus::Counter>& requests_total_;
  prometheus::Family<prometheus::Counter>& raw_bytes_;
  prometheus::Family<prometheus::Counter>& wire_bytes_;
  prometheus::Family<prometheus::Histogram>& relative_error_;
  prometheus::Family<prometheus::Histogram>& residual_norm_;
  prometheus::Family<prometheus::Counter>& dense_total_;
  prometheus::Counter& nonfinite_;
  prometheus::Gauge& step_;
  prometheus::Gauge* shm_regions_;
  prometheus::Gauge* shm_bytes_;
  prometheus::Counter* shm_reclaimed_;
  prometheus::Counter* stalled_streams_;
  prometheus::Counter* gpu_unavailable_;
  prometheus::Family<prometheus::Counter>* backend_total_;
  prometheus::Family<prometheus::Counter>* resource_exhausted_;
  prometheus::Gauge* memory_in_use_;
  prometheus::Gauge* memory_budget_;
  prometheus::Gauge* stream_running_;
  prometheus::Gauge* stream_waiting_;
  prometheus::Gauge* stream_idle_;
  prometheus::Gauge* stream_queued_;
  prometheus::Gauge* jobs_held_;
  prometheus::Gauge* jobs_active_;
  prometheus::Family<prometheus::Counter>* gossip_bytes_;
  prometheus::Family<prometheus::Counter>* gossip_edge_resyncs_;
  prometheus::Family<prometheus::Gauge>* consensus_distance_;
  prometheus::Counter* jobs_released_;
  std::array<prometheus::Histogram*, 4> stages_;

  absl::Mutex mu_;
  // Family::Add builds a histogram (and its buckets) before it looks the
  // labels up, so the per-codec histograms are kept here after the first.
  absl::flat_hash_map<std::string, prometheus::Histogram*> error_by_codec_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Histogram*> residual_by_codec_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_METRICS_METRICS_H_
