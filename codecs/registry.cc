#include "codecs/registry.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace gradcomp::codecs {

absl::Status CodecRegistry::Register(CodecInfo info, CodecFactory factory) {
  if (info.name.empty()) {
    return absl::InvalidArgumentError(
        "codec registry: expected a codec name, got an empty one");
  }
  if (factory == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "codec registry: expected a factory for '%s', got none", info.name));
  }
  if (codecs_.find(info.name) != codecs_.end()) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "codec registry: codec '%s' is already registered", info.name));
  }
  std::string name = info.name;
  codecs_.emplace(std::move(name),
                  Registration{std::move(info), std::move(factory)});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Codec>> CodecRegistry::Create(
    absl::string_view name, const CodecParams& params) const {
  auto it = codecs_.find(name);
  if (it == codecs_.end()) {
    std::vector<std::string> known;
    for (const auto& [known_name, registration] : codecs_) {
      known.push_back(known_name);
    }
    return absl::NotFoundError(
        absl::StrFormat("unknown codec '%s' (known: %s)", name,
                        known.empty() ? "none" : absl::StrJoin(known, ", ")));
  }
  GC_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, it->second.factory(params));
  if (codec == nullptr) {
    return absl::InternalError(
        absl::StrFormat("codec '%s': factory returned no codec", name));
  }
  // Checked here once, so that no factory can forget to reject typos.
  GC_RETURN_IF_ERROR(params.CheckAllUsed(name));
  return codec;
}

std::vector<CodecInfo> CodecRegistry::List() const {
  std::vector<CodecInfo> out;
  out.reserve(codecs_.size());
  for (const auto& [name, registration] : codecs_) {
    out.push_back(registration.info);
  }
  return out;
}

}  // namespace gradcomp::codecs
