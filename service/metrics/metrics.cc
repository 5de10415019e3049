#include "service/metrics/metrics.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "codecs/wire.h"
#include "prometheus/metric_family.h"

namespace gradcomp::service {
namespace {

// 10 us .. ~20 s, doubling: encode of a small tensor to a slow collective.
prometheus::Histogram::BucketBoundaries StageBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-5; v < 30; v *= 2) b.push_back(v);
  return b;
}

// Relative L2 error: 0.1 % (fp16) to 10 (unbiased 2-bit quantisers), 1-2-5
// below 0.1 and finer above, where the usual codecs sit (topk 1 % ~0.96,
// qsgd 4-bit ~1.26) and alert thresholds go.
prometheus::Histogram::BucketBoundaries ErrorBuckets() {
  return {0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3,
          0.5,   0.7,   1,     1.5,  2,    3,    5,   10};
}

// ||residual|| / ||g||: error feedback carries up to several gradients'
// worth of residual under strong sparsification; 1-2-5 from 0.01 to 100.
prometheus::Histogram::BucketBoundaries ResidualBuckets() {
  return {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100};
}

prometheus::MetricFamily OneValue(std::string name, std::string help,
                                  prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
  return family;
}

}  // namespace

// The registry's metrics plus the state store's, read when scraped.
class Metrics::Collector : public prometheus::Collectable {
 public:
  Collector(std::shared_ptr<prometheus::Registry> registry,
            const codecs::StateStore* state)
      : registry_(std::move(registry)), state_(state) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    if (state_ != nullptr) {
      families.push_back(OneValue(
          "gradcomp_state_resets_total",
          "Per-tensor codec states reset by a change of shape, dtype or "
          "compressing codec.",
          prometheus::MetricType::Counter,
          static_cast<double>(state_->resets())));
      families.push_back(OneValue(
          "gradcomp_state_bytes",
          "Bytes held by per-tensor codec state (residuals, momentum).",
          prometheus::MetricType::Gauge,
          static_cast<double>(state_->ByteSize())));
    }
    return families;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  const codecs::StateStore* state_;
};

