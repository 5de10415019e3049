#include "service/config/utf8.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/utf8.h"
#include "google/protobuf/descriptor.h"

namespace gradcomp::service {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

absl::Status CheckString(const std::string& path, const std::string& value) {
  const size_t bad = FirstInvalidUtf8Byte(value);
  if (bad == value.size()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is not valid UTF-8: byte 0x%02X at offset %d does not start or "
      "continue a well-formed sequence; expected UTF-8 text",
      path, static_cast<unsigned char>(value[bad]), bad));
}

absl::Status CheckMessage(const std::string& prefix, const Message& message) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string path = absl::StrCat(prefix, field->name());
    const bool is_string = field->type() == FieldDescriptor::TYPE_STRING;
    const bool is_message =
        field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!is_string && !is_message) continue;
    if (!field->is_repeated()) {
      absl::Status status =
          is_string ? CheckString(path, reflection->GetString(message, field))
                    : CheckMessage(path + ".",
                                   reflection->GetMessage(message, field));
      if (!status.ok()) return status;
      continue;
    }
    for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
      const std::string element = absl::StrCat(path, "[", i, "]");
      absl::Status status =
          is_string
              ? CheckString(element,
                            reflection->GetRepeatedString(message, field, i))
              : CheckMessage(element + ".",
                             reflection->GetRepeatedMessage(message, field, i));
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckStringsAreUtf8(const Message& message) {
  return CheckMessage("", message);
}

}  // namespace gradcomp::service
