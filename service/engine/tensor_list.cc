#include "service/engine/tensor_list.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/fnv1a.h"
#include "base/status_macros.h"

namespace gradcomp::service {
namespace {

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                             DType::kFloat64};

absl::Status CheckDecl(const TensorDecl& decl) {
  if (decl.name.empty()) {
    return absl::InvalidArgumentError(
        "a declared tensor has an empty name, expected the name every "
        "worker reduces it under");
  }
  for (char c : decl.name) {
    if (static_cast<unsigned char>(c) < 0x20) {
      return absl::InvalidArgumentError(
          absl::StrCat("declared tensor name '", absl::CEscape(decl.name),
                       "' holds a control character, expected printable text"));
    }
  }
  GC_RETURN_IF_ERROR(DTypeBytes(decl.dtype).status());
  for (int64_t dim : decl.shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("declared tensor '", decl.name, "' has shape ",
                       DescribeDecl(decl), ", expected dimensions >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseDTypeName(absl::string_view name) {
  for (DType dtype : kDTypes) {
    if (DTypeName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' in a tensor list"));
}

bool SameDecl(const TensorDecl& a, const TensorDecl& b) {
  return a.dtype == b.dtype && a.shape == b.shape;
}

}  // namespace

std::string DescribeDecl(const TensorDecl& decl) {
  return absl::StrCat(DTypeName(decl.dtype), " [",
                      absl::StrJoin(decl.shape, ","), "]");
}

absl::StatusOr<TensorList> TensorList::Create(
    absl::Span<const TensorDecl> decls) {
  if (decls.empty()) {
    return absl::InvalidArgumentError(
        "the tensor list is empty, expected at least one tensor");
  }
  std::map<std::string, TensorDecl> tensors;
  for (const TensorDecl& decl : decls) {
    GC_RETURN_IF_ERROR(CheckDecl(decl));
    if (!tensors.emplace(decl.name, decl).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", decl.name, "' is declared twice, expected unique names"));
    }
  }
  return TensorList(std::move(tensors));
}

absl::StatusOr<TensorList> TensorList::Parse(absl::string_view text) {
  std::vector<TensorDecl> decls;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor list line '", absl::CEscape(line), "' has ",
                       fields.size(), " fields, expected 3"));
    }
    TensorDecl decl;
    decl.name = std::string(fields[0]);
    GC_ASSIGN_OR_RETURN(decl.dtype, ParseDTypeName(fields[1]));
    for (absl::string_view dim :
         absl::StrSplit(fields[2], ',', absl::SkipEmpty())) {
      int64_t value = 0;
      if (!absl::SimpleAtoi(dim, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor list line '", absl::CEscape(line),
                         "': dimension '", dim, "' is not an integer"));
      }
      decl.shape.push_back(value);
    }
    decls.push_back(std::move(decl));
  }
  return Create(decls);
}

std::string TensorList::Serialize() const {
  std::string out;
  for (const auto& [name, decl] : tensors_) {
    absl::StrAppend(&out, name, "\t", DTypeName(decl.dtype), "\t",
                    absl::StrJoin(decl.shape, ","), "\n");
  }
  return out;
}

std::string TensorList::Hash() const {
  return absl::StrFormat("%016x", Fnv1a64::Of(Serialize()));
}

const TensorDecl* TensorList::Find(absl::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Status CompareTensorLists(absl::Span<const TensorList> lists) {
  if (lists.empty()) return absl::OkStatus();
  const TensorList& base = lists[0];
  for (size_t r = 1; r < lists.size(); ++r) {
    const TensorList& other = lists[r];
    for (const auto& [name, decl] : base.tensors()) {
      const TensorDecl* theirs = other.Find(name);
      if (theirs == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor lists differ: rank 0 declares '", name, "' ",
            DescribeDecl(decl), " but rank ", r, " does not declare it"));
      }
      if (!SameDecl(decl, *theirs)) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor lists differ: rank 0 declares '", name, "' ",
                         DescribeDecl(decl), " but rank ", r, " declares ",
                         DescribeDecl(*theirs)));
      }
    }
    for (const auto& [name, decl] : other.tensors()) {
      if (base.Find(name) == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor lists differ: rank ", r, " declares '", name, "' ",
            DescribeDecl(decl), " but rank 0 does not declare it"));
      }
    }
  }
  return absl::OkStatus();
}

void DeclaredTensors::Set(absl::string_view job, TensorList list) {
  absl::MutexLock lock(&mu_);
  lists_.insert_or_assign(std::string(job), std::move(list));
}

void DeclaredTensors::Erase(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  lists_.erase(job);
}

namespace {

absl::Status NotListed(absl::string_view job, absl::string_view name,
                       const TensorList& list) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", name, "' is not in job '", job,
                   "''s declared list of ", list.size(),
                   " tensors, expected a declared name (declare the list "
                   "again to change it)"));
}

}  // namespace

absl::Status DeclaredTensors::CheckListed(absl::string_view job,
                                          absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = lists_.find(job);
  if (it == lists_.end() || it->second.Find(name) != nullptr) {
    return absl::OkStatus();
  }
  return NotListed(job, name, it->second);
}

absl::Status DeclaredTensors::Check(absl::string_view job,
                                    absl::string_view name, DType dtype,
                                    absl::Span<const int64_t> shape) const {
  absl::MutexLock lock(&mu_);
  auto it = lists_.find(job);
  if (it == lists_.end()) return absl::OkStatus();
  const TensorDecl* decl = it->second.Find(name);
  if (decl == nullptr) return NotListed(job, name, it->second);
  if (decl->dtype != dtype ||
      !std::equal(shape.begin(), shape.end(), decl->shape.begin(),
                  decl->shape.end())) {
    TensorDecl got{std::string(name), dtype,
                   std::vector<int64_t>(shape.begin(), shape.end())};
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' is ", DescribeDecl(got),
                     ", expected ", DescribeDecl(*decl), " as declared"));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
