#include "client/cpp/client.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace gradcomp::client {
namespace {

using ::testing::HasSubstr;

TEST(FromGrpcStatusTest, KeepsCodeAndNamesRpcAndTarget) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "Reduce", "h:1").ok());
  for (grpc::StatusCode code :
       {grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::NOT_FOUND,
        grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::UNAVAILABLE,
        grpc::StatusCode::UNIMPLEMENTED, grpc::StatusCode::RESOURCE_EXHAUSTED,
        grpc::StatusCode::FAILED_PRECONDITION}) {
    absl::Status status =
        FromGrpcStatus(grpc::Status(code, "bad shape"), "Reduce", "h:1");
    EXPECT_EQ(static_cast<int>(status.code()), static_cast<int>(code));
    EXPECT_EQ(status.message(), "Reduce to gradcompd at h:1: bad shape");
  }
}

TEST(DTypeSizeTest, Sizes) {
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT32), 4u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED), 0u);
}

TEST(ClientTest, ConnectRejectsEmptyTargetAndBadTimeout) {
  EXPECT_EQ(Client::Connect("").status().code(),
            absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.rpc_timeout = absl::ZeroDuration();
  EXPECT_EQ(Client::Connect("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Metadata gRPC cannot send aborts the process when a call is made: such a
// token or client id is refused at Connect. A token's surrounding
// whitespace (a secret file's trailing newline) is trimmed instead.
TEST(ClientTest, ConnectRefusesMetadataGrpcCannotSend) {
  ClientOptions options;
  options.token = "t\xc3\xb6ken-of-enough-bytes";
  absl::Status status = Client::Connect("127.0.0.1:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("the client token (ClientOptions::token) holds byte "
                        "0xc3"));
  options.token = "abcdefghijklmnopqrstuvwxyz012345\n";
  absl::StatusOr<std::unique_ptr<Client>> trimmed =
      Client::Connect("127.0.0.1:1", options);
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  // A call goes out (and fails: nothing listens) instead of aborting.
  EXPECT_EQ((*trimmed)->GetInfo().status().code(),
            absl::StatusCode::kUnavailable);
  options.token.clear();
  options.client_id = "me\n";
  status = Client::Connect("127.0.0.1:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("client_id holds byte 0x0a"));
}

// A socket path longer than a unix socket address holds, or a client id
// longer than gRPC's metadata allows, is refused at Connect: every call
// failed later with a message that did not say why.
TEST(ClientTest, ConnectRefusesALongSocketPathAndClientId) {
  const std::string path(108, 'p');
  absl::Status status = Client::Connect("unix:/" + path.substr(1)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("has 108 bytes; expected at most 107"));
  EXPECT_TRUE(Client::Connect("unix:/" + path.substr(2)).ok());
  ClientOptions options;
  options.client_id = std::string(kMaxClientIdBytes + 1, 'c');
  status = Client::Connect("127.0.0.1:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("client_id has 1025 bytes"));
}

// A tensor too large for one gRPC message is refused before anything is
// copied or sent (gRPC aborted the process when it could not serialise
// the request). The memory is never touched, so it costs no RAM.
TEST(ClientTest, ATensorTooLargeToGoInlineIsRefused) {
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect("127.0.0.1:1");
  ASSERT_TRUE(client.ok()) << client.status();
  const size_t n = kMaxInlineBytes / sizeof(float) + 1;
  std::unique_ptr<float[]> huge(new float[n]);
  const std::vector<int64_t> shape = {static_cast<int64_t>(n)};
  absl::Status status =
      (*client)->Reduce("j", "big", 0, {huge.get(), n}, shape).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("tensor 'big' has 2146435076 bytes, over the"));
  EXPECT_THAT(status.message(), HasSubstr("shared memory"));
  v1::GossipSpec gossip;
  gossip.set_topology("ring");
  status =
      (*client)->Gossip("j", "big", 0, {huge.get(), n}, shape, gossip).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
}

// WaitForReady says how long it waited and why it gave up.
TEST(ClientTest, WaitForReadyNamesTheChannelState) {
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect("127.0.0.1:1");
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Status status = (*client)->WaitForReady(absl::Milliseconds(300));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr("of 300ms with the channel in state"));
}

// WaitServing polls gRPC's own health service (the daemon's is the same):
// it waits out NOT_SERVING and returns once the server says SERVING; with
// none, it names the last status at its timeout.
TEST(ClientTest, WaitServingWaitsForTheHealthServiceToSayServing) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  v1::Gradcomp::Service unimplemented;  // a sync service polls the health one
  builder.RegisterService(&unimplemented);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  server->GetHealthCheckService()->SetServingStatus(false);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(absl::StrCat("127.0.0.1:", port));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = (*client)->WaitServing(absl::Milliseconds(500));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr("was not SERVING within 500ms (last: NOT_SERVING)"));
  std::thread serve([&server] {
    absl::SleepFor(absl::Milliseconds(300));
    server->GetHealthCheckService()->SetServingStatus(true);
  });
  status = (*client)->WaitServing(absl::Seconds(30));
  serve.join();
  EXPECT_TRUE(status.ok()) << status;
  server->Shutdown();
  grpc::EnableDefaultHealthCheckService(false);

  status = (*client)->WaitServing(absl::Milliseconds(300));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("(last: UNAVAILABLE"));
}

