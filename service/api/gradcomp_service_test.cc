// End-to-end tests of the gRPC API: a real server on a free loopback port,
// the real engine and metrics behind it, and the generated client stub.
#include "service/api/gradcomp_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/shm_region.h"
#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "service/api/server.h"
#include "service/collective/local_collective.h"
#include "service/engine/device_codecs.h"
#include "service/engine/dtype.h"
#include "service/memory/cuda_ipc_region.h"
#include "service/memory/shared_memory_registry.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string FloatBytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::cos(0.11f * i) + 0.02f;
  return v;
}

v1::ReduceRequest Request(const std::string& tensor, std::vector<int64_t> shape,
                          const std::vector<float>& values) {
  v1::ReduceRequest r;
  r.set_job("job");
  r.set_tensor(tensor);
  r.set_step(0);
  r.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) r.add_shape(d);
  r.set_data(FloatBytes(values));
  return r;
}

// A LocalCollective whose rounds wait while the gate is closed, so a
// request can be held in flight. With a mirror peer (before the engine is
// made) the world has a second rank that sends in every neighbour exchange
// what this rank sent, as an identical worker would: gossip then has a
// neighbour (a ring of 2, one edge) and waits at the gate.
class GatedCollective : public LocalCollective {
 public:
  explicit GatedCollective(bool open = false) : open_(open) {}
  void AddMirrorPeer() { mirror_peer_ = true; }
  int world_size() const override { return mirror_peer_ ? 2 : 1; }
  absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                          codecs::Round round) override {
    {
      absl::MutexLock lock(&mu_);
      entered_ = true;
      mu_.Await(absl::Condition(&open_));
    }
    return LocalCollective::Run(key, std::move(round));
  }
  absl::StatusOr<std::vector<codecs::Bytes>> ExchangeWithNeighbours(
      const RoundKey& key, absl::Span<const int> neighbours,
      std::vector<codecs::Bytes> parts) override {
    {
      absl::MutexLock lock(&mu_);
      entered_ = true;
      mu_.Await(absl::Condition(&open_));
    }
    if (mirror_peer_) return parts;
    return LocalCollective::ExchangeWithNeighbours(key, neighbours,
                                                   std::move(parts));
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void WaitUntilEntered() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&entered_));
  }

 private:
  absl::Mutex mu_;
  bool entered_ = false;
  bool open_;
  bool mirror_peer_ = false;
};

class GradcompServiceTest : public ::testing::Test {
 protected:
  virtual EngineOptions Options() const { return EngineOptions(); }
  virtual StreamOptions Streams() const { return StreamOptions(); }

