#include "p3/sender.h"

#include <utility>

namespace p3 {

Sender::Sender(Trace* trace, ErrorHandler on_error) : trace_(trace), on_error_(std::move(on_error)) {}

Sender::~Sender() { Abort(); }

void Sender::Start() {
  thread_ = std::thread([this] {
    while (RunOnce()) {
    }
  });
}

bool Sender::Enqueue(OutMessage m) {
  const int32_t priority = m.header.priority;
  return queue_.Push(priority, std::move(m));
}

bool Sender::RunOnce() {
  std::optional<OutMessage> m = queue_.Pop();
  if (!m) return false;
  const void* data = m->owned ? static_cast<const void*>(m->owned->data()) : m->data;
  Status st = m->conn->Send(m->header, data);
  if (!st.ok()) {
    on_error_(*m, st);
    return true;  // keep draining: other connections may still work, the owner decides what fails
  }
  const Header& h = m->header;
  trace_->Record(TraceEvent::kSend, h.key, h.slice, h.priority, h.iteration, m->peer_rank);
  return true;
}

void Sender::Drain() {
  queue_.Close();
  if (thread_.joinable()) thread_.join();
}

void Sender::Abort() {
  queue_.Abort();
  if (thread_.joinable()) thread_.join();
}

}  // namespace p3