// No daemon listens on this socket: the RPC fails as Unavailable, and the
// message says where the client looked. The directory is under /tmp because
// a unix socket path must fit in 107 bytes, which TEST_TMPDIR may not.
TEST(ClientTest, AbsentDaemonIsUnavailable) {
  char dir[] = "/tmp/gradcomp_client_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string target = absl::StrCat("unix:", dir, "/absent.sock");
  ClientOptions options;
  options.rpc_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(target, options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = (*client)->GetInfo().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(target));

  const std::vector<float> values = {1, 2};
  const std::vector<int64_t> shape = {2};
  status = (*client)->Reduce("j", "t", 0, values, shape).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("Reduce to gradcompd"));
  rmdir(dir);
}

// A Gradcomp server that records the Reduce requests it gets and answers
// each with its input doubled, so a test sees both what the client sent and
// that the answer came back. Tests may make it answer wrongly: in another
// dtype, or with scripted ReduceStream messages.
class RecordingServer final : public v1::Gradcomp::Service {
 public:
  RecordingServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~RecordingServer() override { server_->Shutdown(); }

  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<v1::ReduceRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // Reduce answers in `dtype` instead of the request's.
  void AnswerReduceIn(v1::DType dtype) {
    absl::MutexLock lock(&mu_);
    answer_dtype_ = dtype;
  }
  // Reduce answers with `bytes` more (or fewer) than the request held.
  void AnswerReduceWithExtraBytes(int bytes) {
    absl::MutexLock lock(&mu_);
    extra_bytes_ = bytes;
  }
  // ReduceStream sends these messages for every request it reads.
  void AnswerStreamWith(std::vector<v1::ReduceStreamResponse> answers) {
    absl::MutexLock lock(&mu_);
    stream_answers_ = std::move(answers);
  }

  grpc::Status Reduce(grpc::ServerContext*, const v1::ReduceRequest* request,
                      v1::ReduceResponse* response) override {
    v1::DType dtype = request->dtype();
    int extra_bytes = 0;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
      if (answer_dtype_) dtype = *answer_dtype_;
      extra_bytes = extra_bytes_;
    }
    std::vector<float> values(request->data().size() / sizeof(float));
    std::memcpy(values.data(), request->data().data(), request->data().size());
    for (float& v : values) v *= 2;
    response->set_dtype(dtype);
    std::string data(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
    data.resize(data.size() + extra_bytes);
    response->set_data(data);
    response->mutable_stats()->set_codec("gossip");
    return grpc::Status::OK;
  }

  // As a daemon that predates SetPolicyRequest.from_step: it applies the
  // policy at once and echoes no step.
  grpc::Status SetPolicy(grpc::ServerContext*, const v1::SetPolicyRequest*,
                         v1::SetPolicyResponse* response) override {
    response->set_hash("0123456789abcdef");
    return grpc::Status::OK;
  }

  grpc::Status ReduceStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ReduceStreamResponse, v1::ReduceRequest>*
          stream) override {
    v1::ReduceRequest request;
    while (stream->Read(&request)) {
      std::vector<v1::ReduceStreamResponse> answers;
      {
        absl::MutexLock lock(&mu_);
        requests_.push_back(request);
        answers = stream_answers_;
      }
      for (const v1::ReduceStreamResponse& answer : answers) {
        stream->Write(answer);
      }
    }
    return grpc::Status::OK;
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<v1::ReduceRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::DType> answer_dtype_ ABSL_GUARDED_BY(mu_);
  int extra_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::ReduceStreamResponse> stream_answers_ ABSL_GUARDED_BY(mu_);
};

