#include "service/collective/fuzz/peer_message_checker.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "codecs/tensor.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "service/collective/gather_batch_message.h"
#include "service/transport/peer_frame.h"

namespace gradcomp::service {
namespace {

constexpr size_t kMaxMembers = 64;

[[noreturn]] void Fail(const std::string& why, absl::string_view message) {
  std::fprintf(stderr, "peer_message_fuzzer: %s\ninput message: %s\n",
               why.c_str(), absl::CHexEscape(message).c_str());
  std::abort();
}

// A refusal must be InvalidArgument and say why.
void CheckRefusal(const absl::Status& status, absl::string_view message) {
  if (!absl::IsInvalidArgument(status) || status.message().empty()) {
    Fail(
        "a refusal is not InvalidArgument with a message: " + status.ToString(),
        message);
  }
}

bool Inside(absl::string_view view, const std::vector<grpc::Slice>& slices) {
  for (const grpc::Slice& s : slices) {
    const char* begin = reinterpret_cast<const char*>(s.begin());
    if (view.data() >= begin && view.data() + view.size() <= begin + s.size()) {
      return true;
    }
  }
  return false;
}

std::string Join(const std::vector<absl::string_view>& pieces) {
  std::string out;
  for (absl::string_view p : pieces) out.append(p.data(), p.size());
  return out;
}

absl::Status CheckFrame(uint8_t cut, absl::string_view message) {
  const size_t at = cut % (message.size() + 1);
  // A cut at either end leaves an empty slice, which the reader must step
  // over.
  grpc::Slice slices[] = {
      grpc::Slice(message.data(), at),
      grpc::Slice(message.data() + at, message.size() - at)};
  const absl::StatusOr<ReceivedFrame> frame =
      ParseFrame(grpc::ByteBuffer(slices, 2));
  if (!frame.ok()) {
    CheckRefusal(frame.status(), message);
    return frame.status();
  }
  uint64_t chunk = 0;
  for (absl::string_view piece : frame->chunk) {
    if (!Inside(piece, frame->slices)) {
      Fail("a chunk piece lies outside the buffer's slices", message);
    }
    chunk += piece.size();
  }
  if (chunk != frame->chunk_size) {
    Fail(absl::StrCat("the chunk's pieces hold ", chunk, " bytes, chunk_size ",
                      "says ", frame->chunk_size),
         message);
  }

  // What the sender would write for the fields read, read again.
  const std::vector<absl::string_view>& pieces = frame->chunk;
  const absl::StatusOr<ReceivedFrame> data = ParseFrame(
      DataFrame(frame->header.has_value() ? &*frame->header : nullptr, pieces,
                frame->chunk_crc32c, nullptr));
  if (!data.ok()) {
    Fail("DataFrame of the fields read does not parse: " +
             data.status().ToString(),
         message);
  }
  if (data->header.has_value() != frame->header.has_value() ||
      (data->header.has_value() &&
       !google::protobuf::util::MessageDifferencer::Equals(*data->header,
                                                           *frame->header)) ||
      Join(data->chunk) != Join(frame->chunk) ||
      data->chunk_crc32c != frame->chunk_crc32c) {
    Fail("DataFrame of the fields read parses to other fields", message);
  }
  if (frame->hello.has_value()) {
    const absl::StatusOr<ReceivedFrame> hello =
        ParseFrame(HelloFrame(*frame->hello));
    if (!hello.ok() || !hello->hello.has_value() ||
        !google::protobuf::util::MessageDifferencer::Equals(*hello->hello,
                                                            *frame->hello)) {
      Fail("HelloFrame of the Hello read does not parse to it", message);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGatherBatch(uint8_t count, absl::string_view message) {
  const codecs::Bytes bytes(message);
  std::vector<std::optional<codecs::Bytes>> split(1 + count % kMaxMembers);
  const absl::Status status = SplitGatherMessage(bytes, kFuzzedRank, &split);
  if (!status.ok()) {
    CheckRefusal(status, message);
    if (!absl::StrContains(status.message(),
                           absl::StrCat("rank ", kFuzzedRank, "'s"))) {
      Fail("a refusal does not name the rank: " + status.ToString(), message);
    }
    return status;
  }
  std::vector<codecs::Bytes> payloads(split.size());
  std::vector<bool> arrived(split.size());
  for (size_t i = 0; i < split.size(); ++i) {
    arrived[i] = split[i].has_value();
    if (arrived[i]) payloads[i] = *split[i];
  }
  if (GatherMessage(payloads, arrived) != bytes) {
    Fail("GatherMessage of the split members writes other bytes", message);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPeerMessage(const uint8_t* data, size_t size) {
  if (size < 2) return absl::InvalidArgumentError("input under 2 bytes");
  const absl::string_view message(reinterpret_cast<const char*>(data) + 2,
                                  size - 2);
  const auto parser = static_cast<PeerParser>(
      data[0] % static_cast<uint8_t>(PeerParser::kCount));
  return parser == PeerParser::kFrame ? CheckFrame(data[1], message)
                                      : CheckGatherBatch(data[1], message);
}

}  // namespace gradcomp::service