Metrics::Metrics(const codecs::StateStore* state, absl::string_view version)
    : registry_(std::make_shared<prometheus::Registry>()),
      collector_(std::make_shared<Collector>(registry_, state)),
      reduce_total_(prometheus::BuildCounter()
                        .Name("gradcomp_reduce_total")
                        .Help("Reduce calls by codec and gRPC status code.")
                        .Register(*registry_)),
      requests_total_(
          prometheus::BuildCounter()
              .Name("gradcomp_requests_total")
              .Help("Client API calls by gRPC service, method and status "
                    "code.")
              .Register(*registry_)),
      raw_bytes_(prometheus::BuildCounter()
                     .Name("gradcomp_raw_bytes_total")
                     .Help("Bytes a dense fp32 exchange would have sent.")
                     .Register(*registry_)),
      wire_bytes_(prometheus::BuildCounter()
                      .Name("gradcomp_wire_bytes_total")
                      .Help("Compressed payload bytes sent, all rounds.")
                      .Register(*registry_)),
      relative_error_(
          prometheus::BuildHistogram()
              .Name("gradcomp_compression_relative_error")
              .Help("||g - D(C(g))|| / ||g|| of this worker's payloads.")
              .Register(*registry_)),
      residual_norm_(
          prometheus::BuildHistogram()
              .Name("gradcomp_residual_relative_norm")
              .Help("||error-feedback residual|| / ||g|| after a sampled "
                    "reduce.")
              .Register(*registry_)),
      dense_total_(prometheus::BuildCounter()
                       .Name("gradcomp_dense_total")
                       .Help("Tensors the policy sent dense, by reason.")
                       .Register(*registry_)),
      nonfinite_(prometheus::BuildCounter()
                     .Name("gradcomp_nonfinite_values_total")
                     .Help("NaN and Inf values found in input gradients.")
                     .Register(*registry_)
                     .Add({})),
      step_(prometheus::BuildGauge()
                .Name("gradcomp_step")
                .Help("Step of the last reduce that succeeded.")
                .Register(*registry_)
                .Add({})) {
  auto& stages = prometheus::BuildHistogram()
                     .Name("gradcomp_stage_duration_seconds")
                     .Help("Time per Reduce stage.")
                     .Register(*registry_);
  const auto buckets = StageBuckets();
  stages_[static_cast<int>(Stage::kEncode)] =
      &stages.Add({{"stage", "encode"}}, buckets);
  stages_[static_cast<int>(Stage::kCollective)] =
      &stages.Add({{"stage", "collective"}}, buckets);
  stages_[static_cast<int>(Stage::kDecode)] =
      &stages.Add({{"stage", "decode"}}, buckets);
  stages_[static_cast<int>(Stage::kTotal)] =
      &stages.Add({{"stage", "total"}}, buckets);
  prometheus::BuildGauge()
      .Name("gradcomp_build_info")
      .Help("Always 1; labels carry the daemon version and wire format.")
      .Register(*registry_)
      .Add({{"version", std::string(version)},
            {"wire_format", std::to_string(codecs::kWireVersion)}})
      .Set(1);
  shm_regions_ = &prometheus::BuildGauge()
                      .Name("gradcomp_shm_regions")
                      .Help("Client shared-memory regions registered.")
                      .Register(*registry_)
                      .Add({});
  shm_bytes_ = &prometheus::BuildGauge()
                    .Name("gradcomp_shm_bytes")
                    .Help("Bytes of client shared memory mapped.")
                    .Register(*registry_)
                    .Add({});
  shm_reclaimed_ =
      &prometheus::BuildCounter()
           .Name("gradcomp_shm_regions_reclaimed_total")
           .Help(
               "Shared-memory regions reclaimed after their client went "
               "away.")
           .Register(*registry_)
           .Add({});
  stalled_streams_ =
      &prometheus::BuildCounter()
           .Name("gradcomp_stalled_streams_cancelled_total")
           .Help(
               "Streams (ReduceStream, ExportStateStream, ImportStateStream) "
               "cancelled because their client made no progress for "
               "--stream_stall_timeout.")
           .Register(*registry_)
           .Add({});
  gpu_unavailable_ =
      &prometheus::BuildCounter()
           .Name("gradcomp_gpu_unavailable_total")
           .Help(
               "1 once a client asked this daemon for a CUDA device and "
               "none was usable (CPU-only build, no driver or no GPU).")
           .Register(*registry_)
           .Add({});
  backend_total_ = &prometheus::BuildCounter()
                        .Name("gradcomp_reduce_backend_total")
                        .Help(
                            "Reduces that succeeded, by codec and by where "
                            "the codec ran (backend: cuda or cpu).")
                        .Register(*registry_);
  gossip_bytes_ = &prometheus::BuildCounter()
                       .Name("gradcomp_gossip_bytes_total")
                       .Help("Gossip message bytes sent, by neighbour rank.")
                       .Register(*registry_);
  gossip_edge_resyncs_ =
      &prometheus::BuildCounter()
           .Name("gradcomp_gossip_edge_resyncs_total")
           .Help(
               "PowerGossip edges started again from fresh factors because "
               "their two ends had run different power steps, by neighbour "
               "rank.")
           .Register(*registry_);
  consensus_distance_ =
      &prometheus::BuildGauge()
           .Name("gradcomp_gossip_consensus_distance")
           .Help(
               "The consensus distance a gossip job's client last reported, "
               "by job.")
           .Register(*registry_);
  jobs_released_ =
      &prometheus::BuildCounter()
           .Name("gradcomp_jobs_released_total")
           .Help(
               "Jobs whose codec state and bookkeeping a client released "
               "(ReleaseJob).")
           .Register(*registry_)
           .Add({});
  resource_exhausted_ =
      &prometheus::BuildCounter()
           .Name("gradcomp_resource_exhausted_total")
           .Help(
               "Requests refused with RESOURCE_EXHAUSTED by a limit, by "
               "resource.")
           .Register(*registry_);
  memory_in_use_ =
      &prometheus::BuildGauge()
           .Name("gradcomp_memory_budget_in_use_bytes")
           .Help(
               "Bytes of the memory budget held by in-flight requests and "
               "codec state.")
           .Register(*registry_)
           .Add({});
  memory_budget_ = &prometheus::BuildGauge()
                        .Name("gradcomp_memory_budget_bytes")
                        .Help("The memory budget (--memory_budget_bytes).")
                        .Register(*registry_)
                        .Add({});
  prometheus::Family<prometheus::Gauge>& stream_workers =
      prometheus::BuildGauge()
          .Name("gradcomp_stream_workers")
          .Help(
              "ReduceStream pool threads by state: running a reduce, "
              "waiting in one for peers or batch members, or idle.")
          .Register(*registry_);
  stream_running_ = &stream_workers.Add({{"state", "running"}});
  stream_waiting_ = &stream_workers.Add({{"state", "waiting"}});
  stream_idle_ = &stream_workers.Add({{"state", "idle"}});
  stream_queued_ = &prometheus::BuildGauge()
                        .Name("gradcomp_stream_queued_tensors")
                        .Help(
                            "ReduceStream tensors queued for a pool thread "
                            "(--max_queued_requests bounds them).")
                        .Register(*registry_)
                        .Add({});
  jobs_held_ =
      &prometheus::BuildGauge()
           .Name("gradcomp_jobs_held")
           .Help(
               "Jobs this daemon keeps codec state and bookkeeping for, until "
               "a client releases them (ReleaseJob).")
           .Register(*registry_)
           .Add({});
  jobs_active_ =
      &prometheus::BuildGauge()
           .Name("gradcomp_jobs_active")
           .Help(
               "Jobs with a reduce or import in flight (--max_concurrent_jobs "
               "bounds them).")
           .Register(*registry_)
           .Add({});
}

