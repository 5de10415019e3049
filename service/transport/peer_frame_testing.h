// For tests of peer frames: a frame's bytes in one string.
//
//   v1::PeerFrame parsed;
//   ASSERT_TRUE(parsed.ParseFromString(FrameBytes(HelloFrame(hello))));
#ifndef GRADCOMP_SERVICE_TRANSPORT_PEER_FRAME_TESTING_H_
#define GRADCOMP_SERVICE_TRANSPORT_PEER_FRAME_TESTING_H_

#include <string>

#include "grpcpp/support/byte_buffer.h"

namespace gradcomp::service {

// Every slice of `buffer`, in order (empty if it cannot be read).
std::string FrameBytes(const grpc::ByteBuffer& buffer);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_PEER_FRAME_TESTING_H_
