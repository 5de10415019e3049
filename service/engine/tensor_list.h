// A job's declared tensor list: the names, dtypes and shapes a client says
// it will reduce. Declaring is optional; once a job has a list, every
// daemon has checked that all ranks declared the same one, and a Reduce of
// that job must name a declared tensor with its declared dtype and shape.
//
//   GC_ASSIGN_OR_RETURN(TensorList list, TensorList::Create(decls));
//   GC_RETURN_IF_ERROR(CompareTensorLists(ranks_lists));  // every rank's
//   declared.Set("job", std::move(list));
//   GC_RETURN_IF_ERROR(declared.Check("job", "fc1.weight", dtype, shape));
#ifndef GRADCOMP_SERVICE_ENGINE_TENSOR_LIST_H_
#define GRADCOMP_SERVICE_ENGINE_TENSOR_LIST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "service/engine/dtype.h"

namespace gradcomp::service {

struct TensorDecl {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

class TensorList {
 public:
  // InvalidArgument for an empty list, an empty or duplicate name, a name
  // with a control character, an unknown dtype or a negative dimension.
  static absl::StatusOr<TensorList> Create(absl::Span<const TensorDecl> decls);

  // Parses Serialize()'s form, with Create's checks.
  static absl::StatusOr<TensorList> Parse(absl::string_view text);

  // Canonical text, one "name<TAB>dtype<TAB>d0,d1,..." line per tensor in
  // name order: equal lists serialise to equal bytes.
  std::string Serialize() const;

  // Hex digest of Serialize(), for responses and logs.
  std::string Hash() const;

  size_t size() const { return tensors_.size(); }
  const std::map<std::string, TensorDecl>& tensors() const { return tensors_; }
  const TensorDecl* Find(absl::string_view name) const;

 private:
  explicit TensorList(std::map<std::string, TensorDecl> tensors)
      : tensors_(std::move(tensors)) {}

  std::map<std::string, TensorDecl> tensors_;  // by name
};

// "float32 [256,784]", as errors print a declaration.
std::string DescribeDecl(const TensorDecl& decl);

// OK when every rank's list equals rank 0's; otherwise FailedPrecondition
// naming the first difference and both ranks, e.g. "rank 0 declares
// 'fc.weight' float32 [10,784] but rank 2 declares float32 [10,785]".
// `lists[r]` is rank r's list.
absl::Status CompareTensorLists(absl::Span<const TensorList> lists);

// The lists of the jobs that declared one; thread-safe.
class DeclaredTensors {
 public:
  // Replaces the job's list (a client may declare again, e.g. after a
  // restart with a different model).
  void Set(absl::string_view job, TensorList list) ABSL_LOCKS_EXCLUDED(mu_);
  // The job has no list any more.
  void Erase(absl::string_view job) ABSL_LOCKS_EXCLUDED(mu_);

  // OK for a job without a list. For a declared job: InvalidArgument when
  // `name` is not declared or its dtype or shape differ from the
  // declaration, saying what was declared.
  absl::Status Check(absl::string_view job, absl::string_view name, DType dtype,
                     absl::Span<const int64_t> shape) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Check of the name alone: OK for a job without a list, or when `name`
  // is in it, whatever its dtype and shape (a batch member's own request
  // checks those).
  absl::Status CheckListed(absl::string_view job, absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, TensorList> lists_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_TENSOR_LIST_H_
