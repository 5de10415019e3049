#include "service/api/stream_outbox.h"

#include <utility>

#include "base/start_thread.h"
#include "base/status_macros.h"

namespace gradcomp::service {

absl::StatusOr<std::unique_ptr<StreamOutbox>> StreamOutbox::Start(
    WriteFn write, uint64_t max_unwritten_bytes) {
  std::unique_ptr<StreamOutbox> outbox(
      new StreamOutbox(std::move(write), max_unwritten_bytes));
  StreamOutbox* self = outbox.get();
  GC_ASSIGN_OR_RETURN(outbox->writer_,
                      StartThread([self] { self->WriteAll(); },
                                  "the writer of a ReduceStream"));
  return outbox;
}

StreamOutbox::StreamOutbox(WriteFn write, uint64_t max_unwritten_bytes)
    : write_(std::move(write)), max_unwritten_bytes_(max_unwritten_bytes) {}

StreamOutbox::~StreamOutbox() { Close(); }

void StreamOutbox::Push(v1::ReduceStreamResponse answer,
                        std::shared_ptr<const void> hold) {
  absl::MutexLock lock(&mu_);
  if (broken_) return;
  const uint64_t bytes = answer.ByteSizeLong();
  unwritten_bytes_ += bytes;
  queue_.push_back({std::move(answer), bytes, std::move(hold)});
}

bool StreamOutbox::WaitForRoom() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](StreamOutbox* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
        return self->broken_ ||
               self->unwritten_bytes_ <= self->max_unwritten_bytes_;
      },
      this));
  return !broken_;
}

std::optional<std::chrono::steady_clock::time_point>
StreamOutbox::WritingSince() {
  absl::MutexLock lock(&mu_);
  return writing_since_;
}

bool StreamOutbox::Close() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  if (writer_.joinable()) writer_.join();
  absl::MutexLock lock(&mu_);
  return !broken_;
}

void StreamOutbox::WriteAll() {
  while (true) {
    Queued next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](StreamOutbox* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return !self->queue_.empty() || self->closing_;
          },
          this));
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
      writing_since_ = std::chrono::steady_clock::now();
    }
    const bool written = write_(next.answer);
    absl::MutexLock lock(&mu_);
    writing_since_.reset();
    unwritten_bytes_ -= next.bytes;
    if (!written && !broken_) {
      // Nothing more reaches this client: what is queued goes now.
      broken_ = true;
      queue_.clear();
      unwritten_bytes_ = 0;
    }
  }
}

}  // namespace gradcomp::service
