#include "codecs/fuzz/decode_checker.h"

#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "codecs/builtin.h"
#include "codecs/params.h"
#include "codecs/state.h"
#include "codecs/testing/golden.h"

namespace gradcomp::codecs::fuzz {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "payload fields are read with host-order memcpy");

// Not 1, so that a decoder which ignores alpha decodes differently.
constexpr float kAlpha = 0.5f;

// The accumulator a payload that fails PeekPayload is decoded into: such a
// payload names no numel to trust, and must be rejected at any size.
constexpr size_t kUnparsedNumel = 64;

// Non-zero and varied, so that any write by a decoder that then rejects its
// payload shows up.
std::vector<float> Pattern(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(i % 13) * 0.25f - 1.5f;
  }
  return v;
}

// Compared bit for bit: NaN is a value a decoder might leave, and must not
// be mistaken for a change.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A bad payload is the sender's fault: any code but InvalidArgument would
// tell the daemon its own machinery failed.
absl::Status CheckCode(const absl::Status& s, absl::string_view call) {
  if (s.ok() || absl::IsInvalidArgument(s)) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "%s returned %s; expected OK or InvalidArgument", call, s.ToString()));
}

absl::Status Broken(absl::string_view what, const absl::Status& s) {
  return absl::InternalError(
      absl::StrFormat("%s (status: %s)", what, s.ToString()));
}

// Checks AddDenseBody on any dense body, the path a sum collective takes
// before any codec sees the payload: the right size adds, any other is
// rejected without a write.
absl::Status CheckDenseBody(const ParsedPayload& parsed) {
  if ((parsed.header.flags & kFlagDenseBody) == 0) return absl::OkStatus();
  // PeekPayload checked the element type and that the body holds whole
  // elements.
  const size_t n = parsed.body.size() /
                   ElemTypeBytes(static_cast<ElemType>(parsed.params[0]));
  std::vector<float> acc = Pattern(n);
  const absl::Status fits = AddDenseBody(parsed, kAlpha, absl::MakeSpan(acc));
  if (!fits.ok()) {
    return Broken("AddDenseBody rejected a body of the accumulator's size",
                  fits);
  }
  const std::vector<float> before = Pattern(n + 1);
  acc = before;
  const absl::Status longer = AddDenseBody(parsed, kAlpha, absl::MakeSpan(acc));
  if (!absl::IsInvalidArgument(longer) || !SameBits(acc, before)) {
    return Broken(
        "AddDenseBody into a longer accumulator was not a clean "
        "InvalidArgument",
        longer);
  }
  return absl::OkStatus();
}

// Returns whether DecodeAdd accepted the payload.
absl::StatusOr<bool> CheckDecodeAdd(
    const SingleRoundCodec& codec, absl::string_view payload,
    const absl::StatusOr<ParsedPayload>& peeked) {
  const size_t numel =
      peeked.ok() ? static_cast<size_t>(peeked->header.numel) : kUnparsedNumel;
  const std::vector<float> before = Pattern(numel);
  std::vector<float> acc = before;
  const absl::Status s = codec.DecodeAdd(payload, kAlpha, absl::MakeSpan(acc));
  GC_RETURN_IF_ERROR(CheckCode(s, "DecodeAdd"));
  if (!s.ok()) {
    if (!SameBits(acc, before)) {
      return Broken(
          "DecodeAdd rejected the payload but changed the accumulator", s);
    }
    return false;
  }
  if (!peeked.ok()) {
    return Broken("DecodeAdd accepted a payload that PeekPayload rejects",
                  peeked.status());
  }
  if (peeked->header.codec != codec.info().id) {
    return absl::InternalError(absl::StrFormat(
        "DecodeAdd accepted a payload of codec id %d; expected only id %d",
        static_cast<int>(peeked->header.codec),
        static_cast<int>(codec.info().id)));
  }
  return true;
}

// What the peer collective does before a sum reaches a codec: both
// payloads parse, carry dense bodies of the same codec and round, and the
// bodies add up; otherwise the round fails there.
absl::StatusOr<std::vector<float>> SumCollective(absl::string_view own,
                                                 absl::string_view peer) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload a, PeekPayload(own));
  GC_ASSIGN_OR_RETURN(const ParsedPayload b, PeekPayload(peer));
  if ((a.header.flags & kFlagDenseBody) == 0 ||
      b.header.codec != a.header.codec || b.header.round != a.header.round) {
    return absl::InvalidArgumentError("the collective refuses the peer");
  }
  std::vector<float> sum(
      a.body.size() / ElemTypeBytes(static_cast<ElemType>(a.params[0])), 0.0f);
  GC_RETURN_IF_ERROR(AddDenseBody(a, 1.0f, absl::MakeSpan(sum)));
  GC_RETURN_IF_ERROR(AddDenseBody(b, 1.0f, absl::MakeSpan(sum)));
  return sum;
}

// PowerSGD sends factor matrices whose sizes follow the tensor's shape, and
// a sum collective adds only bodies of one size: the fuzzed tensor takes the
// rows the payload names (powersgd.h, parameter bytes 8..15) so that fuzzed
// factors reach Absorb. Other codecs decode whatever the shape.
std::vector<int64_t> SessionShape(const Codec& codec,
                                  const ParsedPayload& parsed) {
  const uint64_t n = parsed.header.numel;
  if (codec.info().id == CodecId::kPowerSgd && parsed.params.size() >= 16) {
    uint64_t rows;
    std::memcpy(&rows, parsed.params.data() + 8, sizeof(rows));
    if (rows > 0 && n > 0 && n % rows == 0) {
      return {static_cast<int64_t>(rows), static_cast<int64_t>(n / rows)};
    }
  }
  return {static_cast<int64_t>(n)};
}

