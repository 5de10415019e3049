// Starts the real gradcompd (world size 1) and drives it through the C++
// client: health, GetInfo, every codec, bad requests, /metrics.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cpp/client.h"
#include "client/cpp/npy.h"
#include "gmock/gmock.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {
namespace {

using client::Client;
using client::Float32ReduceResult;
using client::ReduceResult;
using ::testing::HasSubstr;

std::vector<float> Gradient(size_t n, uint32_t seed, float scale = 1e-3f) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> t(3.0f);
  std::vector<float> values(n);
  for (float& v : values) v = scale * t(rng);
  return values;
}

double RelativeError(const std::vector<float>& x, const std::vector<float>& y) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    norm += double{x[i]} * x[i];
  }
  return std::sqrt(diff / norm);
}

template <typename T>
std::string AsBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(T));
}

v1::CodecSpec Codec(
    const std::string& name,
    std::vector<std::pair<std::string, std::string>> params = {}) {
  v1::CodecSpec spec;
  spec.set_name(name);
  for (auto& [k, v] : params) (*spec.mutable_params())[k] = v;
  return spec;
}

// Sum of the samples of `name` whose labels include every `labels` pair,
// from a Prometheus text page.
double MetricTotal(
    const std::string& page, const std::string& name,
    const std::vector<std::pair<std::string, std::string>>& labels) {
  double total = 0;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::StartsWith(line, name + "{") &&
        !absl::StartsWith(line, name + " ")) {
      continue;
    }
    bool match = true;
    for (const auto& [k, v] : labels) {
      match &= absl::StrContains(line, absl::StrCat(k, "=\"", v, "\""));
    }
    double value = 0;
    const size_t space = line.rfind(' ');
    if (match && absl::SimpleAtod(line.substr(space + 1), &value))
      total += value;
  }
  return total;
}

class GradcompdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::string> binary = DaemonBinary();
    ASSERT_TRUE(binary.ok()) << binary.status();
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
        // Every reduce measured: the tests compare each one's reported error.
        DaemonProcess::Start(*binary, {"--error_sample_rate=1"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = daemon->release();
    absl::StatusOr<std::unique_ptr<Client>> client = daemon_->Connect();
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = client->release();
    absl::StatusOr<v1::GetInfoResponse> info = client_->GetInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    info_ = new v1::GetInfoResponse(*std::move(info));
  }

  static void TearDownTestSuite() {
    delete info_;
    delete client_;
    if (daemon_ != nullptr) {
      EXPECT_EQ(daemon_->Stop(), 0) << "gradcompd should exit cleanly on "
                                       "SIGTERM; log:\n"
                                    << daemon_->Log();
    }
    delete daemon_;
  }

  void SetUp() override {
    ASSERT_NE(client_, nullptr) << "the daemon did not start";
  }

  void TearDown() override {
    EXPECT_TRUE(daemon_->Running()) << "gradcompd died; log:\n"
                                    << daemon_->Log();
  }

  absl::StatusOr<std::string> Metrics() {
    return HttpGet(daemon_->metrics_port(), "/metrics");
  }

  static DaemonProcess* daemon_;
  static Client* client_;
  static v1::GetInfoResponse* info_;
};

DaemonProcess* GradcompdTest::daemon_ = nullptr;
Client* GradcompdTest::client_ = nullptr;
v1::GetInfoResponse* GradcompdTest::info_ = nullptr;

TEST_F(GradcompdTest, HealthIsServing) {
  auto channel = grpc::CreateChannel(daemon_->target(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  // HealthCheckRequest{service: ""} encodes to no bytes.
  grpc::ByteBuffer request(nullptr, 0);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  grpc::Slice slice;
  ASSERT_TRUE(response.DumpToSingleSlice(&slice).ok());
  // HealthCheckResponse{status: SERVING (1)}: field 1, varint 1.
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(slice.begin()), slice.size()),
      std::string("\x08\x01", 2));
}

TEST_F(GradcompdTest, GetInfo) {
  EXPECT_EQ(info_->world_size(), 1u);
  EXPECT_EQ(info_->rank(), 0u);
  EXPECT_FALSE(info_->version().empty());
  EXPECT_GE(info_->wire_format_version(), 1u);
  EXPECT_FALSE(info_->policy_hash().empty());
  std::vector<std::string> names;
  for (const auto& c : info_->codecs()) names.push_back(c.name());
  EXPECT_THAT(
      names, ::testing::IsSupersetOf({"none", "fp16", "bf16", "topk", "qsgd"}));
}