  void SetUp() override {
    auto engine = Engine::Create(Options(), codecs::BuiltinCodecs(), &store_,
                                 &collective_, &metrics_, Policy());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    DaemonSettings settings;
    settings.config_json = R"({"seed": "7"})";
    settings.flags = {{"collective_timeout", "1m"}};
    service_ = std::make_unique<GradcompService>(engine_.get(), &metrics_,
                                                 Streams(), settings);
    int port = 0;
    auto server =
        StartGrpcServer("127.0.0.1:0", service_.get(), &port, &metrics_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(INT_MAX);
    args.SetMaxSendMessageSize(INT_MAX);
    channel_ =
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                  grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Gradcomp::NewStub(channel_);
  }

  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  double Metric(absl::string_view name,
                const std::map<std::string, std::string>& labels) {
    return MetricValue(*metrics_.collectable(), name, labels);
  }

  grpc::Status Reduce(const v1::ReduceRequest& request,
                      v1::ReduceResponse* response) {
    grpc::ClientContext context;
    return stub_->Reduce(&context, request, response);
  }

  codecs::StateStore store_;
  Metrics metrics_{&store_, "test"};
  GatedCollective collective_{/*open=*/true};
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GradcompService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Gradcomp::Stub> stub_;
};

TEST_F(GradcompServiceTest, ReduceReturnsTheAverageAndStats) {
  const std::vector<float> g = Ramp(4096);
  v1::ReduceRequest request = Request("fc1.weight", {64, 64}, g);
  request.set_request_id(77);
  v1::ReduceResponse response;
  ASSERT_TRUE(Reduce(request, &response).ok());
  EXPECT_EQ(response.tensor(), "fc1.weight");
  EXPECT_EQ(response.request_id(), 77u);
  EXPECT_EQ(response.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(response.data(), request.data());
  EXPECT_EQ(response.stats().codec(), "none");
  EXPECT_EQ(response.stats().raw_bytes(), 4096u * 4);
  EXPECT_EQ(response.stats().world_size(), 1u);
  EXPECT_EQ(response.stats().relative_error(), 0);
  EXPECT_GT(response.stats().timings().total_seconds(), 0);
}

TEST_F(GradcompServiceTest, BadInputsGetTheRightCodeAndAreCounted) {
  const std::vector<float> g = Ramp(4096);
  struct Case {
    std::string what;
    std::function<void(v1::ReduceRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"byte size", [](v1::ReduceRequest& r) { r.set_data("abc"); },
       grpc::StatusCode::INVALID_ARGUMENT, "data has 3 bytes, expected 16384"},
      {"empty name", [](v1::ReduceRequest& r) { r.set_tensor(""); },
       grpc::StatusCode::INVALID_ARGUMENT, "tensor name is empty"},
      {"negative step", [](v1::ReduceRequest& r) { r.set_step(-4); },
       grpc::StatusCode::INVALID_ARGUMENT, "step is -4"},
      {"unknown codec",
       [](v1::ReduceRequest& r) { r.mutable_codec()->set_name("zip"); },
       grpc::StatusCode::INVALID_ARGUMENT, "unknown codec 'zip'"},
      {"bad params",
       [](v1::ReduceRequest& r) {
         r.mutable_codec()->set_name("fp16");
         (*r.mutable_codec()->mutable_params())["ratoi"] = "1";
       },
       grpc::StatusCode::INVALID_ARGUMENT, "ratoi"},
      {"dtype unspecified",
       [](v1::ReduceRequest& r) { r.set_dtype(v1::DTYPE_UNSPECIFIED); },
       grpc::StatusCode::INVALID_ARGUMENT, "dtype is unspecified"},
      {"shared memory input while shm is off",
       [](v1::ReduceRequest& r) { r.mutable_input_shm()->set_region("a"); },
       grpc::StatusCode::FAILED_PRECONDITION, "--allow_client_shm"},
  };
  for (const Case& c : cases) {
    v1::ReduceRequest request = Request("fc1.weight", {64, 64}, g);
    c.mutate(request);
    v1::ReduceResponse response;
    const grpc::Status status = Reduce(request, &response);
    EXPECT_EQ(status.error_code(), c.code) << c.what;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.what;
  }
  // Still serving.
  v1::ReduceResponse response;
  EXPECT_TRUE(Reduce(Request("fc1.weight", {64, 64}, g), &response).ok());

  EXPECT_EQ(Metric("gradcomp_reduce_total",
                   {{"codec", "unresolved"}, {"code", "INVALID_ARGUMENT"}}),
            6);
  EXPECT_EQ(Metric("gradcomp_reduce_total",
                   {{"codec", "unresolved"}, {"code", "FAILED_PRECONDITION"}}),
            1);
  EXPECT_EQ(
      Metric("gradcomp_reduce_total", {{"codec", "none"}, {"code", "OK"}}), 1);
  EXPECT_EQ(Metric("gradcomp_raw_bytes_total", {{"codec", "none"}}), 16384);
}

TEST_F(GradcompServiceTest, ZeroSizeTensorAndNanPassThrough) {
  v1::ReduceRequest empty = Request("empty", {0, 3}, {});
  v1::ReduceResponse response;
  ASSERT_TRUE(Reduce(empty, &response).ok());
  EXPECT_TRUE(response.data().empty());
  EXPECT_EQ(response.stats().dense_reason(), "empty");

  std::vector<float> g = Ramp(16);
  g[3] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(Reduce(Request("small", {16}, g), &response).ok());
  EXPECT_EQ(response.stats().nonfinite_values(), 1u);
  float out[16];
  ASSERT_EQ(response.data().size(), sizeof(out));
  std::memcpy(out, response.data().data(), sizeof(out));
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_EQ(Metric("gradcomp_nonfinite_values_total", {}), 1);
}

TEST_F(GradcompServiceTest, HalfPrecisionInputComesBackAsHalf) {
  std::vector<float> g(2048);
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(i % 16) * 0.5f;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    v1::ReduceRequest request = Request("w", {32, 64}, g);
    request.set_dtype(static_cast<v1::DType>(dtype));
    request.set_data(*EncodeFromFloat(dtype, g));
    v1::ReduceResponse response;
    ASSERT_TRUE(Reduce(request, &response).ok()) << DTypeName(dtype);
    EXPECT_EQ(response.dtype(), request.dtype());
    EXPECT_EQ(response.data(), request.data()) << DTypeName(dtype);
  }
}

TEST_F(GradcompServiceTest, TensorsOverFourMebibytesAreNotCapped) {
  const std::vector<float> g = Ramp(3 << 20);  // 12 MiB of fp32
  v1::ReduceResponse response;
  const grpc::Status status =
      Reduce(Request("embedding", {3 << 10, 1 << 10}, g), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.data().size(), g.size() * 4);
}

TEST_F(GradcompServiceTest, ReduceStreamReportsABadTensorAndGoesOn) {
  grpc::ClientContext context;
  auto stream = stub_->ReduceStream(&context);
  const std::vector<float> g = Ramp(4096);
  for (uint64_t id = 1; id <= 5; ++id) {
    v1::ReduceRequest request =
        Request("layer" + std::to_string(id) + ".weight", {64, 64}, g);
    request.set_request_id(id);
    if (id == 3) request.set_data("short");
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  std::set<uint64_t> ok_ids;
  int errors = 0;
  v1::ReduceStreamResponse response;
  while (stream->Read(&response)) {
    if (response.error_code() != 0) {
      ++errors;
      EXPECT_EQ(response.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_EQ(response.request_id(), 3u);
      EXPECT_EQ(response.tensor(), "layer3.weight");
      EXPECT_THAT(response.error_message(), HasSubstr("data has 5 bytes"));
    } else {
      ok_ids.insert(response.result().request_id());
      EXPECT_EQ(response.result().data(), FloatBytes(g));
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(ok_ids, (std::set<uint64_t>{1, 2, 4, 5}));
  // The pool's threads go idle once their answers are queued, and its
  // gauges say so (bounded wait: a thread may still be on its way back).
  const std::map<std::string, std::string> idle = {{"state", "idle"}};
  const auto settled = [&] {
    return Metric("gradcomp_stream_workers", idle) >= 1 &&
           Metric("gradcomp_stream_workers", {{"state", "running"}}) == 0 &&
           Metric("gradcomp_stream_workers", {{"state", "waiting"}}) == 0;
  };
  for (int i = 0; i < 6000 && !settled(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(Metric("gradcomp_stream_workers", idle), 1);
  EXPECT_EQ(Metric("gradcomp_stream_workers", {{"state", "running"}}), 0);
  EXPECT_EQ(Metric("gradcomp_stream_workers", {{"state", "waiting"}}), 0);
  EXPECT_EQ(Metric("gradcomp_stream_queued_tensors", {}), 0);
}

TEST_F(GradcompServiceTest, GetInfoListsCodecsAndThePolicyHash) {
  grpc::ClientContext context;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&context, v1::GetInfoRequest(), &info).ok());
  EXPECT_FALSE(info.version().empty());
  EXPECT_EQ(info.wire_format_version(), 1u);
  EXPECT_EQ(info.world_size(), 1u);
  EXPECT_EQ(info.rank(), 0u);
  // "cpu" unless a GPU answers here (then its name).
  EXPECT_EQ(info.device() == "cpu", !CreateDeviceCodec({"none", {}}).ok())
      << info.device();
  ASSERT_EQ(info.transports_size(), 1);
  EXPECT_EQ(info.transports(0), "local");
  EXPECT_EQ(info.policy_hash(), engine_->policy()->hash);
  EXPECT_EQ(info.policy().dense_below_numel(), 1024u);
  EXPECT_EQ(info.config_json(), R"({"seed": "7"})");
  EXPECT_EQ(info.flags().at("collective_timeout"), "1m");
  EXPECT_EQ(
      Metric("gradcomp_requests_total", {{"service", "gradcomp.v1.Gradcomp"},
                                         {"method", "GetInfo"},
                                         {"code", "OK"}}),
      1);
  bool found_fp16 = false;
  for (const v1::CodecDescription& codec : info.codecs()) {
    if (codec.name() != "fp16") continue;
    found_fp16 = true;
    EXPECT_EQ(codec.family(), "dense");
    EXPECT_EQ(codec.wire_id(), 2u);
    EXPECT_TRUE(codec.summable());
  }
  EXPECT_TRUE(found_fp16);
}

TEST_F(GradcompServiceTest, SetPolicyValidatesThenSwaps) {
  v1::GetPolicyResponse before;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(
        stub_->GetPolicy(&context, v1::GetPolicyRequest(), &before).ok());
  }
  EXPECT_EQ(before.policy().dense_below_numel(), 1024u);

  v1::SetPolicyRequest bad;
  v1::PolicyRule* rule = bad.mutable_policy()->add_rules();
  rule->set_name_glob("*.weight");
  rule->mutable_codec()->set_name("nosuch");
  v1::SetPolicyResponse set;
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->SetPolicy(&context, bad, &set);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("policy rule 0"));
  }

  v1::SetPolicyRequest good;
  good.mutable_policy()->mutable_default_codec()->set_name("fp16");
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->SetPolicy(&context, good, &set).ok());
  }
  EXPECT_NE(set.hash(), before.hash());
  v1::GetPolicyResponse after;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(
        stub_->GetPolicy(&context, v1::GetPolicyRequest(), &after).ok());
  }
  EXPECT_EQ(after.hash(), set.hash());
  EXPECT_EQ(after.policy().default_codec().name(), "fp16");

  v1::ReduceResponse response;
  ASSERT_TRUE(Reduce(Request("w", {64, 64}, Ramp(4096)), &response).ok());
  EXPECT_EQ(response.stats().codec(), "fp16");
}

TEST_F(GradcompServiceTest, SetPolicyFromAStepLeavesEarlierStepsAsTheyWere) {
  // The call reaches this rank before its step 4 (another rank's, say,
  // after): step 4 still runs the old policy on both, step 5 the new one.
  v1::SetPolicyRequest scheduled;
  scheduled.mutable_policy()->mutable_default_codec()->set_name("fp16");
  scheduled.set_from_step(5);
  v1::SetPolicyResponse set;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->SetPolicy(&context, scheduled, &set).ok());
  }
  v1::GetPolicyResponse shown;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(
        stub_->GetPolicy(&context, v1::GetPolicyRequest(), &shown).ok());
  }
  EXPECT_EQ(shown.hash(), set.hash());
  EXPECT_EQ(shown.from_step(), 5);

  v1::ReduceRequest request = Request("w", {64, 64}, Ramp(4096));
  for (const auto& [step, codec] :
       {std::pair{4, "none"}, {5, "fp16"}, {9, "fp16"}}) {
    request.set_step(step);
    v1::ReduceResponse response;
    ASSERT_TRUE(Reduce(request, &response).ok());
    EXPECT_EQ(response.stats().codec(), codec) << "step " << step;
  }

  scheduled.set_from_step(-1);
  grpc::ClientContext context;
  const grpc::Status status = stub_->SetPolicy(&context, scheduled, &set);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("from_step is -1"));
}

TEST_F(GradcompServiceTest, DeclaredTensorListGuardsTheJob) {
  v1::DeclareTensorsRequest declare;
  declare.set_job("job");
  v1::TensorDeclaration* w = declare.add_tensors();
  w->set_name("w");
  w->set_dtype(v1::DTYPE_FLOAT32);
  w->add_shape(64);
  w->add_shape(64);
  v1::DeclareTensorsResponse declared;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->DeclareTensors(&context, declare, &declared).ok());
  }
  EXPECT_EQ(declared.list_hash().size(), 16u);
  EXPECT_EQ(declared.world_size(), 1);

  v1::ReduceResponse response;
  EXPECT_TRUE(Reduce(Request("w", {64, 64}, Ramp(4096)), &response).ok());
  grpc::Status status = Reduce(Request("v", {64, 64}, Ramp(4096)), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("'v' is not in job 'job''s declared list"));

  declare.add_tensors()->set_name("w");  // a duplicate, dtype unset
  grpc::ClientContext context;
  status = stub_->DeclareTensors(&context, declare, &declared);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("job 'job': "));
}