v1::GossipSpec TorusSpec() {
  v1::GossipSpec spec;
  spec.set_topology("torus:2x2");
  spec.set_rank(2);
  spec.set_power_steps(3);
  spec.set_diffusion(1.308);
  return spec;
}

TEST(ClientGossipTest, SetsTheGossipFieldsAndReturnsTheMixedValues) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, -2, 3.5, 4, 5, 6};
  const std::vector<int64_t> shape = {2, 3};
  auto out = (*client)->Gossip("job", "fc.weight", 7, values, shape,
                               TorusSpec(), /*consensus_distance=*/0.25);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->values, std::vector<float>({2, -4, 7, 8, 10, 12}));
  EXPECT_EQ(out->stats.codec(), "gossip");

  const std::vector<v1::ReduceRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  const v1::ReduceRequest& r = requests[0];
  EXPECT_EQ(r.mode(), v1::REDUCE_MODE_GOSSIP);
  EXPECT_EQ(r.gossip().SerializeAsString(), TorusSpec().SerializeAsString());
  EXPECT_EQ(r.consensus_distance(), 0.25);
  EXPECT_EQ(r.job(), "job");
  EXPECT_EQ(r.tensor(), "fc.weight");
  EXPECT_EQ(r.step(), 7);
  EXPECT_EQ(r.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(std::vector<int64_t>(r.shape().begin(), r.shape().end()), shape);
  EXPECT_EQ(r.data(), std::string(reinterpret_cast<const char*>(values.data()),
                                  values.size() * sizeof(float)));
  EXPECT_FALSE(r.has_codec());
}

TEST(ClientGossipTest, PlainReduceLeavesTheAverageMode) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, 2};
  const std::vector<int64_t> shape = {2};
  ASSERT_TRUE((*client)->Reduce("job", "b", 0, values, shape).ok());
  const std::vector<v1::ReduceRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].mode(), v1::REDUCE_MODE_AVERAGE);
  EXPECT_FALSE(requests[0].has_gossip());
  EXPECT_EQ(requests[0].consensus_distance(), 0);
}

TEST(ClientGossipTest, BadSpecsAreRefusedBeforeAnythingIsSent) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, 2};
  const std::vector<int64_t> shape = {2};
  struct Case {
    v1::GossipSpec spec;
    double distance;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({TorusSpec(), 0, "empty topology; expected ring, torus"});
  cases.back().spec.clear_topology();
  cases.push_back({TorusSpec(), 0, "diffusion -0.5; expected a finite value"});
  cases.back().spec.set_diffusion(-0.5);
  cases.push_back({TorusSpec(), 0, "diffusion nan; expected a finite value"});
  cases.back().spec.set_diffusion(std::nan(""));
  cases.push_back(
      {TorusSpec(), -1, "consensus distance -1; expected a finite value"});
  cases.push_back(
      {TorusSpec(), HUGE_VAL, "consensus distance inf; expected a finite"});
  for (const Case& c : cases) {
    absl::Status status =
        (*client)
            ->Gossip("job", "w", 0, values, shape, c.spec, c.distance)
            .status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("Gossip of 'w': " + c.message));
  }
  EXPECT_TRUE(server.requests().empty());
}

// The daemon answers in the request's dtype; a reply in another would be
// read as the wrong type.
TEST(ClientPolicyTest, AStepADaemonIgnoredIsAnError) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(*(*client)->SetPolicy(v1::Policy()), "0123456789abcdef");
  absl::Status status = (*client)->SetPolicy(v1::Policy(), 100).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("does not know from_step"));
}

TEST(ClientReduceTest, AReplyInAnotherDTypeIsInternal) {
  RecordingServer server;
  server.AnswerReduceIn(v1::DTYPE_FLOAT16);
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, 2};
  const std::vector<int64_t> shape = {2};
  absl::Status status =
      (*client)->Reduce("job", "w", 0, values, shape).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("answered float16 for a float32 request"));
}

