// End-to-end tests of the gRPC API: a real server on a free loopback port,
// the real engine and metrics behind it, and the generated client stub.
#include "service/api/gradcomp_service.h"

#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "service/api/server.h"
#include "service/collective/local_collective.h"
#include "service/engine/dtype.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

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

class GradcompServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(),
                                 &store_, &collective_, &metrics_, Policy());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    service_ = std::make_unique<GradcompService>(engine_.get(), &metrics_, 2);
    int port = 0;
    auto server = StartGrpcServer("127.0.0.1:0", service_.get(), &port);
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
  LocalCollective collective_;
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
      {"shared memory input",
       [](v1::ReduceRequest& r) { r.mutable_input_shm()->set_region("a"); },
       grpc::StatusCode::UNIMPLEMENTED, "shared memory arrives in a later"},
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
                   {{"codec", "unresolved"}, {"code", "UNIMPLEMENTED"}}),
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
}

TEST_F(GradcompServiceTest, GetInfoListsCodecsAndThePolicyHash) {
  grpc::ClientContext context;
  v1::GetInfoResponse info;
  ASSERT_TRUE(stub_->GetInfo(&context, v1::GetInfoRequest(), &info).ok());
  EXPECT_FALSE(info.version().empty());
  EXPECT_EQ(info.wire_format_version(), 1u);
  EXPECT_EQ(info.world_size(), 1u);
  EXPECT_EQ(info.rank(), 0u);
  EXPECT_EQ(info.device(), "cpu");
  ASSERT_EQ(info.transports_size(), 1);
  EXPECT_EQ(info.transports(0), "local");
  EXPECT_EQ(info.policy_hash(), engine_->policy()->hash);
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

  import_request.set_state("not a state blob");
  grpc::ClientContext context;
  EXPECT_EQ(
      stub_->ImportState(&context, import_request, &imported).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(GradcompServiceTest, SharedMemoryRpcsAreUnimplementedWithAReason) {
  grpc::ClientContext context;
  v1::RegisterSystemSharedMemoryResponse response;
  const grpc::Status status = stub_->RegisterSystemSharedMemory(
      &context, v1::RegisterSystemSharedMemoryRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(status.error_message(), HasSubstr("later gradcomp release"));
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

}  // namespace
}  // namespace gradcomp::service