// Runs a whole session of a two-worker step in which the peer sent
// `payload` (in the round it names, for summed rounds), through Absorb and
// Finish, where FinishGather, FinishSum and multi-round decoding live.
// `decoded`: whether DecodeAdd accepted the payload, for single-round codecs.
absl::Status CheckSession(const Codec& codec, absl::string_view payload,
                          const ParsedPayload& parsed,
                          std::optional<bool> decoded) {
  const size_t n = static_cast<size_t>(parsed.header.numel);
  const std::vector<int64_t> shape = SessionShape(codec, parsed);
  std::vector<float> grad(n);
  for (size_t i = 0; i < n; ++i) {
    grad[i] = static_cast<float>((i * 37) % 101) * 0.0625f - 3.0f;
  }
  TensorState state;
  StepContext ctx;
  ctx.seed = 2024;
  ctx.tensor_id = 1;
  ctx.step = 3;
  ctx.rank = 0;
  ctx.world_size = 2;
  // This worker's own tensor is not under test: if the codec cannot encode
  // it, there is nothing to decode.
  absl::StatusOr<std::unique_ptr<CodecSession>> session =
      codec.Start(TensorView{grad, shape}, state, ctx);
  if (!session.ok()) return absl::OkStatus();
  bool gathered = false;
  for (int round = 0;; ++round) {
    absl::StatusOr<std::optional<Round>> next = (*session)->NextRound();
    if (!next.ok()) return absl::OkStatus();
    if (!next->has_value()) break;
    const Round& own = **next;
    RoundResult result;
    result.world_size = 2;
    if (own.collective == Collective::kGather) {
      // A gather collective hands over whatever the peer sent.
      result.payloads = {own.payload, Bytes(payload)};
      gathered = true;
    } else {
      absl::StatusOr<std::vector<float>> sum = SumCollective(
          own.payload, parsed.header.round == round ? payload : own.payload);
      if (!sum.ok()) return absl::OkStatus();
      result.sum = *std::move(sum);
    }
    const absl::Status absorbed = (*session)->Absorb(std::move(result));
    GC_RETURN_IF_ERROR(CheckCode(absorbed, "Absorb"));
    if (!absorbed.ok()) return absl::OkStatus();
  }
  const std::vector<float> before = Pattern(n);
  std::vector<float> out = before;
  const absl::Status finished = (*session)->Finish(absl::MakeSpan(out));
  GC_RETURN_IF_ERROR(CheckCode(finished, "Finish"));
  if (!finished.ok() && !SameBits(out, before)) {
    return Broken("Finish rejected the round but changed its output", finished);
  }
  // This worker's payload is valid, so the gather stands or falls with the
  // peer's, as DecodeAdd judged it.
  if (gathered && decoded.has_value() && finished.ok() != *decoded) {
    return Broken(*decoded
                      ? "FinishGather rejected a payload DecodeAdd accepts"
                      : "FinishGather accepted a payload DecodeAdd rejects",
                  finished);
  }
  return absl::OkStatus();
}

absl::Status CheckCodec(const Codec& codec, absl::string_view payload,
                        const absl::StatusOr<ParsedPayload>& peeked) {
  std::optional<bool> decoded;
  if (const auto* single = dynamic_cast<const SingleRoundCodec*>(&codec)) {
    GC_ASSIGN_OR_RETURN(decoded, CheckDecodeAdd(*single, payload, peeked));
  }
  if (peeked.ok() && peeked->header.numel <= kMaxSessionNumel) {
    GC_RETURN_IF_ERROR(CheckSession(codec, payload, *peeked, decoded));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DecodeChecker> DecodeChecker::Create(absl::string_view name) {
  std::vector<Variant> variants;
  std::set<std::map<std::string, std::string>> seen;
  seen.emplace();  // the defaults
  GC_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec,
                      BuiltinCodecs().Create(name, CodecParams()));
  variants.push_back({"default", std::move(codec)});
  for (const testing::GoldenCase& c : testing::GoldenCases()) {
    if (c.codec != name || !seen.insert(c.params).second) continue;
    GC_ASSIGN_OR_RETURN(codec,
                        BuiltinCodecs().Create(name, CodecParams(c.params)));
    variants.push_back({c.file, std::move(codec)});
  }
  return DecodeChecker(std::string(name), std::move(variants));
}

absl::Status DecodeChecker::Check(absl::string_view payload) const {
  const absl::StatusOr<ParsedPayload> peeked = PeekPayload(payload);
  if (peeked.ok()) {
    if (peeked->header.numel > kMaxDecodeNumel) return absl::OkStatus();
    GC_RETURN_IF_ERROR(CheckDenseBody(*peeked));
  }
  for (const Variant& v : variants_) {
    const absl::Status s = CheckCodec(*v.codec, payload, peeked);
    if (!s.ok()) {
      return absl::InternalError(
          absl::StrFormat("%s (%s): %s", name_, v.label, s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::codecs::fuzz
