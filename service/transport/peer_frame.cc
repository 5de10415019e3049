#include "service/transport/peer_frame.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradcomp::service {
namespace {

// PeerFrame's field numbers and protobuf wire types.
constexpr int kHelloField = 1;
constexpr int kHeaderField = 2;
constexpr int kChunkField = 3;
constexpr int kCrcField = 4;
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(int field, int wire_type, std::string* out) {
  PutVarint(static_cast<uint64_t>(field) << 3 | wire_type, out);
}

void PutFixed32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

grpc::Slice CopiedSlice(const std::string& bytes) {
  return grpc::Slice(bytes.data(), bytes.size());
}

// Reads protobuf fields across gRPC's slices.
class Reader {
 public:
  explicit Reader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    Settle();
  }

  bool done() const { return index_ == slices_.size(); }

  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = slices_[index_].begin()[offset_];
    ++offset_;
    Settle();
    return true;
  }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

  // The next `n` bytes as views into the slices.
  bool Views(uint64_t n, std::vector<absl::string_view>* out) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[index_];
      const uint64_t take = std::min<uint64_t>(n, s.size() - offset_);
      out->emplace_back(reinterpret_cast<const char*>(s.begin()) + offset_,
                        take);
      offset_ += take;
      n -= take;
      Settle();
    }
    return true;
  }

  bool Copy(uint64_t n, std::string* out) {
    std::vector<absl::string_view> views;
    if (!Views(n, &views)) return false;
    for (absl::string_view v : views) out->append(v.data(), v.size());
    return true;
  }

 private:
  void Settle() {
    while (index_ < slices_.size() && offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("peer frame: ", what, "; expected a PeerFrame"));
}

}  // namespace

grpc::ByteBuffer HelloFrame(const v1::Hello& hello) {
  std::string bytes;
  PutTag(kHelloField, kLengthDelimited, &bytes);
  const std::string body = hello.SerializeAsString();
  PutVarint(body.size(), &bytes);
  bytes += body;
  grpc::Slice slice = CopiedSlice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer DataFrame(const v1::MessageHeader* header,
                           absl::Span<const absl::string_view> pieces,
                           uint32_t crc, std::shared_ptr<const void> owner) {
  std::string head;
  if (header != nullptr) {
    PutTag(kHeaderField, kLengthDelimited, &head);
    const std::string body = header->SerializeAsString();
    PutVarint(body.size(), &head);
    head += body;
  }
  uint64_t chunk = 0;
  for (absl::string_view piece : pieces) chunk += piece.size();
  PutTag(kChunkField, kLengthDelimited, &head);
  PutVarint(chunk, &head);
  std::string tail;
  PutTag(kCrcField, kFixed32, &tail);
  PutFixed32(crc, &tail);

  std::vector<grpc::Slice> slices;
  slices.reserve(pieces.size() + 2);
  slices.push_back(CopiedSlice(head));
  for (absl::string_view piece : pieces) {
    if (piece.empty()) continue;
    // Each slice holds its own reference to the owner; gRPC drops it once
    // the bytes are on the socket.
    slices.emplace_back(
        const_cast<char*>(piece.data()), piece.size(),
        [](void* keep) {
          delete static_cast<std::shared_ptr<const void>*>(keep);
        },
        new std::shared_ptr<const void>(owner));
  }
  slices.push_back(CopiedSlice(tail));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::StatusOr<ReceivedFrame> ParseFrame(const grpc::ByteBuffer& buffer) {
  ReceivedFrame frame;
  if (!buffer.Dump(&frame.slices).ok()) return Malformed("unreadable buffer");
  Reader in(frame.slices);
  while (!in.done()) {
    uint64_t tag;
    if (!in.Varint(&tag)) return Malformed("truncated field tag");
    const int field = static_cast<int>(tag >> 3);
    const int wire_type = static_cast<int>(tag & 7);
    uint64_t n = 0;
    if (wire_type == kLengthDelimited) {
      if (!in.Varint(&n)) return Malformed("truncated field length");
    }
    if (field == kHelloField || field == kHeaderField) {
      if (wire_type != kLengthDelimited) return Malformed("bad message field");
      std::string bytes;
      if (!in.Copy(n, &bytes)) return Malformed("truncated message field");
      if (field == kHelloField) {
        frame.hello.emplace();
        if (!frame.hello->ParseFromString(bytes)) return Malformed("bad Hello");
      } else {
        frame.header.emplace();
        if (!frame.header->ParseFromString(bytes)) {
          return Malformed("bad MessageHeader");
        }
      }
    } else if (field == kChunkField) {
      if (wire_type != kLengthDelimited) return Malformed("bad chunk field");
      frame.chunk.clear();
      if (!in.Views(n, &frame.chunk)) return Malformed("truncated chunk");
      frame.chunk_size = n;
    } else if (field == kCrcField && wire_type == kFixed32) {
      std::string bytes;
      if (!in.Copy(4, &bytes)) return Malformed("truncated chunk_crc32c");
      frame.chunk_crc32c = 0;
      for (int i = 0; i < 4; ++i) {
        frame.chunk_crc32c |=
            static_cast<uint32_t>(static_cast<unsigned char>(bytes[i]))
            << (8 * i);
      }
    } else {
      // A field from a later version: skipped by its wire type.
      uint64_t skip = n;
      std::vector<absl::string_view> ignored;
      switch (wire_type) {
        case kVarint:
          if (!in.Varint(&skip)) return Malformed("truncated varint");
          continue;
        case kFixed64:
          skip = 8;
          break;
        case kFixed32:
          skip = 4;
          break;
        case kLengthDelimited:
          break;
        default:
          return Malformed(absl::StrCat("unknown wire type ", wire_type));
      }
      if (!in.Views(skip, &ignored)) return Malformed("truncated field");
    }
  }
  return frame;
}

}  // namespace gradcomp::service
