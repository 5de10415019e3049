// The answers of one ReduceStream, written by a thread of their own.
//
// gRPC allows one Write at a time on a stream, and a Write blocks while the
// client does not read (HTTP/2 flow control). If the workers that compute
// answers wrote them, a client that stops reading would hold them in Write,
// and the workers serve every client. So they only queue answers here, and
// one writer per stream writes them. The stream's reader waits for room
// (WaitForRoom) before it takes another request, so a client that does not
// read its answers stops being served, not the others, and the answers
// waiting for it stay bounded.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<StreamOutbox> outbox,
//                       StreamOutbox::Start(
//                           [&](const auto& a) { return stream->Write(a); },
//                           kMaxUnwrittenBytes));
//   while (outbox->WaitForRoom() && stream->Read(&request)) ... Push(answer);
//   const bool delivered = outbox->Close();
#ifndef GRADCOMP_SERVICE_API_STREAM_OUTBOX_H_
#define GRADCOMP_SERVICE_API_STREAM_OUTBOX_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gradcomp/v1/gradcomp.pb.h"

namespace gradcomp::service {

class StreamOutbox {
 public:
  // Writes one answer to the stream; false once the stream is broken (the
  // client went away or cancelled).
  using WriteFn = std::function<bool(const v1::ReduceStreamResponse&)>;

  // An outbox with its writer running. WaitForRoom waits while more than
  // `max_unwritten_bytes` of answers are queued. ResourceExhausted when no
  // thread can be started (the stream should be refused).
  static absl::StatusOr<std::unique_ptr<StreamOutbox>> Start(
      WriteFn write, uint64_t max_unwritten_bytes);
  StreamOutbox(const StreamOutbox&) = delete;
  StreamOutbox& operator=(const StreamOutbox&) = delete;
  // Close()s.
  ~StreamOutbox();

  // Queues `answer` for the writer; never waits for the client. After the
  // stream broke, answers are dropped. `hold` (the memory budget's
  // reservation of the answer's bytes, say) is kept until the answer is
  // written or dropped.
  void Push(v1::ReduceStreamResponse answer,
            std::shared_ptr<const void> hold = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until the queued answers hold at most `max_unwritten_bytes`, or
  // the stream broke (then false: read no more requests).
  bool WaitForRoom() ABSL_LOCKS_EXCLUDED(mu_);

  // When the write in progress began, nullopt when none is: a client that
  // stopped reading keeps one in progress for ever (StallWatchdog).
  std::optional<std::chrono::steady_clock::time_point> WritingSince()
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every answer pushed so far is written (or dropped by a
  // broken stream) and stops the writer; true if the stream took them all.
  // Call once every Push is done.
  bool Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  StreamOutbox(WriteFn write, uint64_t max_unwritten_bytes);
  void WriteAll() ABSL_LOCKS_EXCLUDED(mu_);

  const WriteFn write_;
  const uint64_t max_unwritten_bytes_;
  absl::Mutex mu_;
  struct Queued {
    v1::ReduceStreamResponse answer;
    uint64_t bytes = 0;  // its serialised size, counted in unwritten_bytes_
    std::shared_ptr<const void> hold;
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t unwritten_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::chrono::steady_clock::time_point> writing_since_
      ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_STREAM_OUTBOX_H_