TEST_F(GradcompServiceTest, ExportAndImportStateRoundTrip) {
  v1::ReduceRequest request = Request("w", {64, 64}, Ramp(4096));
  request.mutable_codec()->set_name("topk");
  (*request.mutable_codec()->mutable_params())["ratio"] = "0.01";
  v1::ReduceResponse response;
  ASSERT_TRUE(Reduce(request, &response).ok());

  v1::ExportStateRequest export_request;
  export_request.set_job("job");
  v1::ExportStateResponse exported;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ExportState(&context, export_request, &exported).ok());
  }
  EXPECT_FALSE(exported.state().empty());

  v1::ImportStateRequest import_request;
  import_request.set_job("job2");
  import_request.set_state(exported.state());
  v1::ImportStateResponse imported;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ImportState(&context, import_request, &imported).ok());
  }
  // The other job now continues from the same state: the same next step.
  request.set_step(1);
  v1::ReduceResponse here, there;
  ASSERT_TRUE(Reduce(request, &here).ok());
  request.set_job("job2");
  ASSERT_TRUE(Reduce(request, &there).ok());
  EXPECT_EQ(here.data(), there.data());
  EXPECT_EQ(Metric("gradcomp_step", {}), 1);

  import_request.set_state("not a state blob");
  grpc::ClientContext context;
  EXPECT_EQ(
      stub_->ImportState(&context, import_request, &imported).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
}

// The streamed state calls: the pieces make the blob the unary call
// returns; an import takes effect whole when its stream ends, and one
// that names two jobs, names none, or breaks imports nothing.
TEST_F(GradcompServiceTest, StateStreamsCarryTheBlobInPiecesOrNothing) {
  // Top-k residual and momentum of 512 Ki floats: 4 MiB, eight pieces.
  constexpr int64_t kFloats = int64_t{512} << 10;
  v1::ReduceRequest request = Request("w", {kFloats}, Ramp(kFloats));
  request.mutable_codec()->set_name("topk");
  (*request.mutable_codec()->mutable_params())["ratio"] = "0.01";
  v1::ReduceResponse response;
  ASSERT_TRUE(Reduce(request, &response).ok());

  const auto export_pieces = [&](const std::string& job) {
    v1::ExportStateRequest export_request;
    export_request.set_job(job);
    grpc::ClientContext context;
    auto reader = stub_->ExportStateStream(&context, export_request);
    std::vector<std::string> pieces;
    for (v1::ExportStateResponse piece; reader->Read(&piece);) {
      pieces.push_back(piece.state());
    }
    EXPECT_TRUE(reader->Finish().ok());
    return pieces;
  };
  const std::vector<std::string> pieces = export_pieces("job");
  ASSERT_GE(pieces.size(), 8u);
  for (const std::string& piece : pieces) {
    EXPECT_LE(piece.size(), GradcompService::kStatePieceBytes);
  }
  const std::string blob = absl::StrJoin(pieces, "");
  {
    v1::ExportStateRequest export_request;
    export_request.set_job("job");
    v1::ExportStateResponse exported;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ExportState(&context, export_request, &exported).ok());
    EXPECT_EQ(exported.state(), blob);
  }
  const std::string empty = absl::StrJoin(export_pieces("never-used"), "");
  const double held = Metric("gradcomp_memory_budget_in_use_bytes", {});
  ASSERT_GT(held, 0);

  // An ImportStateStream of the first `count` pieces (all), each under
  // the job of the same index (the last named for the rest), the first
  // declaring `declared` bytes (the blob's); cancelled after the last piece
  // instead of half-closed if `cancel`.
  struct Import {
    std::vector<std::string> jobs = {"b"};
    std::optional<size_t> count;
    std::optional<uint64_t> declared;
    bool cancel = false;
  };
  const auto import_pieces = [&](const Import& import) {
    grpc::ClientContext context;
    v1::ImportStateResponse imported;
    auto writer = stub_->ImportStateStream(&context, &imported);
    for (size_t i = 0; i < import.count.value_or(pieces.size()); ++i) {
      v1::ImportStateRequest piece;
      piece.set_job(import.jobs[std::min(i, import.jobs.size() - 1)]);
      if (i == 0) piece.set_state_bytes(import.declared.value_or(blob.size()));
      piece.set_state(pieces[i]);
      if (!writer->Write(piece)) break;
    }
    if (import.cancel) {
      context.TryCancel();
    } else {
      writer->WritesDone();
    }
    return writer->Finish();
  };
  // The daemon is done with a stream once the blob it held is freed.
  const auto freed = [&] {
    for (int i = 0;
         i < 600 && Metric("gradcomp_memory_budget_in_use_bytes", {}) > held;
         ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return Metric("gradcomp_memory_budget_in_use_bytes", {}) == held;
  };
  Import import;
  import.jobs = {"", "b"};
  grpc::Status status = import_pieces(import);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("names no job"));
  import.jobs = {"b", "", "c"};
  status = import_pieces(import);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("names job 'c' after the first named 'b'"));
  // Short of what the first message declared (as when a message that
  // cannot be parsed ends the stream early), or over it.
  import = Import();
  import.count = pieces.size() - 1;
  status = import_pieces(import);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      status.error_message(),
      HasSubstr(absl::StrCat("ended after ", blob.size() - pieces.back().size(),
                             " of the ", blob.size(), " bytes")));
  import = Import();
  import.declared = blob.size() - 1;
  status = import_pieces(import);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("bring more than the"));
  import = Import();
  import.declared = uint64_t{1} << 62;
  status = import_pieces(import);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("are more than the whole memory budget"));
  // Every piece written, then cancelled instead of ended: nothing is
  // imported, whether the daemon saw the cancel before its last piece (a
  // short blob) or after (the handler's cancel check; which of the two
  // this run takes is up to the scheduler).
  import = Import();
  import.cancel = true;
  import_pieces(import).IgnoreError();
  EXPECT_TRUE(freed());
  EXPECT_EQ(absl::StrJoin(export_pieces("b"), ""), empty);

  // Later pieces may name the job or leave it out.
  import = Import();
  import.jobs = {"b", "", "b", ""};
  status = import_pieces(import);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(absl::StrJoin(export_pieces("b"), ""), blob);
  // The blob held while it came is freed; b's state counts as job's.
  EXPECT_EQ(Metric("gradcomp_memory_budget_in_use_bytes", {}), 2 * held);
}

