// Replays the seed corpus of peer_message_fuzzer under the normal build, so
// that every seed (and every crash input added to the corpus) stays a test.
// The seeds are made here, from what the senders write (HelloFrame,
// DataFrame, GatherMessage) and from those cut or bent; each run also
// writes them to the test's undeclared outputs
// (bazel-testlogs/service/collective/fuzz/peer_message_corpus_test/
// test.outputs/outputs.zip), whence a changed seed is copied into the corpus.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "codecs/tensor.h"
#include "gradcomp/v1/peer.pb.h"
#include "gtest/gtest.h"
#include "service/collective/fuzz/peer_message_checker.h"
#include "service/collective/gather_batch_message.h"
#include "service/transport/peer_frame.h"
#include "service/transport/peer_frame_testing.h"

namespace gradcomp::service {
namespace {

const char kCorpus[] = "service/collective/fuzz/corpus/peer_message";

std::string Input(PeerParser parser, uint8_t parameter,
                  const std::string& message) {
  return std::string{static_cast<char>(parser), static_cast<char>(parameter)} +
         message;
}

// A batch entry header: presence, then the length little-endian.
std::string Entry(uint8_t present, uint64_t size) {
  std::string out(1, static_cast<char>(present));
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(size >> (8 * b)));
  return out;
}

// The seeds by file name; invalid_* must be refused, the others accepted.
std::vector<std::pair<std::string, std::string>> Seeds() {
  v1::Hello hello;
  hello.set_version("0.1.0");
  hello.set_wire_version(1);
  hello.set_protocol_version(2);
  hello.set_world_size(4);
  hello.set_rank(1);
  hello.set_policy_hash("9f3a");
  hello.set_seed(42);
  hello.set_instance(0x1234567890abcdefu);
  v1::MessageHeader header;
  header.set_job("job0");
  header.set_tensor("fc1.weight");
  header.set_step(3);
  header.set_round(1);
  header.set_phase(v1::PHASE_GATHER);
  header.set_total_bytes(14);
  const absl::string_view chunk[] = {"0123456789", "abcd"};
  const absl::string_view later[] = {"tail"};
  const std::string first =
      FrameBytes(DataFrame(&header, chunk, 0x1c291ca3u, {}));
  // A later version's PeerFrame: fields 9 (varint), 10 (fixed64) and 11
  // (length-delimited) are skipped.
  const std::string unknown = FrameBytes(DataFrame(nullptr, later, 7, {})) +
                              std::string("\x48\x96\x01", 3) + "\x51" +
                              std::string(8, 'f') + "\x5a\x02zz";

  const std::vector<codecs::Bytes> payloads = {"payload-a", "", "unsent"};
  const std::string three = GatherMessage(payloads, {true, true, false});
  std::vector<codecs::Bytes> many(64, "p");
  std::vector<bool> every_other(64);
  for (size_t i = 0; i < many.size(); i += 2) every_other[i] = true;

  using P = PeerParser;
  return {
      {"frame_hello", Input(P::kFrame, 5, FrameBytes(HelloFrame(hello)))},
      {"frame_data_first", Input(P::kFrame, 20, first)},
      {"frame_data_later",
       Input(P::kFrame, 3, FrameBytes(DataFrame(nullptr, later, 9, {})))},
      {"frame_unknown_fields", Input(P::kFrame, 9, unknown)},
      {"invalid_frame_truncated",
       Input(P::kFrame, 7, first.substr(0, first.size() - 2))},
      {"invalid_frame_group", Input(P::kFrame, 0, "\x2b")},
      {"invalid_frame_hello_varint", Input(P::kFrame, 1, "\x08\x01")},
      {"batch_three", Input(P::kGatherBatch, 2, three)},
      {"batch_one_empty", Input(P::kGatherBatch, 0, Entry(1, 0))},
      {"batch_64",
       Input(P::kGatherBatch, 63, GatherMessage(many, every_other))},
      {"invalid_batch_ends_early",
       Input(P::kGatherBatch, 3, three)},  // 3 entries for 4 members
      {"invalid_batch_presence", Input(P::kGatherBatch, 0, Entry(2, 1) + "x")},
      {"invalid_batch_absent_length",
       Input(P::kGatherBatch, 0, Entry(0, 1) + "x")},
      {"invalid_batch_past_end",
       Input(P::kGatherBatch, 0, Entry(1, 5) + "xxxx")},
      {"invalid_batch_huge_length",
       Input(P::kGatherBatch, 1,
             Entry(1, UINT64_MAX - 8) + std::string(16, 'x') + Entry(1, 0))},
      {"invalid_batch_trailing", Input(P::kGatherBatch, 2, three + "+")},
  };
}

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

absl::Status Check(const std::string& bytes) {
  return CheckPeerMessage(reinterpret_cast<const uint8_t*>(bytes.data()),
                          bytes.size());
}

TEST(PeerMessageCorpusTest, EverySeedIsAcceptedOrRefusedAsNamed) {
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus)) {
    const absl::Status status = Check(Read(entry.path()));
    const bool invalid =
        entry.path().filename().string().rfind("invalid_", 0) == 0;
    if (invalid) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
          << entry.path() << ": " << status;
    } else {
      EXPECT_TRUE(status.ok()) << entry.path() << ": " << status;
    }
    ++seeds;
  }
  EXPECT_GE(seeds, static_cast<int>(Seeds().size()));
}

TEST(PeerMessageCorpusTest, TheSeedsAreWhatTheSendersWrite) {
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  for (const auto& [name, bytes] : Seeds()) {
    if (outputs != nullptr) {
      std::ofstream(std::filesystem::path(outputs) / name, std::ios::binary)
          << bytes;
    }
    EXPECT_EQ(Read(std::filesystem::path(kCorpus) / name), bytes)
        << name << " differs from what the senders write now; copy it from "
        << "the test's outputs.zip into " << kCorpus;
  }
}

TEST(PeerMessageCorpusTest, TheSecondByteCutsAFrameAnywhere) {
  v1::Hello hello;
  hello.set_rank(2);
  const std::string frame = FrameBytes(HelloFrame(hello));
  for (int cut = 0; cut < 256; ++cut) {
    EXPECT_TRUE(Check(Input(PeerParser::kFrame, cut, frame)).ok()) << cut;
  }
}

TEST(PeerMessageCorpusTest, ShortInputsAreRefused) {
  EXPECT_EQ(Check("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Check("\x01").code(), absl::StatusCode::kInvalidArgument);
  // An empty frame is an empty PeerFrame; an empty batch message is not a
  // batch of one member.
  EXPECT_TRUE(Check(Input(PeerParser::kFrame, 0, "")).ok());
  EXPECT_EQ(Check(Input(PeerParser::kGatherBatch, 0, "")).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::service
