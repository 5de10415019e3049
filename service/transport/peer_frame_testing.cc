#include "service/transport/peer_frame_testing.h"

#include <vector>

#include "grpcpp/support/slice.h"

namespace gradcomp::service {

std::string FrameBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

}  // namespace gradcomp::service