TEST_F(GradcompServiceTest, ReleaseJobSaysWhatItFreed) {
  v1::ReduceRequest request = Request("w", {64, 64}, Ramp(4096));
  request.mutable_codec()->set_name("topk");
  (*request.mutable_codec()->mutable_params())["ratio"] = "0.01";
  v1::ReduceResponse response;
  ASSERT_TRUE(Reduce(request, &response).ok());
  const double state = Metric("gradcomp_memory_budget_in_use_bytes", {});
  ASSERT_GT(state, 0);

  v1::ReleaseJobRequest release;
  release.set_job("job");
  v1::ReleaseJobResponse released;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->ReleaseJob(&context, release, &released).ok());
  }
  EXPECT_EQ(released.tensors(), 1u);
  EXPECT_EQ(static_cast<double>(released.state_bytes()), state);
  EXPECT_EQ(Metric("gradcomp_memory_budget_in_use_bytes", {}), 0);

  release.set_job(std::string("job\0w", 5));
  grpc::ClientContext context;
  EXPECT_EQ(stub_->ReleaseJob(&context, release, &released).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A daemon whose memory budget is 1 MiB; its reduces wait 50 ms for room.
class GradcompServiceBudgetTest : public GradcompServiceTest {
 protected:
  static constexpr uint64_t kBudget = 1 << 20;
  EngineOptions Options() const override {
    EngineOptions options;
    options.memory_budget_bytes = kBudget;
    options.memory_wait = absl::Milliseconds(50);
    return options;
  }
};

TEST_F(GradcompServiceBudgetTest, AUnaryReduceHoldsNothingWhileItWaits) {
  // Room for the request's 16 KiB input but not for its working memory. Had
  // it reserved the input first, it would have held it while waiting for
  // the rest (keeping it from others: concurrent arrivals that each held
  // an input could all wait, and be refused, with room enough for some).
  constexpr int kFloats = 4096;
  constexpr uint64_t kInput = kFloats * sizeof(float);
  constexpr uint64_t kBlocked = kBudget - kInput - 1;
  absl::StatusOr<MemoryBudget::Reservation> blocker =
      engine_->ReserveInput(kBlocked, "the test's blocker");
  ASSERT_TRUE(blocker.ok()) << blocker.status();

  v1::ReduceResponse response;
  const grpc::Status status =
      Reduce(Request("w", {kFloats}, Ramp(kFloats)), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(
      status.error_message(),
      HasSubstr(absl::StrCat("bytes, but ", kBlocked, " of the budget's ",
                             kBudget, " bytes are in use")));
  EXPECT_EQ(Metric("gradcomp_memory_budget_in_use_bytes", {}), kBlocked);

  blocker->Release();
  ASSERT_TRUE(Reduce(Request("w", {kFloats}, Ramp(kFloats)), &response).ok());
  EXPECT_EQ(Metric("gradcomp_memory_budget_in_use_bytes", {}), 0);
}

// Room for two whole reduces of a 16 KiB tensor (its input, payload,
// average and response: 64 KiB), no error samples, and reduces held in
// their collective until the test opens it.
class GradcompServiceStreamBudgetTest : public GradcompServiceTest {
 protected:
  static constexpr int kFloats = 4096;
  static constexpr uint64_t kWhole = 4 * kFloats * sizeof(float);
  EngineOptions Options() const override {
    EngineOptions options;
    options.memory_budget_bytes = 2 * kWhole;
    options.memory_wait = absl::Milliseconds(300);
    options.error_sample_rate = 0;
    return options;
  }
};

TEST_F(GradcompServiceStreamBudgetTest, ATensorThatArrivesReservesItWhole) {
  // Four tensors over one stream while the first ones hold their memory.
  // Reserved whole when they arrive, two fit and the other two are refused
  // at the door. Had they reserved only their inputs (all four fit), the
  // workers would have grown into the rest one by one, and the second
  // could find the other inputs holding its room.
  collective_.Close();
  grpc::ClientContext context;
  auto stream = stub_->ReduceStream(&context);
  const std::vector<float> g = Ramp(kFloats);
  for (uint64_t id = 0; id < 4; ++id) {
    v1::ReduceRequest request = Request(absl::StrCat("t", id), {kFloats}, g);
    request.set_request_id(id);
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  v1::ReduceStreamResponse response;
  for (int refused = 0; refused < 2; ++refused) {
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(response.error_message(),
                HasSubstr(absl::StrCat("its inline input and working memory "
                                       "needs ",
                                       kWhole, " bytes")));
    EXPECT_THAT(response.tensor(), ::testing::AnyOf("t2", "t3"));
  }
  collective_.Open();
  std::set<std::string> reduced;
  while (stream->Read(&response)) {
    EXPECT_EQ(response.error_code(), 0) << response.error_message();
    EXPECT_EQ(response.result().data(), FloatBytes(g));
    reduced.insert(response.result().tensor());
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(reduced, (std::set<std::string>{"t0", "t1"}));
}

// One rank: the tensors still queued when the client cancels its stream
// are not reduced (nobody reads their answers, and no peer waits for
// them), and are counted CANCELLED. Before, all were reduced and counted
// OK (a review helper: 300 reduced after a cancel, another client's tensor
// waiting 13 s behind them).
TEST_F(GradcompServiceTest, ATensorQueuedWhenItsStreamIsCancelledIsNotReduced) {
  constexpr int kTensors = 40;
  collective_.Close();
  grpc::ClientContext context;
  auto stream = stub_->ReduceStream(&context);
  const std::vector<float> g = Ramp(64);
  for (int id = 0; id < kTensors; ++id) {
    v1::ReduceRequest request = Request(absl::StrCat("t", id), {64}, g);
    request.set_request_id(id);
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  // Every tensor read: some running (held at the gate), the rest queued.
  for (int i = 0; i < 600 && Metric("gradcomp_stream_queued_tensors", {}) +
                                     Metric("gradcomp_stream_workers",
                                            {{"state", "running"}}) <
                                 kTensors;
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GT(Metric("gradcomp_stream_queued_tensors", {}), 0);
  context.TryCancel();
  // The server learns of the cancel before the gate opens.
  absl::SleepFor(absl::Milliseconds(500));
  collective_.Open();
  stream->Finish().IgnoreError();
  const auto count = [&](const char* code) {
    double total = 0;
    for (const char* codec : {"none", "unresolved"}) {
      total +=
          Metric("gradcomp_reduce_total", {{"codec", codec}, {"code", code}});
    }
    return total;
  };
  // Every tensor ends one way or the other once the workers are done.
  for (int i = 0; i < 200 && count("OK") + count("CANCELLED") < kTensors; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(count("OK") + count("CANCELLED"), kTensors);
  EXPECT_GT(count("CANCELLED"), 0);
  EXPECT_LT(count("OK"), kTensors);
}

// One worker and room for four queued tensors.
class GradcompServiceSmallQueueTest : public GradcompServiceTest {
 protected:
  StreamOptions Streams() const override {
    StreamOptions streams;
    streams.pool.running = 1;
    streams.pool.threads = 1;
    streams.pool.queued = 4;
    return streams;
  }
};

// A stream that fills the queue has its newest tensor displaced by another
// stream's, instead of the other stream being refused (a review helper: a
// flooding client had everyone else refused at --max_queued_requests).
TEST_F(GradcompServiceSmallQueueTest,
       AFloodingStreamIsRefusedRatherThanOthers) {
  collective_.Close();
  // A failed assertion must not leave the streams' handlers at the gate.
  absl::Cleanup open_gate = [this] { collective_.Open(); };
  const std::vector<float> g = Ramp(64);
  grpc::ClientContext flood_context;
  auto flood = stub_->ReduceStream(&flood_context);
  for (int id = 0; id < 5; ++id) {
    v1::ReduceRequest request = Request(absl::StrCat("t", id), {64}, g);
    request.set_request_id(id);
    ASSERT_TRUE(flood->Write(request));
    // The first on the worker before the others come: queued until then,
    // it would make the fifth one too many.
    if (id == 0) collective_.WaitUntilEntered();
  }
  // One held at the gate, four queued.
  for (int i = 0; i < 600 && Metric("gradcomp_stream_queued_tensors", {}) < 4;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(Metric("gradcomp_stream_queued_tensors", {}), 4);
  grpc::ClientContext other_context;
  auto other = stub_->ReduceStream(&other_context);
  ASSERT_TRUE(other->Write(Request("b", {64}, g)));
  other->WritesDone();
  // The flood's newest makes room, and says so before anything runs.
  v1::ReduceStreamResponse response;
  ASSERT_TRUE(flood->Read(&response));
  EXPECT_EQ(response.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(response.tensor(), "t4");
  EXPECT_THAT(response.error_message(),
              HasSubstr("4 stream tensors are already waiting"));
  EXPECT_THAT(response.error_message(),
              HasSubstr("gave its place to another stream's"));
  collective_.Open();
  ASSERT_TRUE(other->Read(&response));
  EXPECT_EQ(response.error_code(), 0) << response.error_message();
  EXPECT_EQ(response.result().tensor(), "b");
  EXPECT_TRUE(other->Finish().ok());
  flood->WritesDone();
  std::set<std::string> reduced;
  while (flood->Read(&response)) {
    EXPECT_EQ(response.error_code(), 0) << response.error_message();
    reduced.insert(response.result().tensor());
  }
  EXPECT_TRUE(flood->Finish().ok());
  EXPECT_EQ(reduced, (std::set<std::string>{"t0", "t1", "t2", "t3"}));
  EXPECT_EQ(Metric("gradcomp_resource_exhausted_total",
                   {{"resource", "stream_queue"}}),
            1);
}

// A short stall timeout.
class GradcompServiceStallTest : public GradcompServiceTest {
 protected:
  StreamOptions Streams() const override {
    StreamOptions streams;
    streams.stall_timeout = absl::Milliseconds(300);
    return streams;
  }
};

// A client that stays connected but stops reading: its answers, more than
// HTTP/2 flow control lets through, held their budget for ever (a review
// helper: two such streams locked a 512 MiB daemon's other clients out).
// The stream is cancelled after the write timeout, and the budget freed.
TEST_F(GradcompServiceStallTest, AStreamWhoseClientStopsReadingIsCancelled) {
  constexpr int64_t kFloats = int64_t{4} << 20;  // 16 MiB answers
  const std::vector<float> g = Ramp(kFloats);
  grpc::ClientContext context;
  auto stalled = stub_->ReduceStream(&context);
  for (int id = 0; id < 4; ++id) {
    v1::ReduceRequest request = Request(absl::StrCat("t", id), {kFloats}, g);
    request.set_request_id(id);
    ASSERT_TRUE(stalled->Write(request));
  }
  // Nothing read: the answers wait until the watchdog cancels the stream.
  for (int i = 0;
       i < 600 && Metric("gradcomp_stalled_streams_cancelled_total", {}) < 1;
       ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Metric("gradcomp_stalled_streams_cancelled_total", {}), 1);
  for (int i = 0;
       i < 600 && Metric("gradcomp_memory_budget_in_use_bytes", {}) > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Metric("gradcomp_memory_budget_in_use_bytes", {}), 0);
  if (HasFailure()) context.TryCancel();  // not to hang on the reads below
  v1::ReduceStreamResponse response;
  while (stalled->Read(&response)) {
  }
  EXPECT_EQ(stalled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Everyone else is served as before; a reading client is not cancelled.
  grpc::ClientContext other_context;
  auto other = stub_->ReduceStream(&other_context);
  ASSERT_TRUE(other->Write(Request("b", {kFloats}, g)));
  other->WritesDone();
  ASSERT_TRUE(other->Read(&response));
  EXPECT_EQ(response.error_code(), 0) << response.error_message();
  EXPECT_TRUE(other->Finish().ok());
  EXPECT_EQ(Metric("gradcomp_stalled_streams_cancelled_total", {}), 1);
}

// The state streams' clients stall too: an import whose client sends
// nothing more held the whole blob's budget, and an export whose client
// reads nothing held its copy of the state and a gRPC thread, for ever.
TEST_F(GradcompServiceStallTest, StateStreamsWhoseClientStallsAreCancelled) {
  const auto in_use = [&](double bytes) {
    for (int i = 0;
         i < 600 && Metric("gradcomp_memory_budget_in_use_bytes", {}) != bytes;
         ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return Metric("gradcomp_memory_budget_in_use_bytes", {}) == bytes;
  };
  grpc::ClientContext import_context;
  v1::ImportStateResponse imported;
  auto import = stub_->ImportStateStream(&import_context, &imported);
  v1::ImportStateRequest first;
  first.set_job("j");
  first.set_state_bytes(uint64_t{8} << 20);
  first.set_state(std::string(1024, 'x'));
  ASSERT_TRUE(import->Write(first));
  // What came is held, not what the first message declared.
  EXPECT_TRUE(in_use(1024));
  // Empty pieces are no progress: the stream is cancelled all the same.
  const auto stalled = [&](double n, const std::function<void()>& meanwhile) {
    for (int i = 0;
         i < 600 && Metric("gradcomp_stalled_streams_cancelled_total", {}) < n;
         ++i) {
      meanwhile();
      absl::SleepFor(absl::Milliseconds(100));
    }
    return Metric("gradcomp_stalled_streams_cancelled_total", {}) == n;
  };
  EXPECT_TRUE(stalled(1, [&] { import->Write(v1::ImportStateRequest()); }));
  if (HasFailure()) import_context.TryCancel();
  EXPECT_EQ(import->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(in_use(0));

  // Top-k residual and momentum of 4 Mi floats: 32 MiB, more than flow
  // control lets through unread.
  constexpr int64_t kFloats = int64_t{4} << 20;
  v1::ReduceRequest request = Request("w", {kFloats}, Ramp(kFloats));
  request.mutable_codec()->set_name("topk");
  (*request.mutable_codec()->mutable_params())["ratio"] = "0.01";
  v1::ReduceResponse response;
  ASSERT_TRUE(Reduce(request, &response).ok());
  grpc::ClientContext export_context;
  v1::ExportStateRequest export_request;
  export_request.set_job("job");
  auto exported = stub_->ExportStateStream(&export_context, export_request);
  EXPECT_TRUE(stalled(2, [] {}));
  if (HasFailure()) export_context.TryCancel();
  v1::ExportStateResponse piece;
  while (exported->Read(&piece)) {
  }
  EXPECT_EQ(exported->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(GradcompServiceStreamBudgetTest, ABadlySizedTensorIsRefusedForItsSize) {
  // A shape of 128 KiB with 4 bytes of data: reserved by its shape (4x,
  // over the whole budget), it was refused as memory exhausted and counted
  // so, where a unary reduce says what is wrong with it.
  grpc::ClientContext context;
  auto stream = stub_->ReduceStream(&context);
  v1::ReduceRequest request = Request("w", {8 * kFloats}, {1.0f});
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  v1::ReduceStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(response.error_message(),
              HasSubstr(absl::StrCat("data has 4 bytes, expected ",
                                     8 * kFloats * sizeof(float))));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(
      Metric("gradcomp_resource_exhausted_total", {{"resource", "memory"}}), 0);
  EXPECT_EQ(Metric("gradcomp_memory_budget_in_use_bytes", {}), 0);
}

// The same daemon as rank 0 of 2, beside a mirror peer, so that gossip
// has a neighbour.
class GradcompServiceGossipBudgetTest : public GradcompServiceStreamBudgetTest {
 protected:
  void SetUp() override {
    collective_.AddMirrorPeer();
    GradcompServiceStreamBudgetTest::SetUp();
  }
};

TEST_F(GradcompServiceGossipBudgetTest, ATensorThatArrivesReservesItsMessages) {
  // In exact gossip a round holds a copy of the tensor to and from each
  // neighbour and two at hand: with one neighbour, four tensors more than
  // an average, 128 KiB in all, the whole budget. One fits; the others are
  // refused at the door. Had the estimate left the messages out, two would
  // have been admitted at 64 KiB, and each worker, growing into the rest,
  // would have waited on the other's input until both were refused.
  constexpr uint64_t kWholeGossip = kWhole + 4 * kFloats * sizeof(float);
  const std::vector<float> g = Ramp(kFloats);
  // Step 0 estimates by the request's spec, before the job's first round
  // has built its node; step 1 by the node.
  for (int64_t step = 0; step < 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    collective_.Close();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    auto stream = stub_->ReduceStream(&context);
    for (uint64_t id = 0; id < 4; ++id) {
      v1::ReduceRequest request = Request(absl::StrCat("t", id), {kFloats}, g);
      request.set_step(step);
      request.set_request_id(id);
      request.set_mode(v1::REDUCE_MODE_GOSSIP);
      request.mutable_gossip()->set_topology("ring");
      ASSERT_TRUE(stream->Write(request));
    }
    stream->WritesDone();
    v1::ReduceStreamResponse response;
    std::set<std::string> refused;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(stream->Read(&response));
      EXPECT_EQ(response.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << response.result().tensor();
      EXPECT_THAT(response.error_message(),
                  HasSubstr(absl::StrCat("its inline input and working memory "
                                         "needs ",
                                         kWholeGossip, " bytes")));
      refused.insert(response.tensor());
    }
    EXPECT_EQ(refused, (std::set<std::string>{"t1", "t2", "t3"}));
    collective_.Open();
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.error_code(), 0) << response.error_message();
    EXPECT_EQ(response.result().tensor(), "t0");
    EXPECT_EQ(response.result().stats().codec(), "gossip");
    // Mixed with an identical neighbour: unchanged.
    EXPECT_EQ(response.result().data(), FloatBytes(g));
    EXPECT_FALSE(stream->Read(&response));
    EXPECT_TRUE(stream->Finish().ok());
  }
}

TEST_F(GradcompServiceTest, SharedMemoryIsOffByDefault) {
  {
    grpc::ClientContext context;
    v1::RegisterSystemSharedMemoryResponse response;
    const grpc::Status status = stub_->RegisterSystemSharedMemory(
        &context, v1::RegisterSystemSharedMemoryRequest(), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(), HasSubstr("--allow_client_shm"));
  }
  {
    grpc::ClientContext context;
    v1::SharedMemoryStatusResponse response;
    EXPECT_EQ(stub_
                  ->SharedMemoryStatus(
                      &context, v1::SharedMemoryStatusRequest(), &response)
                  .error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext context;
    v1::UnregisterSharedMemoryResponse response;
    EXPECT_EQ(stub_
                  ->UnregisterSharedMemory(
                      &context, v1::UnregisterSharedMemoryRequest(), &response)
                  .error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  v1::ReduceRequest request = Request("w", {4}, {1, 2, 3, 4});
  request.mutable_output_shm()->set_region("r");
  request.mutable_output_shm()->set_byte_size(16);
  v1::ReduceResponse response;
  const grpc::Status status = Reduce(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("tensor 'w' step 0: output_shm: client shared memory "
                        "is off"));
}

TEST_F(GradcompServiceTest, HealthCheckIsServing) {
  // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message; the
  // response is field 1 (status) as a varint, SERVING = 1: bytes 08 01.
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer reply;
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check",
                    grpc::StubOptions(), &request, &reply, [&](grpc::Status s) {
                      absl::MutexLock lock(&mu);
                      status = std::move(s);
                      done = true;
                    });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(reply.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

// The service with --allow_client_shm: a registry, and clients that name
// themselves with the gradcomp-client-id metadata.
class GradcompShmTest : public ::testing::Test {
 protected:
  virtual EngineOptions Options() const { return EngineOptions(); }

  void SetUp() override {
    auto engine = Engine::Create(Options(), codecs::BuiltinCodecs(), &store_,
                                 &collective_, &metrics_, Policy());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    SharedMemoryOptions options;
    options.reclaim_interval = absl::ZeroDuration();
    shm_ = std::make_unique<SharedMemoryRegistry>(options, &metrics_);
    service_ = std::make_unique<GradcompService>(engine_.get(), &metrics_,
                                                 StreamOptions(),
                                                 DaemonSettings(), shm_.get());
    int port = 0;
    auto server =
        StartGrpcServer("127.0.0.1:0", service_.get(), &port, &metrics_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Gradcomp::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    collective_.Open();
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<grpc::ClientContext> As(const std::string& client) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("gradcomp-client-id", client);
    return context;
  }

  grpc::Status Register(const std::string& client, const std::string& name,
                        const std::string& key, uint64_t offset,
                        uint64_t byte_size) {
    v1::RegisterSystemSharedMemoryRequest request;
    request.set_name(name);
    request.set_shm_key(key);
    request.set_offset(offset);
    request.set_byte_size(byte_size);
    v1::RegisterSystemSharedMemoryResponse response;
    return stub_->RegisterSystemSharedMemory(As(client).get(), request,
                                             &response);
  }

  grpc::Status Unregister(const std::string& client, const std::string& name) {
    v1::UnregisterSharedMemoryRequest request;
    request.set_name(name);
    v1::UnregisterSharedMemoryResponse response;
    return stub_->UnregisterSharedMemory(As(client).get(), request, &response);
  }

  grpc::Status Reduce(const std::string& client,
                      const v1::ReduceRequest& request,
                      v1::ReduceResponse* response) {
    return stub_->Reduce(As(client).get(), request, response);
  }

  // A float32 request of `n` values read from and written to `region`.
  static v1::ReduceRequest ShmRequest(const std::string& region, size_t n,
                                      uint64_t in_offset, uint64_t out_offset) {
    v1::ReduceRequest r;
    r.set_job("job");
    r.set_tensor("fc.weight");
    r.set_dtype(v1::DTYPE_FLOAT32);
    r.add_shape(static_cast<int64_t>(n));
    r.mutable_input_shm()->set_region(region);
    r.mutable_input_shm()->set_offset(in_offset);
    r.mutable_input_shm()->set_byte_size(n * sizeof(float));
    r.mutable_output_shm()->set_region(region);
    r.mutable_output_shm()->set_offset(out_offset);
    r.mutable_output_shm()->set_byte_size(n * sizeof(float));
    return r;
  }

  std::unique_ptr<client::ShmRegion> NewRegion(uint64_t size) {
    auto region = client::ShmRegion::Create(size, "service-test");
    EXPECT_TRUE(region.ok()) << region.status();
    return region.ok() ? std::move(*region) : nullptr;
  }

  codecs::StateStore store_;
  Metrics metrics_{&store_, "test"};
  GatedCollective collective_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SharedMemoryRegistry> shm_;
  std::unique_ptr<GradcompService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Gradcomp::Stub> stub_;
};

// The C++ helper's default prefix is kept apart from the daemon's (the
// client may not depend on the daemon): the two must not drift.
TEST(ShmPrefixTest, TheClientsDefaultIsTheDaemons) {
  EXPECT_STREQ(client::kDefaultShmPrefix, kDefaultShmPrefix);
}

TEST_F(GradcompShmTest, ReduceReadsAndWritesTheMappedRegion) {
  collective_.Open();
  const size_t n = 4096;
  std::unique_ptr<client::ShmRegion> region = NewRegion(2 * n * sizeof(float));
  ASSERT_NE(region, nullptr);
  const std::vector<float> g = Ramp(n);
  std::copy(g.begin(), g.end(), region->floats().begin());
  ASSERT_TRUE(
      Register("c1", "grads", region->key(), 0, region->byte_size()).ok());

  v1::ReduceRequest request = ShmRequest("grads", n, 0, n * sizeof(float));
  request.set_request_id(5);
  v1::ReduceResponse response;
  const grpc::Status status = Reduce("c1", request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.data().empty());
  EXPECT_EQ(response.request_id(), 5u);
  EXPECT_EQ(response.stats().raw_bytes(), n * 4);
  // World size 1 with `none`: the average is the input, in the output slice.
  EXPECT_TRUE(std::equal(g.begin(), g.end(), region->floats().begin() + n));

  // Inline input, shared-memory output: a compressing codec.
  v1::ReduceRequest mixed = Request("fc.weight", {64, 64}, g);
  mixed.set_step(1);
  mixed.mutable_codec()->set_name("fp16");
  *mixed.mutable_output_shm() = request.output_shm();
  ASSERT_TRUE(Reduce("c1", mixed, &response).ok());
  EXPECT_TRUE(response.data().empty());
  EXPECT_NEAR(region->floats()[n + 10], g[10], 1e-3);

  v1::SharedMemoryStatusResponse listed;
  ASSERT_TRUE(stub_
                  ->SharedMemoryStatus(As("c1").get(),
                                       v1::SharedMemoryStatusRequest(), &listed)
                  .ok());
  ASSERT_EQ(listed.regions_size(), 1);
  EXPECT_EQ(listed.regions(0).name(), "grads");
  EXPECT_EQ(listed.regions(0).kind(), "system");
  EXPECT_EQ(listed.regions(0).byte_size(), 2 * n * sizeof(float));
  EXPECT_EQ(MetricValue(*metrics_.collectable(), "gradcomp_shm_regions"), 1);
  EXPECT_EQ(MetricValue(*metrics_.collectable(), "gradcomp_shm_bytes"),
            2 * n * sizeof(float));
  EXPECT_TRUE(Unregister("c1", "grads").ok());
  EXPECT_EQ(MetricValue(*metrics_.collectable(), "gradcomp_shm_regions"), 0);
}

TEST_F(GradcompShmTest, BadSlicesUnknownRegionsAndOtherClients) {
  collective_.Open();
  const size_t n = 256;
  std::unique_ptr<client::ShmRegion> region = NewRegion(2 * n * sizeof(float));
  ASSERT_NE(region, nullptr);
  ASSERT_TRUE(
      Register("c1", "grads", region->key(), 0, region->byte_size()).ok());
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  struct Case {
    std::string what;
    std::function<void(v1::ReduceRequest&)> mutate;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"past the end",
       [](v1::ReduceRequest& r) { r.mutable_input_shm()->set_offset(1028); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "input_shm: slice offset 1028 byte_size 1024"},
      {"offset + size wraps",
       [max](v1::ReduceRequest& r) {
         r.mutable_output_shm()->set_offset(max - 8);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "output_shm: slice offset"},
      {"size too big for the shape",
       [](v1::ReduceRequest& r) { r.mutable_input_shm()->set_byte_size(8); },
       grpc::StatusCode::INVALID_ARGUMENT, "data has 8 bytes, expected 1024"},
      {"unknown region",
       [](v1::ReduceRequest& r) { r.mutable_input_shm()->set_region("nope"); },
       grpc::StatusCode::NOT_FOUND,
       "input_shm: no shared-memory region 'nope'"},
      {"overlap",
       [](v1::ReduceRequest& r) { r.mutable_output_shm()->set_offset(512); },
       grpc::StatusCode::INVALID_ARGUMENT, "overlap; expected disjoint"},
  };
  for (const Case& c : cases) {
    v1::ReduceRequest request = ShmRequest("grads", n, 0, n * sizeof(float));
    c.mutate(request);
    v1::ReduceResponse response;
    const grpc::Status status = Reduce("c1", request, &response);
    EXPECT_EQ(status.error_code(), c.code) << c.what;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.what;
  }
  // Another client: its own region under the same name is refused, and it
  // cannot reduce from the first client's.
  std::unique_ptr<client::ShmRegion> other = NewRegion(64);
  ASSERT_NE(other, nullptr);
  const grpc::Status clash = Register("c2", "grads", other->key(), 0, 64);
  EXPECT_EQ(clash.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(clash.error_message(),
              HasSubstr("already registered by another client;"));
  EXPECT_THAT(clash.error_message(), Not(HasSubstr("'c1'")));
  v1::ReduceResponse response;
  EXPECT_EQ(
      Reduce("c2", ShmRequest("grads", n, 0, n * 4), &response).error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  // Nothing failed was left in flight.
  EXPECT_TRUE(Unregister("c1", "grads").ok());

  // CUDA regions: a malformed request is refused saying what was expected;
  // a well-formed one needs a usable GPU (a zero handle is then refused by
  // CUDA, cuda_ipc_gpu_test opens a real one). The system region still works.
  v1::RegisterCudaSharedMemoryResponse cuda;
  v1::RegisterCudaSharedMemoryRequest cuda_request;
  cuda_request.set_name("dev");
  cuda_request.set_byte_size(64);
  const grpc::Status malformed =
      stub_->RegisterCudaSharedMemory(As("c1").get(), cuda_request, &cuda);
  EXPECT_EQ(malformed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(malformed.error_message(), HasSubstr("expected the 64 bytes"));
  cuda_request.set_raw_handle(std::string(64, '\0'));
  const grpc::Status status =
      stub_->RegisterCudaSharedMemory(As("c1").get(), cuda_request, &cuda);
  if (CudaIpcRegion::DeviceAvailable().ok()) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  } else {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(status.error_message(),
                HasSubstr("this gradcompd has no usable CUDA device: "));
  }
  EXPECT_EQ(
      Reduce("c1", ShmRequest("dev", n, 0, n * 4), &response).error_code(),
      grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Register("c1", "grads", other->key(), 0, 64).ok());
  EXPECT_TRUE(Unregister("c1", "grads").ok());
}

TEST_F(GradcompShmTest, UnregisterIsRefusedWhileARequestIsInFlight) {
  const size_t n = 1024;
  std::unique_ptr<client::ShmRegion> region = NewRegion(2 * n * sizeof(float));
  ASSERT_NE(region, nullptr);
  ASSERT_TRUE(
      Register("c1", "grads", region->key(), 0, region->byte_size()).ok());
  region->floats()[3] = 7.0f;
  grpc::Status reduced;
  std::thread in_flight([&] {
    v1::ReduceResponse response;
    reduced =
        Reduce("c1", ShmRequest("grads", n, 0, n * sizeof(float)), &response);
  });
  // The request holds both slices while its collective waits at the gate.
  collective_.WaitUntilEntered();
  const grpc::Status refused = Unregister("c1", "grads");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("'grads' (2 in flight)"));
  collective_.Open();
  in_flight.join();
  ASSERT_TRUE(reduced.ok()) << reduced.error_message();
  EXPECT_EQ(region->floats()[n + 3], 7.0f);
  EXPECT_TRUE(Unregister("c1", "grads").ok());
}

// A client's id comes from its metadata: without it, the connection's peer
// address owns the region, and a client naming itself cannot use it.
TEST_F(GradcompShmTest, ClientsWithoutAnIdOwnRegionsByConnection) {
  collective_.Open();
  std::unique_ptr<client::ShmRegion> region = NewRegion(64);
  ASSERT_NE(region, nullptr);
  v1::RegisterSystemSharedMemoryRequest request;
  request.set_name("anon");
  request.set_shm_key(region->key());
  request.set_byte_size(64);
  v1::RegisterSystemSharedMemoryResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(
      stub_->RegisterSystemSharedMemory(&context, request, &response).ok());
  EXPECT_EQ(Unregister("c1", "anon").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  grpc::ClientContext again;
  v1::UnregisterSharedMemoryRequest unregister;
  v1::UnregisterSharedMemoryResponse unregistered;
  ASSERT_TRUE(
      stub_->UnregisterSharedMemory(&again, unregister, &unregistered).ok());
  EXPECT_EQ(MetricValue(*metrics_.collectable(), "gradcomp_shm_regions"), 0);
}

// Over a unix socket every connection's peer address is "unix:": a caller
// without an id is refused shared memory rather than sharing the regions
// of every other such caller; with an id it is served as over TCP.
TEST_F(GradcompShmTest, UnixCallersWithoutAnIdAreRefusedSharedMemory) {
  collective_.Open();
  GradcompService unix_service(engine_.get(), &metrics_, StreamOptions(),
                               DaemonSettings(), shm_.get());
  // Not under TEST_TMPDIR: a socket's path holds at most 107 characters.
  const std::string path =
      absl::StrCat("/tmp/gradcomp-service-test.", getpid(), ".sock");
  auto server = StartGrpcServer("unix:" + path, &unix_service, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::Gradcomp::Stub> stub = v1::Gradcomp::NewStub(
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  std::unique_ptr<client::ShmRegion> region = NewRegion(64);
  ASSERT_NE(region, nullptr);
  v1::RegisterSystemSharedMemoryRequest request;
  request.set_name("anon");
  request.set_shm_key(region->key());
  request.set_byte_size(64);
  v1::RegisterSystemSharedMemoryResponse response;
  grpc::ClientContext anonymous;
  const grpc::Status refused =
      stub->RegisterSystemSharedMemory(&anonymous, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("'gradcomp-client-id'"));
  // An empty id names nobody: every caller that sent one would share it.
  const grpc::Status empty =
      stub->RegisterSystemSharedMemory(As("").get(), request, &response);
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty.error_message(), HasSubstr("'gradcomp-client-id'"));
  grpc::ClientContext listing;
  v1::SharedMemoryStatusResponse listed;
  EXPECT_EQ(stub->SharedMemoryStatus(&listing, v1::SharedMemoryStatusRequest(),
                                     &listed)
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext unregistering;
  v1::UnregisterSharedMemoryResponse unregistered;
  EXPECT_EQ(stub->UnregisterSharedMemory(&unregistering,
                                         v1::UnregisterSharedMemoryRequest(),
                                         &unregistered)
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // A reduce into a slice, named by a registered region, is refused too.
  ASSERT_TRUE(
      stub->RegisterSystemSharedMemory(As("c1").get(), request, &response)
          .ok());
  v1::ReduceRequest reduce = ShmRequest("anon", 8, 0, 32);
  grpc::ClientContext reducing;
  v1::ReduceResponse reduced;
  const grpc::Status slice = stub->Reduce(&reducing, reduce, &reduced);
  EXPECT_EQ(slice.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(slice.error_message(),
              HasSubstr("input_shm: shared memory over"));
  EXPECT_TRUE(stub->Reduce(As("c1").get(), reduce, &reduced).ok());
  EXPECT_TRUE(stub->UnregisterSharedMemory(As("c1").get(),
                                           v1::UnregisterSharedMemoryRequest(),
                                           &unregistered)
                  .ok());
  (*server)->Shutdown();
  unlink(path.c_str());
}

// Room in the memory budget for the working memory of two 1024-float
// tensors in shared memory, and a short wait for more.
class GradcompShmBudgetTest : public GradcompShmTest {
 protected:
  static constexpr size_t kPart = 1024;
  EngineOptions Options() const override {
    EngineOptions options;
    options.memory_budget_bytes = 2 * 2 * kPart * sizeof(float);
    options.memory_wait = absl::Milliseconds(300);
    options.error_sample_rate = 0;
    return options;
  }

  // A request of `parts` tensors of kPart floats, from `first` on, in
  // region "grads": five tensors' inputs, then their outputs.
  static v1::ReduceRequest Parts(uint64_t id, size_t first, size_t parts) {
    v1::ReduceRequest request =
        ShmRequest("grads", parts * kPart, first * kPart * sizeof(float),
                   (5 + first) * kPart * sizeof(float));
    request.clear_tensor();
    request.clear_shape();
    request.set_request_id(id);
    for (size_t i = 0; i < parts; ++i) {
      v1::ReducePart* part = request.add_parts();
      part->set_tensor(absl::StrCat("p", first + i));
      part->add_shape(kPart);
      part->set_offset(i * kPart * sizeof(float));
    }
    return request;
  }
};

// The parts of a request share its --memory_wait: with the budget full, a
// request's first part waits for room and the others are refused at once.
// Each waited the whole wait in turn (a review helper: 128 parts x 10 s).
TEST_F(GradcompShmBudgetTest, PartsShareTheirRequestsMemoryWait) {
  std::unique_ptr<client::ShmRegion> region =
      NewRegion(10 * kPart * sizeof(float));
  ASSERT_NE(region, nullptr);
  ASSERT_TRUE(
      Register("c1", "grads", region->key(), 0, region->byte_size()).ok());
  auto context = As("c1");
  auto stream = stub_->ReduceStream(context.get());
  // Two parts fill the budget and wait at the gate.
  ASSERT_TRUE(stream->Write(Parts(1, 0, 2)));
  const auto in_use = [&] {
    return MetricValue(*metrics_.collectable(),
                       "gradcomp_memory_budget_in_use_bytes", {});
  };
  for (int i = 0; i < 600 && in_use() < 4 * kPart * sizeof(float); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(in_use(), 4 * kPart * sizeof(float));
  ASSERT_TRUE(stream->Write(Parts(2, 2, 3)));
  v1::ReduceStreamResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 2u);
  ASSERT_EQ(response.part_results_size(), 3) << response.DebugString();
  for (int i = 0; i < 3; ++i) {
    const v1::ReduceStreamResponse& part = response.part_results(i);
    EXPECT_EQ(part.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    // The first waits (up to the request's deadline), the rest do not.
    EXPECT_THAT(part.error_message(), HasSubstr("none came free within "));
    EXPECT_EQ(absl::StrContains(part.error_message(), "within 0;"), i > 0)
        << "part " << i << ": " << part.error_message();
  }
  collective_.Open();
  stream->WritesDone();
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.request_id(), 1u);
  for (const v1::ReduceStreamResponse& part : response.part_results()) {
    EXPECT_EQ(part.error_code(), 0) << part.error_message();
  }
  EXPECT_TRUE(stream->Finish().ok());
}

// A request with parts: each part is reduced as a tensor of its own, and the
// answers come back in one message, in the parts' order, a failed part
// beside the others' results.
TEST_F(GradcompShmTest, ReduceStreamAnswersEachPartOfABucket) {
  collective_.Open();
  const size_t n = 16 + 3 + 10;  // parts a [4, 4], b [3], c [2, 5]
  const uint64_t out = n * sizeof(float);
  std::unique_ptr<client::ShmRegion> region = NewRegion(2 * out);
  ASSERT_NE(region, nullptr);
  const std::vector<float> g = Ramp(n);
  std::copy(g.begin(), g.end(), region->floats().begin());
  // The last 4 bytes are left out: part c's output does not fit.
  ASSERT_TRUE(
      Register("c1", "grads", region->key(), 0, region->byte_size() - 4).ok());

  v1::ReduceRequest request = ShmRequest("grads", n, 0, out);
  request.clear_tensor();
  request.clear_shape();
  request.set_request_id(9);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> parts = {
      {"a", {4, 4}}, {"b", {3}}, {"c", {2, 5}}};
  uint64_t offset = 0;
  for (const auto& [name, shape] : parts) {
    v1::ReducePart* part = request.add_parts();
    part->set_tensor(name);
    part->mutable_shape()->Assign(shape.begin(), shape.end());
    part->set_offset(offset);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    offset += numel * sizeof(float);
  }
  // The unary call cannot answer parts.
  v1::ReduceResponse unary;
  const grpc::Status refused = Reduce("c1", request, &unary);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("over ReduceStream"));

  v1::ReduceRequest overlapping = request;
  overlapping.set_request_id(10);
  overlapping.mutable_parts(1)->set_offset(60);
  auto context = As("c1");
  auto stream = stub_->ReduceStream(context.get());
  ASSERT_TRUE(stream->Write(overlapping));
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  std::map<uint64_t, v1::ReduceStreamResponse> answers;
  v1::ReduceStreamResponse response;
  while (stream->Read(&response)) answers[response.request_id()] = response;
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_EQ(answers.size(), 2u);

  const v1::ReduceStreamResponse& bad = answers[10];
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(),
              HasSubstr("request 10: parts 0 ('a', bytes 0..64) and 1 ('b', "
                        "from byte 60) overlap"));
  EXPECT_EQ(bad.part_results_size(), 0);

  const v1::ReduceStreamResponse& answer = answers[9];
  EXPECT_EQ(answer.error_code(), 0);
  ASSERT_EQ(answer.part_results_size(), 3) << answer.DebugString();
  for (int i = 0; i < 2; ++i) {
    const v1::ReduceStreamResponse& part = answer.part_results(i);
    EXPECT_EQ(part.error_code(), 0) << part.error_message();
    EXPECT_EQ(part.result().request_id(), static_cast<uint64_t>(i));
    EXPECT_EQ(part.result().stats().raw_bytes(),
              (i == 0 ? 16 : 3) * sizeof(float));
  }
  const v1::ReduceStreamResponse& c = answer.part_results(2);
  EXPECT_EQ(c.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(c.request_id(), 2u);
  EXPECT_EQ(c.tensor(), "c");
  EXPECT_THAT(c.error_message(), HasSubstr("output_shm: slice offset"));
  // World size 1 with `none`: parts a and b come back as they went in.
  const float* result = region->floats().data() + n;
  EXPECT_TRUE(std::equal(g.begin(), g.begin() + 19, result));
  EXPECT_TRUE(Unregister("c1", "grads").ok());
}

// A model's zero-element parameter in a bucket: its part is answered (with
// nothing to write) beside the others instead of refusing the bucket.
TEST_F(GradcompShmTest, AZeroElementPartIsAnsweredBesideTheOthers) {
  collective_.Open();
  const size_t n = 8;
  std::unique_ptr<client::ShmRegion> region = NewRegion(2 * n * sizeof(float));
  ASSERT_NE(region, nullptr);
  const std::vector<float> g = Ramp(n);
  std::copy(g.begin(), g.end(), region->floats().begin());
  ASSERT_TRUE(
      Register("c1", "grads", region->key(), 0, region->byte_size()).ok());
  v1::ReduceRequest request = ShmRequest("grads", n, 0, n * sizeof(float));
  request.clear_tensor();
  request.clear_shape();
  request.set_request_id(3);
  v1::ReducePart* empty = request.add_parts();
  empty->set_tensor("empty");
  empty->add_shape(0);
  empty->set_offset(0);
  v1::ReducePart* full = request.add_parts();
  full->set_tensor("full");
  full->add_shape(static_cast<int64_t>(n));
  full->set_offset(0);
  auto context = As("c1");
  auto stream = stub_->ReduceStream(context.get());
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  v1::ReduceStreamResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answer.error_code(), 0) << answer.error_message();
  ASSERT_EQ(answer.part_results_size(), 2) << answer.DebugString();
  for (const v1::ReduceStreamResponse& part : answer.part_results()) {
    EXPECT_EQ(part.error_code(), 0) << part.error_message();
  }
  EXPECT_EQ(answer.part_results(0).result().stats().raw_bytes(), 0u);
  EXPECT_TRUE(answer.part_results(0).result().data().empty());
  EXPECT_EQ(answer.part_results(1).result().stats().raw_bytes(),
            n * sizeof(float));
  const float* result = region->floats().data() + n;
  EXPECT_TRUE(std::equal(g.begin(), g.end(), result));
  EXPECT_TRUE(Unregister("c1", "grads").ok());
}

}  // namespace
}  // namespace gradcomp::service