TEST_F(GradcompdTest, NoneIsBitExactInEveryDType) {
  // Random finite half-width bit patterns, subnormals included.
  std::mt19937 rng(7);
  std::vector<uint16_t> f16, b16;
  while (f16.size() < 4096) {
    const uint16_t bits = rng();
    if ((bits & 0x7c00) != 0x7c00) f16.push_back(bits);  // not Inf/NaN
  }
  while (b16.size() < 4096) {
    const uint16_t bits = rng();
    if ((bits & 0x7f80) != 0x7f80) b16.push_back(bits);
  }
  const std::vector<float> f32 = Gradient(4096, 1);
  const std::vector<int64_t> shape = {64, 64};
  struct Case {
    v1::DType dtype;
    std::string bytes;
  };
  for (const Case& c : {Case{v1::DTYPE_FLOAT16, AsBytes(f16)},
                        Case{v1::DTYPE_BFLOAT16, AsBytes(b16)},
                        Case{v1::DTYPE_FLOAT32, AsBytes(f32)}}) {
    absl::StatusOr<ReduceResult> result =
        client_->ReduceBytes("exact", absl::StrCat("t", c.dtype), 0, c.dtype,
                             c.bytes, shape, Codec("none"));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->dtype, c.dtype);
    EXPECT_TRUE(result->data == c.bytes) << v1::DType_Name(c.dtype);
    EXPECT_EQ(result->stats.codec(), "none");
    EXPECT_EQ(result->stats.raw_bytes(), 4096u * 4);
  }
}

TEST_F(GradcompdTest, Float64ComesBackRoundedToFloat32) {
  const std::vector<float> f32 = Gradient(1000, 2);
  std::vector<double> f64(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) f64[i] = f32[i] + 1e-12 * f32[i];
  const std::vector<int64_t> shape = {1000};
  absl::StatusOr<ReduceResult> result = client_->ReduceBytes(
      "exact", "f64", 0, v1::DTYPE_FLOAT64, AsBytes(f64), shape, Codec("none"));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->data.size(), f64.size() * 8);
  std::vector<double> out(f64.size());
  std::memcpy(out.data(), result->data.data(), result->data.size());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], static_cast<double>(static_cast<float>(f64[i]))) << i;
  }
}

TEST_F(GradcompdTest, Fp16WithinHalfPrecision) {
  const std::vector<float> x = Gradient(5000, 3, 0.1f);
  const std::vector<int64_t> shape = {50, 100};
  absl::StatusOr<Float32ReduceResult> r =
      client_->Reduce("fp16", "w", 0, x, shape, Codec("fp16"));
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::abs(r->values[i] - x[i]),
              std::abs(x[i]) * std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24))
        << "element " << i << ": " << x[i] << " -> " << r->values[i];
  }
  EXPECT_GT(r->stats.wire_bytes() * 2, r->stats.raw_bytes())
      << "fp16 sends 2 bytes per value plus a header";
  EXPECT_LT(r->stats.wire_bytes(), r->stats.raw_bytes());
}

// With one worker and a fresh tensor (no residual or momentum), the result
// is D(C(g)): the daemon's reported error must be the one of its result.
TEST_F(GradcompdTest, EveryCodecReportsTheErrorOfItsResult) {
  const std::vector<float> x = Gradient(128 * 96, 4);
  const std::vector<int64_t> shape = {128, 96};
  for (const v1::CodecDescription& codec : info_->codecs()) {
    SCOPED_TRACE(codec.name());
    absl::StatusOr<Float32ReduceResult> r =
        client_->Reduce("errors", absl::StrCat("w.", codec.name()), 0, x, shape,
                        Codec(codec.name()));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->values.size(), x.size());
    EXPECT_EQ(r->stats.codec(), codec.name());
    EXPECT_EQ(r->stats.world_size(), 1u);
    EXPECT_EQ(r->stats.raw_bytes(), x.size() * 4);
    EXPECT_GT(r->stats.wire_bytes(), 0u);
    const double mine = RelativeError(x, r->values);
    ASSERT_TRUE(std::isfinite(r->stats.relative_error()));
    EXPECT_NEAR(r->stats.relative_error(), mine, 1e-4 + 1e-3 * mine);
    if (codec.family() != "dense") {
      EXPECT_LT(r->stats.wire_bytes(), r->stats.raw_bytes() / 2);
    }
  }
}