void Metrics::CountReduce(absl::string_view codec, absl::StatusCode code) {
  reduce_total_
      .Add({{"codec", std::string(codec)},
            {"code", absl::StatusCodeToString(code)}})
      .Increment();
}

void Metrics::CountRequest(absl::string_view service, absl::string_view method,
                           absl::StatusCode code) {
  requests_total_
      .Add({{"service", std::string(service)},
            {"method", std::string(method)},
            {"code", absl::StatusCodeToString(code)}})
      .Increment();
}

void Metrics::SetStep(int64_t step) { step_.Set(static_cast<double>(step)); }

void Metrics::AddBytes(absl::string_view codec, uint64_t raw_bytes,
                       uint64_t wire_bytes) {
  const prometheus::Labels labels = {{"codec", std::string(codec)}};
  raw_bytes_.Add(labels).Increment(static_cast<double>(raw_bytes));
  wire_bytes_.Add(labels).Increment(static_cast<double>(wire_bytes));
}

void Metrics::ObserveStage(Stage stage, double seconds) {
  stages_[static_cast<int>(stage)]->Observe(seconds);
}

prometheus::Histogram& Metrics::ForCodec(
    absl::flat_hash_map<std::string, prometheus::Histogram*>& cache,
    prometheus::Family<prometheus::Histogram>& family, absl::string_view codec,
    prometheus::Histogram::BucketBoundaries (*buckets)()) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = cache.try_emplace(codec, nullptr);
  if (inserted) {
    it->second = &family.Add({{"codec", std::string(codec)}}, buckets());
  }
  return *it->second;
}

void Metrics::ObserveRelativeError(absl::string_view codec,
                                   double relative_error) {
  ForCodec(error_by_codec_, relative_error_, codec, ErrorBuckets)
      .Observe(relative_error);
}

void Metrics::ObserveResidualNorm(absl::string_view codec,
                                  double relative_norm) {
  ForCodec(residual_by_codec_, residual_norm_, codec, ResidualBuckets)
      .Observe(relative_norm);
}

void Metrics::AddNonfinite(uint64_t count) {
  nonfinite_.Increment(static_cast<double>(count));
}

void Metrics::CountDense(absl::string_view reason) {
  dense_total_.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::SetSharedMemory(uint64_t regions, uint64_t bytes) {
  shm_regions_->Set(static_cast<double>(regions));
  shm_bytes_->Set(static_cast<double>(bytes));
}

void Metrics::CountSharedMemoryReclaimed(int regions) {
  shm_reclaimed_->Increment(regions);
}

void Metrics::CountStalledStream() { stalled_streams_->Increment(); }

void Metrics::CountGpuUnavailable() { gpu_unavailable_->Increment(); }

void Metrics::CountBackend(absl::string_view codec, absl::string_view backend) {
  backend_total_
      ->Add({{"codec", std::string(codec)}, {"backend", std::string(backend)}})
      .Increment();
}

void Metrics::CountResourceExhausted(absl::string_view resource) {
  resource_exhausted_->Add({{"resource", std::string(resource)}}).Increment();
}

void Metrics::SetMemoryBudget(uint64_t in_use, uint64_t total) {
  memory_in_use_->Set(static_cast<double>(in_use));
  memory_budget_->Set(static_cast<double>(total));
}

void Metrics::AddGossipBytes(int peer, uint64_t bytes) {
  gossip_bytes_->Add({{"peer", std::to_string(peer)}})
      .Increment(static_cast<double>(bytes));
}

void Metrics::CountGossipEdgeResync(int peer) {
  gossip_edge_resyncs_->Add({{"peer", std::to_string(peer)}}).Increment();
}

void Metrics::SetConsensusDistance(absl::string_view job, double distance) {
  consensus_distance_->Add({{"gradcomp_job", std::string(job)}}).Set(distance);
}

void Metrics::SetStreamPool(int running, int waiting, int idle,
                            uint64_t queued) {
  stream_running_->Set(running);
  stream_waiting_->Set(waiting);
  stream_idle_->Set(idle);
  stream_queued_->Set(static_cast<double>(queued));
}

void Metrics::SetJobs(uint64_t held, uint64_t active) {
  jobs_held_->Set(static_cast<double>(held));
  jobs_active_->Set(static_cast<double>(active));
}

void Metrics::CountJobReleased(absl::string_view job) {
  jobs_released_->Increment();
  const prometheus::Labels labels = {{"gradcomp_job", std::string(job)}};
  if (consensus_distance_->Has(labels)) {
    consensus_distance_->Remove(&consensus_distance_->Add(labels));
  }
}

}  // namespace gradcomp::service
