#include "service/api/request_parts.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "service/api/convert.h"
#include "service/config/policy_proto.h"
#include "service/engine/dtype.h"

namespace gradcomp::service {
namespace {

// Bytes of a part of `shape` when they fit in `limit` bytes; InvalidArgument
// for a negative dimension or a part larger than `limit`, checked before
// each multiplication so that nothing overflows.
absl::StatusOr<uint64_t> PartBytes(const v1::ReducePart& part, size_t width,
                                   uint64_t limit) {
  const std::string shape = absl::StrCat(
      "[", absl::StrJoin(part.shape().begin(), part.shape().end(), ", "), "]");
  for (int i = 0; i < part.shape_size(); ++i) {
    if (part.shape(i) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", shape, ": dimension ", i, " is ",
                       part.shape(i), ", expected >= 0"));
    }
  }
  // Before any product: [2^40, 0] holds nothing, however large 2^40 is.
  if (std::find(part.shape().begin(), part.shape().end(), 0) !=
      part.shape().end()) {
    return 0;
  }
  const uint64_t max_numel = limit / width;
  uint64_t numel = 1;
  for (int64_t dim : part.shape()) {
    const uint64_t d = static_cast<uint64_t>(dim);
    if (numel > max_numel / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", shape, " needs more than the ", limit,
                       " bytes left in the slices after its offset"));
    }
    numel *= d;
  }
  if (numel > max_numel) {  // a scalar (no dimensions) in too few bytes
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", shape, " needs ", numel * width, " bytes, more than the ",
        limit, " bytes left in the slices after its offset"));
  }
  return numel * width;
}

// `slice` narrowed to [offset, offset + bytes) of it.
v1::SharedMemorySlice Narrowed(const v1::SharedMemorySlice& slice,
                               uint64_t offset, uint64_t bytes) {
  v1::SharedMemorySlice part;
  part.set_region(slice.region());
  part.set_offset(slice.offset() + offset);
  part.set_byte_size(bytes);
  return part;
}

}  // namespace

absl::StatusOr<SplitRequest> SplitParts(const v1::ReduceRequest& request) {
  if (!request.tensor().empty() || request.shape_size() > 0 ||
      request.has_data()) {
    return absl::InvalidArgumentError(
        "a request with parts names its tensors in the parts; expected "
        "tensor, shape and data unset");
  }
  if (!request.has_input_shm() || !request.has_output_shm()) {
    return absl::InvalidArgumentError(
        "a request with parts reads and writes them in shared memory; "
        "expected input_shm and output_shm set");
  }
  if (request.parts_size() > static_cast<int>(kMaxRequestParts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request has ", request.parts_size(), " parts, expected at most ",
        kMaxRequestParts, " (split the bucket into several requests)"));
  }
  const v1::SharedMemorySlice& in = request.input_shm();
  const v1::SharedMemorySlice& out = request.output_shm();
  for (const auto& [name, slice] :
       {std::pair{"input_shm", &in}, std::pair{"output_shm", &out}}) {
    // Parts' offsets are added to the slice's; nothing may wrap.
    if (slice->offset() > UINT64_MAX - slice->byte_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": offset ", slice->offset(), " + byte_size ",
          slice->byte_size(), " wraps around; expected a slice that fits"));
    }
  }
  if (in.region() == out.region() &&
      in.offset() < out.offset() + out.byte_size() &&
      out.offset() < in.offset() + in.byte_size()) {
    // A part's output would overwrite another part's input.
    return absl::InvalidArgumentError(
        absl::StrCat("input_shm (offset ", in.offset(), ", ", in.byte_size(),
                     " bytes) and output_shm (offset ", out.offset(), ", ",
                     out.byte_size(), " bytes) overlap in region '",
                     in.region(), "'; expected disjoint slices"));
  }
  GC_ASSIGN_OR_RETURN(const size_t width,
                      DTypeBytes(DTypeFromProto(request.dtype())));
  // The engine would check the slices against max_tensor_bytes too; the
  // parts must lie within both, whichever is smaller.
  const uint64_t room = std::min(request.input_shm().byte_size(),
                                 request.output_shm().byte_size());
  SplitRequest split;
  if (request.has_batch()) {
    GC_ASSIGN_OR_RETURN(split.batch, BatchSpecFromProto(request.batch()));
  }
  v1::ReduceRequest common = request;
  common.clear_parts();
  common.clear_batch();
  split.parts.reserve(request.parts_size());
  absl::flat_hash_set<std::string> names;
  struct Extent {
    uint64_t offset, bytes;
    int part;
  };
  std::vector<Extent> extents;
  for (int i = 0; i < request.parts_size(); ++i) {
    const v1::ReducePart& part = request.parts(i);
    const std::string label =
        absl::StrCat("part ", i, " ('", part.tensor(), "')");
    if (part.tensor().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": tensor is empty, expected a name"));
    }
    if (!names.insert(part.tensor()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": tensor repeats an earlier part's, expected each once"));
    }
    if (part.offset() > room) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": offset ", part.offset(), " is past the ", room,
                       " bytes of the slices"));
    }
    absl::StatusOr<uint64_t> bytes =
        PartBytes(part, width, room - part.offset());
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, " at offset ", part.offset(), ": ", bytes.status().message()));
    }
    v1::ReduceRequest& one = split.parts.emplace_back(common);
    one.set_tensor(part.tensor());
    one.mutable_shape()->Assign(part.shape().begin(), part.shape().end());
    one.set_request_id(static_cast<uint64_t>(i));
    if (*bytes == 0) {
      // A zero-element tensor (of a model that has one) has no bytes to
      // point at: it travels inline, and shares no bytes with any part.
      one.clear_input_shm();
      one.clear_output_shm();
      one.set_data("");
      continue;
    }
    extents.push_back({part.offset(), *bytes, i});
    *one.mutable_input_shm() =
        Narrowed(request.input_shm(), part.offset(), *bytes);
    *one.mutable_output_shm() =
        Narrowed(request.output_shm(), part.offset(), *bytes);
  }
  // Two parts that share bytes would write each other's results.
  std::sort(
      extents.begin(), extents.end(),
      [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
  for (size_t j = 1; j < extents.size(); ++j) {
    const Extent& a = extents[j - 1];
    const Extent& b = extents[j];
    if (a.offset + a.bytes > b.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parts ", a.part, " ('", request.parts(a.part).tensor(), "', bytes ",
          a.offset, "..", a.offset + a.bytes, ") and ", b.part, " ('",
          request.parts(b.part).tensor(), "', from byte ", b.offset,
          ") overlap; expected disjoint parts"));
    }
  }
  return split;
}

}  // namespace gradcomp::service