TEST_F(GradcompdTest, LargeTensorHasNoMessageSizeLimit) {
  const std::vector<float> x = Gradient(3 << 20, 5);  // 12 MiB
  const std::vector<int64_t> shape = {3, 1 << 20};
  absl::StatusOr<Float32ReduceResult> r =
      client_->Reduce("large", "w", 0, x, shape, Codec("none"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->values == x);
}

TEST_F(GradcompdTest, BadRequestsAreInvalidArgumentAndCounted) {
  absl::StatusOr<std::string> before = Metrics();
  ASSERT_TRUE(before.ok()) << before.status();
  const std::vector<float> x = Gradient(64, 6);
  const std::vector<int64_t> shape = {64};
  struct Case {
    std::string what;
    absl::StatusOr<ReduceResult> result;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"data shorter than shape",
       client_->ReduceBytes("bad", "t", 0, v1::DTYPE_FLOAT32,
                            AsBytes(x).substr(4), shape, Codec("none"))});
  cases.push_back({"unspecified dtype",
                   client_->ReduceBytes("bad", "t", 0, v1::DTYPE_UNSPECIFIED,
                                        AsBytes(x), shape, Codec("none"))});
  cases.push_back({"negative step",
                   client_->ReduceBytes("bad", "t", -1, v1::DTYPE_FLOAT32,
                                        AsBytes(x), shape, Codec("none"))});
  const std::vector<int64_t> negative = {-64};
  cases.push_back({"negative dimension",
                   client_->ReduceBytes("bad", "t", 0, v1::DTYPE_FLOAT32,
                                        AsBytes(x), negative, Codec("none"))});
  cases.push_back(
      {"unknown codec", client_->ReduceBytes("bad", "t", 0, v1::DTYPE_FLOAT32,
                                             AsBytes(x), shape, Codec("zip"))});
  cases.push_back(
      {"out-of-range parameter",
       client_->ReduceBytes("bad", "t", 0, v1::DTYPE_FLOAT32, AsBytes(x), shape,
                            Codec("topk", {{"ratio", "1.5"}}))});
  cases.push_back(
      {"unknown parameter",
       client_->ReduceBytes("bad", "t", 0, v1::DTYPE_FLOAT32, AsBytes(x), shape,
                            Codec("qsgd", {{"colour", "red"}}))});
  std::vector<float> nan = x;
  nan[5] = std::numeric_limits<float>::quiet_NaN();
  cases.push_back({"NaN into a compressing codec",
                   client_->ReduceBytes("bad", "t", 0, v1::DTYPE_FLOAT32,
                                        AsBytes(nan), shape, Codec("qsgd"))});
  for (const Case& c : cases) {
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what << ": " << c.result.status();
  }
  EXPECT_THAT(cases[4].result.status().message(), HasSubstr("zip"));
  EXPECT_THAT(cases[6].result.status().message(), HasSubstr("colour"));

  // A dense codec passes NaN through, as an allreduce would, and counts it.
  absl::StatusOr<Float32ReduceResult> dense =
      client_->Reduce("bad", "nan", 0, nan, shape, Codec("none"));
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_TRUE(std::isnan(dense->values[5]));
  EXPECT_EQ(dense->stats.nonfinite_values(), 1u);

  // Still serving, and the failures were counted.
  absl::StatusOr<Float32ReduceResult> ok =
      client_->Reduce("bad", "t", 0, x, shape, Codec("none"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->values == x);
  absl::StatusOr<std::string> after = Metrics();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(MetricTotal(*after, "gradcomp_reduce_total",
                        {{"code", "INVALID_ARGUMENT"}}) -
                MetricTotal(*before, "gradcomp_reduce_total",
                            {{"code", "INVALID_ARGUMENT"}}),
            cases.size());
}

TEST_F(GradcompdTest, SharedMemoryIsOffWithoutTheFlag) {
  auto stub = v1::Gradcomp::NewStub(grpc::CreateChannel(
      daemon_->target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::RegisterSystemSharedMemoryRequest request;
  request.set_name("r");
  request.set_shm_key("/gradcomp-test");
  request.set_byte_size(64);
  v1::RegisterSystemSharedMemoryResponse response;
  EXPECT_EQ(stub->RegisterSystemSharedMemory(&context, request, &response)
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// A client that stops reading its ReduceStream holds only its own stream:
// its answers wait in that stream's queue, not in the workers every client
// shares (this daemon has max(2, cores) of them), so another client's
// stream is still answered. Without that, the other stream's answer would
// wait for a worker until its deadline.
TEST_F(GradcompdTest, AClientThatStopsReadingDoesNotStopTheOthers) {
  // Channels of their own: separate connections, not one shared subchannel.
  auto stub_on_own_connection = [] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::Gradcomp::NewStub(grpc::CreateCustomChannel(
        daemon_->target(), grpc::InsecureChannelCredentials(), args));
  };
  // What the budget holds before (the codec state of the suite's other
  // tests on this daemon), and now.
  auto in_use = [&] {
    absl::StatusOr<std::string> page = Metrics();
    return page.ok()
               ? MetricTotal(*page, "gradcomp_memory_budget_in_use_bytes", {})
               : -1;
  };
  const double before = in_use();
  auto idle_stub = stub_on_own_connection();
  grpc::ClientContext idle_context;
  auto idle = idle_stub->ReduceStream(&idle_context);
  const std::vector<float> large(1 << 18, 0.5f);  // 1 MiB answers
  for (int i = 0; i < 40; ++i) {
    v1::ReduceRequest request;
    request.set_job("idle");
    request.set_tensor(absl::StrCat("t", i));
    request.set_request_id(i);
    request.set_dtype(v1::DTYPE_FLOAT32);
    request.add_shape(static_cast<int64_t>(large.size()));
    request.set_data(AsBytes(large));
    ASSERT_TRUE(idle->Write(request));
  }
  // ... and reads none of the answers.

  auto other_stub = stub_on_own_connection();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  auto other = other_stub->ReduceStream(&context);
  const std::vector<float> small = {1, 2, 3, 4};
  v1::ReduceRequest request;
  request.set_job("busy");
  request.set_tensor("w");
  request.set_dtype(v1::DTYPE_FLOAT32);
  request.add_shape(4);
  request.set_data(AsBytes(small));
  ASSERT_TRUE(other->Write(request));
  other->WritesDone();
  v1::ReduceStreamResponse answer;
  const bool read = other->Read(&answer);
  const grpc::Status finished = other->Finish();
  ASSERT_TRUE(read) << finished.error_code() << " " << finished.error_message();
  EXPECT_EQ(answer.error_code(), 0) << answer.error_message();
  EXPECT_TRUE(finished.ok()) << finished.error_message();

  // The idle client's computed answers stay in the memory budget until it
  // reads them (most of its 40 MiB: gRPC's buffers take a little), and go
  // back when its stream ends.
  auto wait_for = [&](auto done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!done(in_use()) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    return in_use();
  };
  const double held =
      wait_for([&](double bytes) { return bytes >= before + (16 << 20); });
  EXPECT_GE(held - before, 16 << 20)
      << "held " << held << ", before " << before;
  idle_context.TryCancel();
  const double after =
      wait_for([&](double bytes) { return bytes < before + (1 << 20); });
  EXPECT_LT(after - before, 1 << 20)
      << "after " << after << ", before " << before;
}

TEST_F(GradcompdTest, MetricsCountReducesAndBytesPerCodec) {
  absl::StatusOr<std::string> before = Metrics();
  ASSERT_TRUE(before.ok()) << before.status();
  const std::vector<float> x = Gradient(4000, 8);
  const std::vector<int64_t> shape = {40, 100};
  uint64_t wire = 0;
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<Float32ReduceResult> r = client_->Reduce(
        "metrics", "w", step, x, shape, Codec("topk", {{"ratio", "0.01"}}));
    ASSERT_TRUE(r.ok()) << r.status();
    wire += r->stats.wire_bytes();
  }
  absl::StatusOr<std::string> after = Metrics();
  ASSERT_TRUE(after.ok()) << after.status();
  auto growth = [&](const std::string& name,
                    std::vector<std::pair<std::string, std::string>> labels) {
    return MetricTotal(*after, name, labels) -
           MetricTotal(*before, name, labels);
  };
  EXPECT_EQ(
      growth("gradcomp_reduce_total", {{"codec", "topk"}, {"code", "OK"}}), 3);
  EXPECT_EQ(growth("gradcomp_raw_bytes_total", {{"codec", "topk"}}),
            3 * 4000 * 4);
  EXPECT_EQ(growth("gradcomp_wire_bytes_total", {{"codec", "topk"}}), wire);
  EXPECT_THAT(*after, HasSubstr("gradcomp_build_info{"));
}

TEST_F(GradcompdTest, PolicyRoundTrip) {
  absl::StatusOr<v1::GetPolicyResponse> original = client_->GetPolicy();
  ASSERT_TRUE(original.ok()) << original.status();
  EXPECT_EQ(original->hash(), info_->policy_hash());
  // The new rule goes first: the first matching rule decides.
  v1::Policy policy = original->policy();
  policy.clear_rules();
  v1::PolicyRule* rule = policy.add_rules();
  rule->set_name_glob("policy/*");
  *rule->mutable_codec() = Codec("bf16");
  for (const v1::PolicyRule& r : original->policy().rules()) {
    *policy.add_rules() = r;
  }
  absl::StatusOr<std::string> hash = client_->SetPolicy(policy);
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_NE(*hash, original->hash());

  const std::vector<float> x = Gradient(64 * 64, 9);
  const std::vector<int64_t> shape = {64, 64};
  absl::StatusOr<Float32ReduceResult> r =
      client_->Reduce("policy", "policy/w", policy.warmup_steps(), x, shape);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.codec(), "bf16");

  absl::StatusOr<std::string> restored = client_->SetPolicy(original->policy());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, original->hash());
}

// gradcompctl end to end: an .npy in, the reduced .npy out, stats printed.
TEST_F(GradcompdTest, GradcompctlReducesAnNpyFile) {
  const std::string ctl = absl::StrCat(std::getenv("TEST_SRCDIR"),
                                       "/gradcomp/client/cpp/gradcompctl");
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::vector<float> x = Gradient(6 * 7, 10);
  client::NpyArray input{client::NpyDType::kFloat32, {6, 7}, AsBytes(x)};
  ASSERT_TRUE(client::WriteNpyFile(dir + "/in.npy", input).ok());
  const std::string command = absl::StrCat(
      ctl, " --target=", daemon_->target(), " reduce --input=", dir,
      "/in.npy --tensor=ctl.w --step=0 --codec=none --output=", dir,
      "/out.npy > ", dir, "/ctl.txt 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  absl::StatusOr<client::NpyArray> output =
      client::ReadNpyFile(dir + "/out.npy");
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(output->shape, input.shape);
  EXPECT_TRUE(output->data == input.data);
  std::ifstream printed(dir + "/ctl.txt");
  std::stringstream text;
  text << printed.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("raw bytes        168"));

  // A bad request comes back as exit status 1 with the daemon's message.
  const std::string bad = absl::StrCat(
      ctl, " --target=", daemon_->target(), " reduce --input=", dir,
      "/in.npy --tensor=ctl.w --codec=topk --param=ratio=7 > ", dir,
      "/bad.txt 2>&1");
  const int status = std::system(bad.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
}

// The C++ client's checkpoint of a job's codec state: imported into another
// job, it makes that job's next step equal the first job's.
TEST_F(GradcompdTest, ExportedStateContinuesInAnotherJob) {
  const std::vector<float> x = Gradient(64 * 64, 12);
  const std::vector<int64_t> shape = {64, 64};
  const v1::CodecSpec topk = Codec("topk", {{"ratio", "0.01"}});
  ASSERT_TRUE(client_->Reduce("exported", "w", 0, x, shape, topk).ok());
  absl::StatusOr<std::string> state = client_->ExportState("exported");
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(client_->ImportState("imported", *state).ok());
  absl::StatusOr<Float32ReduceResult> here =
      client_->Reduce("exported", "w", 1, x, shape, topk);
  absl::StatusOr<Float32ReduceResult> there =
      client_->Reduce("imported", "w", 1, x, shape, topk);
  ASSERT_TRUE(here.ok() && there.ok());
  EXPECT_EQ(here->values, there->values);
  // A fresh job's step 1 differs: the state made the difference.
  absl::StatusOr<Float32ReduceResult> fresh =
      client_->Reduce("fresh", "w", 1, x, shape, topk);
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(fresh->values, here->values);

  const absl::Status bad = client_->ImportState("imported", "not a state");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("ImportState"));

  // The same through gradcompctl, by way of a file.
  const std::string ctl = absl::StrCat(std::getenv("TEST_SRCDIR"),
                                       "/gradcomp/client/cpp/gradcompctl");
  const std::string file =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/state.bin");
  const std::string round_trip =
      absl::StrCat(ctl, " --target=", daemon_->target(),
                   " export-state --job=exported --output=", file, " && ", ctl,
                   " --target=", daemon_->target(),
                   " import-state --job=by-ctl --input=", file);
  ASSERT_EQ(std::system(round_trip.c_str()), 0) << round_trip;
  absl::StatusOr<std::string> copied = client_->ExportState("by-ctl");
  absl::StatusOr<std::string> original = client_->ExportState("exported");
  ASSERT_TRUE(copied.ok() && original.ok());
  EXPECT_EQ(*copied, *original);
}

// A job's codec state is freed by the C++ client's ReleaseJob and by
// `gradcompctl release`, each saying what it freed.
TEST_F(GradcompdTest, ReleaseJobFreesTheJobsState) {
  const std::vector<float> x = Gradient(64 * 64, 11);
  const std::vector<int64_t> shape = {64, 64};
  for (const char* job : {"released-by-client", "released-by-ctl"}) {
    ASSERT_TRUE(
        client_
            ->Reduce(job, "w", 0, x, shape, Codec("topk", {{"ratio", "0.01"}}))
            .ok());
  }
  absl::StatusOr<v1::ReleaseJobResponse> released =
      client_->ReleaseJob("released-by-client");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->tensors(), 1u);
  EXPECT_GT(released->state_bytes(), 0u);

  const std::string ctl = absl::StrCat(std::getenv("TEST_SRCDIR"),
                                       "/gradcomp/client/cpp/gradcompctl");
  const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/rel.txt");
  const std::string command =
      absl::StrCat(ctl, " --target=", daemon_->target(),
                   " release --job=released-by-ctl > ", out, " 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream printed(out);
  std::stringstream text;
  text << printed.rdbuf();
  EXPECT_THAT(text.str(),
              HasSubstr(absl::StrCat("released job 'released-by-ctl': 1 "
                                     "tensors, ",
                                     released->state_bytes(), " bytes")));
}

// `gradcompctl info` shows the effective configuration: the config with the
// flags merged in, the flag-only settings and the policy in force.
TEST(GradcompctlInfoTest, ShowsTheEffectiveConfigAndPolicy) {
  absl::StatusOr<std::string> binary = DaemonBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon = DaemonProcess::Start(
      *binary,
      {"--error_sample_rate=0.25", "--seed=9", "--collective_timeout=7s"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string ctl = absl::StrCat(std::getenv("TEST_SRCDIR"),
                                       "/gradcomp/client/cpp/gradcompctl");
  const std::string out = absl::StrCat(std::getenv("TEST_TMPDIR"), "/info.txt");
  const std::string command = absl::StrCat(
      ctl, " --target=", (*daemon)->target(), " info > ", out, " 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream printed(out);
  std::stringstream text;
  text << printed.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("\"error_sample_rate\": 0.25"));
  EXPECT_THAT(text.str(), HasSubstr("\"seed\": \"9\""));
  EXPECT_THAT(text.str(), HasSubstr("--collective_timeout=7s"));
  EXPECT_THAT(text.str(), HasSubstr("dense_below_numel: 1024"));
}

// What `gradcompd --check_config` prints, and its exit status, for the
// given flags after --config=<a file holding `config_text`>.
struct CheckedConfig {
  int status = -1;
  std::string output;
};
CheckedConfig CheckConfig(const std::string& config_text,
                          const std::string& flags) {
  absl::StatusOr<std::string> binary = DaemonBinary();
  EXPECT_TRUE(binary.ok()) << binary.status();
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string config = absl::StrCat(dir, "/check.textproto");
  std::ofstream(config) << config_text;
  const std::string out = absl::StrCat(dir, "/check.txt");
  const std::string command =
      absl::StrCat(binary.value_or(""), " --config=", config, " ", flags,
                   " --check_config > ", out, " 2>&1");
  CheckedConfig checked;
  checked.status = std::system(command.c_str());
  std::ifstream printed(out);
  std::stringstream text;
  text << printed.rdbuf();
  checked.output = text.str();
  return checked;
}

// A boolean flag given as --noNAME overrides the config file, as
// --NAME=false does (the file turns client shared memory on here).
TEST(GradcompdConfigTest, ANegatedBooleanFlagOverridesTheConfigFile) {
  const std::string file = "allow_client_shm: true";
  const CheckedConfig alone = CheckConfig(file, "");
  ASSERT_EQ(alone.status, 0) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("\"allow_client_shm\": true"));
  for (const char* flag :
       {"--noallow_client_shm", "--allow_client_shm=false"}) {
    const CheckedConfig overridden = CheckConfig(file, flag);
    ASSERT_EQ(overridden.status, 0) << flag << ": " << overridden.output;
    EXPECT_THAT(overridden.output, HasSubstr("\"allow_client_shm\": false"))
        << flag;
  }
}

// A boolean flag takes its value after '=' only: "--NAME false" would turn
// it on and leave "false" over, so a stray word stops the daemon instead.
TEST(GradcompdConfigTest, AWordThatIsNotAFlagIsRefused) {
  for (const char* flags :
       {"--listen=0.0.0.0:50051 --allow_unauthenticated_tcp false",
        "--allow_client_shm false", "stray"}) {
    const CheckedConfig checked = CheckConfig("", flags);
    EXPECT_NE(checked.status, 0) << flags << ": " << checked.output;
    EXPECT_THAT(checked.output,
                HasSubstr("gradcompd takes flags only, each value after '='"))
        << flags;
  }
  const CheckedConfig both = CheckConfig("", "--allow_client_shm false true");
  EXPECT_THAT(both.output, HasSubstr("unexpected arguments 'false' 'true'"));
}

// --check_config passes only what would start: the flags that are not
// config fields are checked before it answers.
TEST(GradcompdConfigTest, CheckConfigRefusesFlagsThatWouldNotStart) {
  const std::pair<const char*, const char*> cases[] = {
      {"--collective_timeout=0s", "--collective_timeout is 0, expected"},
      {"--peer_startup_timeout=-5s",
       "--peer_startup_timeout is -5s, expected a duration above 0"},
      {"--peer_buffer_bytes=0", "--peer_buffer_bytes is 0"},
      {"--peer_tls_refresh=100ms",
       "--peer_tls_refresh is 100ms, expected 1s to 24h"},
      {"--peer_tls_refresh=1193046h28m16s",
       "--peer_tls_refresh is 1193046h28m16s, expected 1s to 24h"},
      {"--shm_prefix=", "--shm_prefix is '', expected '/' and a name start"},
      {"--shm_prefix=gradcomp.", "--shm_prefix is 'gradcomp.', expected"},
      {"--shm_prefix=/a/b", "--shm_prefix is '/a/b', expected"},
      {"--peer_group=ml/\xff", "--peer_group is not UTF-8 (byte 3)"},
      {"--allow_client_shm --shm_owner_uids=abc",
       "--shm_owner_uids has 'abc', expected numeric uids"},
  };
  for (const auto& [flags, message] : cases) {
    const CheckedConfig checked = CheckConfig("", flags);
    EXPECT_NE(checked.status, 0) << flags << ": " << checked.output;
    EXPECT_THAT(checked.output, HasSubstr(message)) << flags;
  }
  EXPECT_EQ(
      CheckConfig("", "--collective_timeout=1s --peer_buffer_bytes=1").status,
      0);
}

// Flags from --flagfile cannot be told from defaults, so beside --config
// they are refused rather than silently overruled by the file.
TEST(GradcompdConfigTest, AFlagFileBesideAConfigFileIsRefused) {
  const std::string flagfile =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/flags.txt");
  std::ofstream(flagfile) << "--seed=3\n";
  const CheckedConfig checked =
      CheckConfig("seed: 8", absl::StrCat("--flagfile=", flagfile));
  EXPECT_NE(checked.status, 0) << checked.output;
  EXPECT_THAT(checked.output,
              HasSubstr("--flagfile cannot be combined with --config"));
}

// The NUL-separated entries of /proc/<pid>/<file>: "environ" (the daemon's
// environment) or "cmdline" (its command line).
std::vector<std::string> ProcEntries(pid_t pid, absl::string_view file) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/", file), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  return absl::StrSplit(all, '\0', absl::SkipEmpty());
}

// gradcompd restarts itself with glibc's heap on transparent huge pages
// (service/main.cc), keeping whatever other tunables it was given. This
// checks the tunable it runs with; whether the kernel then backs the heap
// with huge pages depends on its THP setting, which the test leaves alone.
TEST_F(GradcompdTest, TheDaemonRestartsWithTheHugePageHeapTunable) {
  const char* given = std::getenv("GLIBC_TUNABLES");
  if (given != nullptr && absl::StrContains(given, "glibc.malloc.hugetlb")) {
    GTEST_SKIP() << "this test's environment chose glibc.malloc.hugetlb";
  }
  const std::string expected =
      given == nullptr || *given == '\0'
          ? "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
          : absl::StrCat("GLIBC_TUNABLES=", given, ":glibc.malloc.hugetlb=1");
  EXPECT_THAT(ProcEntries(daemon_->pid(), "environ"),
              ::testing::Contains(expected));
}

// The restart executes the binary by its path, so the process keeps its
// name (ps, top, pgrep): the kernel's comm, the binary's file name (links
// resolved) cut to 15 bytes, not "exe" as an exec of /proc/self/exe would
// leave it.
TEST_F(GradcompdTest, TheRestartedDaemonKeepsItsName) {
  absl::StatusOr<std::string> binary = DaemonBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  char resolved[PATH_MAX];
  ASSERT_NE(realpath(binary->c_str(), resolved), nullptr) << *binary;
  const std::string path = resolved;
  std::ifstream in(absl::StrCat("/proc/", daemon_->pid(), "/comm"));
  std::string comm;
  std::getline(in, comm);
  EXPECT_EQ(comm, path.substr(path.rfind('/') + 1, 15));
}

// Run through the dynamic loader by hand, as tools/gpu_test's bundle runs
// it where Debian's libraries are missing, the daemon still restarts with
// its huge-page heap (the loader and its options included) and serves.
// Before, the restart handed the daemon's flags to the loader, which exited
// with "unrecognized option".
TEST(GradcompdHugePagesTest, TheRestartKeepsAnExplicitLoadersCommandLine) {
  constexpr char kLoader[] = "/lib64/ld-linux-x86-64.so.2";
  if (access(kLoader, X_OK) != 0) GTEST_SKIP() << "no " << kLoader;
  const char* given = std::getenv("GLIBC_TUNABLES");
  if (given != nullptr && absl::StrContains(given, "glibc.malloc.hugetlb")) {
    GTEST_SKIP() << "this test's environment chose glibc.malloc.hugetlb";
  }
  absl::StatusOr<std::string> binary = DaemonBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  const std::string script =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/through_loader.sh");
  {
    std::ofstream out(script);
    out << "#!/bin/sh\nexec " << kLoader << " --library-path /nonexistent "
        << *binary << " \"$@\"\n";
  }
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start(script, {});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_THAT(ProcEntries((*daemon)->pid(), "environ"),
              ::testing::Contains(HasSubstr("glibc.malloc.hugetlb=1")));
  EXPECT_THAT(ProcEntries((*daemon)->pid(), "cmdline"),
              ::testing::Contains("--library-path"));
  EXPECT_EQ((*daemon)->Stop(), 0) << (*daemon)->Log();
}

TEST(GradcompdHugePagesTest, ACallersChoiceOfTheHeapsPagesIsKept) {
  absl::StatusOr<std::string> binary = DaemonBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  const char* given = std::getenv("GLIBC_TUNABLES");
  const std::string saved = given == nullptr ? "" : given;
  setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0", 1);
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start(*binary, {});
  if (given == nullptr) {
    unsetenv("GLIBC_TUNABLES");
  } else {
    setenv("GLIBC_TUNABLES", saved.c_str(), 1);
  }
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_THAT(ProcEntries((*daemon)->pid(), "environ"),
              ::testing::Contains("GLIBC_TUNABLES=glibc.malloc.hugetlb=0"));
  EXPECT_EQ((*daemon)->Stop(), 0) << (*daemon)->Log();
}

}  // namespace
}  // namespace gradcomp::testing
