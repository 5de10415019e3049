// peer.proto's PeerFrame to and from gRPC byte buffers without protobuf
// copies of the chunk bytes: a data frame's chunk is gRPC slices that point
// into the message being sent, and a received chunk is read from gRPC's own
// slices. The bytes are PeerFrame's protobuf encoding (fields in the order
// header, chunk, chunk_crc32c), so a peer may use the generated classes.
//
//   grpc::ByteBuffer out = DataFrame(&header, parts, Crc32c(...), owner);
//   GC_ASSIGN_OR_RETURN(ReceivedFrame in, ParseFrame(buffer));
//   for (absl::string_view piece : in.chunk) ...
#ifndef GRADCOMP_SERVICE_TRANSPORT_PEER_FRAME_H_
#define GRADCOMP_SERVICE_TRANSPORT_PEER_FRAME_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gradcomp/v1/peer.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace gradcomp::service {

// A frame holding only `hello`.
grpc::ByteBuffer HelloFrame(const v1::Hello& hello);

// A data frame: `header` (null for a message's later chunks), the chunk made
// of `pieces` in order, and `crc` (the CRC-32C of the chunk). The pieces are
// not copied: they must stay valid while `owner` lives, and the frame holds
// a reference to `owner` until gRPC has written it.
grpc::ByteBuffer DataFrame(const v1::MessageHeader* header,
                           absl::Span<const absl::string_view> pieces,
                           uint32_t crc, std::shared_ptr<const void> owner);

struct ReceivedFrame {
  std::optional<v1::Hello> hello;
  std::optional<v1::MessageHeader> header;
  // The chunk's bytes, in order, inside `slices`.
  std::vector<absl::string_view> chunk;
  uint64_t chunk_size = 0;
  uint32_t chunk_crc32c = 0;
  std::vector<grpc::Slice> slices;
};

// Splits a received frame; InvalidArgument for bytes that are not a
// PeerFrame. Fields this version does not know are skipped.
absl::StatusOr<ReceivedFrame> ParseFrame(const grpc::ByteBuffer& buffer);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_PEER_FRAME_H_