TEST(ClientReduceTest, AReplyOfAnotherSizeIsInternal) {
  RecordingServer server;
  server.AnswerReduceWithExtraBytes(-4);
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, 2, 3};
  const std::vector<int64_t> shape = {3};
  absl::Status status =
      (*client)->Reduce("job", "w", 0, values, shape).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(), HasSubstr("returned 8 bytes for a 12-byte"));
}

// A part's answer to a two-part bucket: a result, or (error_code set) an
// error, numbered `id`.
v1::ReduceStreamResponse PartAnswer(uint64_t id, int error_code = 0) {
  v1::ReduceStreamResponse part;
  if (error_code != 0) {
    part.set_error_code(error_code);
    part.set_error_message("bad part");
    part.set_request_id(id);
  } else {
    part.mutable_result()->set_request_id(id);
    part.mutable_result()->mutable_stats()->set_codec("topk");
  }
  return part;
}

v1::ReduceStreamResponse BucketAnswer(
    std::vector<v1::ReduceStreamResponse> parts) {
  v1::ReduceStreamResponse answer;
  for (v1::ReduceStreamResponse& part : parts) {
    *answer.add_part_results() = std::move(part);
  }
  return answer;
}

absl::StatusOr<std::vector<absl::StatusOr<v1::ReduceStats>>> ReduceTwoParts(
    Client& client) {
  const std::vector<ShmPart> parts = {{"a", {4}, 0}, {"b", {4}, 16}};
  return client.ReduceShmBucket("job", 3, v1::DTYPE_FLOAT32, parts,
                                {"r", 0, 32}, {"r", 32, 32});
}

TEST(ClientReduceShmBucketTest, ReturnsEachPartsResultOrError) {
  RecordingServer server;
  server.AnswerStreamWith({BucketAnswer(
      {PartAnswer(0), PartAnswer(1, grpc::StatusCode::INVALID_ARGUMENT)})});
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  auto results = ReduceTwoParts(**client);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 2u);
  ASSERT_TRUE((*results)[0].ok()) << (*results)[0].status();
  EXPECT_EQ((*results)[0]->codec(), "topk");
  EXPECT_EQ((*results)[1].status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(server.requests()[0].parts_size(), 2);
}

// More than one answer to the one request: the client reads them all and
// says so at once, rather than waiting in Finish for the deadline.
TEST(ClientReduceShmBucketTest, MoreThanOneAnswerIsInternalNotADeadline) {
  RecordingServer server;
  const v1::ReduceStreamResponse answer =
      BucketAnswer({PartAnswer(0), PartAnswer(1)});
  server.AnswerStreamWith({answer, answer, answer});
  ClientOptions options;
  options.rpc_timeout = absl::Seconds(5);
  auto client = Client::Connect(server.target(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = ReduceTwoParts(**client).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("3 answers to the one request with 2 parts, "
                        "expected 1"));
}

// A stream that ends without an answer, and an answer with another number
// of part results than parts: both Internal, naming what was missing.
TEST(ClientReduceShmBucketTest, NoAnswerOrTheWrongNumberOfPartsIsInternal) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status none = ReduceTwoParts(**client).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInternal) << none;
  EXPECT_THAT(none.message(), HasSubstr("ended without an answer"));

  server.AnswerStreamWith({BucketAnswer({PartAnswer(0)})});
  absl::Status short_answer = ReduceTwoParts(**client).status();
  EXPECT_EQ(short_answer.code(), absl::StatusCode::kInternal) << short_answer;
  EXPECT_THAT(short_answer.message(), HasSubstr("1 part results for 2 parts"));
}

// Part results travel in the parts' order, each numbered by its index;
// one numbered otherwise belongs to another part.
TEST(ClientReduceShmBucketTest, APartResultWithAnotherIndexIsInternal) {
  RecordingServer server;
  server.AnswerStreamWith({BucketAnswer(
      {PartAnswer(1), PartAnswer(0, grpc::StatusCode::INVALID_ARGUMENT)})});
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = ReduceTwoParts(**client).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("part result 0 answers request_id 1, expected 0 "
                        "(part 'a')"));

  // The same for an error answer, which carries its index outside a result.
  server.AnswerStreamWith({BucketAnswer(
      {PartAnswer(0), PartAnswer(7, grpc::StatusCode::INVALID_ARGUMENT)})});
  status = ReduceTwoParts(**client).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("part result 1 answers request_id 7, expected 1"));
}

}  // namespace
}  // namespace gradcomp::client
