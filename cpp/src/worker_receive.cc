// A worker's receive side: one thread per server reads broadcasts straight into the caller's arrays, and
// control frames (a rejection, a reply to a request, a failing server's last words) into the request tracker; a
// server's PAUSE and RESUME go to the connection's pause state, which the sender's stall check reads.
#include "worker_node.h"

#include "p3/log.h"

namespace p3 {

void WorkerNode::ReceiveLoop(int server) {
  Connection* conn = servers_[static_cast<size_t>(server)].get();
  Header h;
  Status st;
  while (st.ok()) {
    h = Header();
    st = conn->ReadHeader(&h);
    if (!st.ok()) break;
    if (h.command == Command::kBroadcast) {
      st = HandleBroadcast(server, conn, h);
    } else if (h.command == Command::kError || h.command == Command::kReply || h.command == Command::kNodeFailed) {
      std::string text;
      st = conn->ReadPayload(&text, h.payload_bytes);
      if (st.ok()) st = HandleControl(server, h, std::move(text));
    } else if ((h.command == Command::kPause || h.command == Command::kResume) && h.payload_bytes == 0) {
      // The server stops (or starts again) reading our data connection on purpose: the sender's stall check
      // spares it meanwhile (sender.h).
      conn->SetPeerPaused(h.command == Command::kPause);
      sender_.Wake();
    } else {
      st = Status::Invalid(std::string("unexpected ") + CommandName(h.command) + " frame");
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || !fatal_.ok()) return;
  }
  if (h.command == Command::kNodeFailed) {
    Fail(st);
  } else if (st.code() == Status::Code::kPeerLost) {
    Fail(Status::PeerLost("lost " + conn->peer() + " (" + st.message() + "): the server died or the network failed"));
  } else {
    Fail(st.WithContext("bad frame from " + conn->peer()));
  }
}

Status WorkerNode::HandleBroadcast(int server, Connection* conn, const Header& h) {
  char* dst = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status st = tracker_.StartWrite(server, h, &dst);
    if (!st.ok()) return st;
    if (dst == nullptr) {
      // The operation already failed (a server rejected it): drop the late slice.
      Log(LogLevel::kInfo, Name(), "dropping a late broadcast of key '" + tracker_.Name(h.key) + "' iteration " +
          std::to_string(h.iteration));
    }
  }
  if (dst == nullptr) return conn->SkipPayload(h.payload_bytes);
  // Straight from the socket into the caller's buffer: no copy of the parameter on the worker; but only once our
  // sender has returned from writing this slice's push, which may have read the same memory.
  const Status written = conn->AwaitWritten(h);
  const Status st = written.ok() ? conn->ReadPayload(dst, h.payload_bytes) : written;
  RequestTracker::Completion c;
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c = Completing(tracker_.EndWrite(h, st.ok()));
    if (c.received) trace_.Record(TraceEvent::kWorkerReceive, h.key, h.slice, h.priority, h.iteration, server);
    if (c.completed) {
      trace_.Record(TraceEvent::kComplete, h.key, static_cast<uint32_t>(tracker_.Find(h.key)->slices.size()),
                    h.priority, h.iteration, -1);
    }
    // Fail() waits for the last writer (only once fatal_ is set, which it checks under mu_ before waiting); Wait()
    // for an operation to end. A slice that landed in the middle of a healthy operation changes neither: waking
    // every waiter for it (a waiting caller thread, per slice of a key with thousands) costs a context switch and
    // a turn at mu_ for nothing.
    wake = !c.received || c.completed || !fatal_.ok();
  }
  if (wake) cv_.notify_all();
  Finish(&c);  // after a failed read, only a rejected operation this was the last writer of (else FailAll)
  return st;
}

Status WorkerNode::HandleControl(int server, const Header& h, std::string text) {
  const std::string& peer = servers_[static_cast<size_t>(server)]->peer();
  if (h.command == Command::kNodeFailed) return Status::PeerLost(peer + " failed: " + text);  // its last words
  RequestTracker::Completion c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (h.command == Command::kReply) {  // an answer to Request(); an error text if its status says so
      if (h.status == 0) {
        tracker_.Answer(h.iteration, Status::Ok(), std::move(text));
      } else {  // kUnsupported stays itself (the caller may fall back); any other refusal is a rejection
        std::string why = "server " + std::to_string(h.sender) + ": " + text;
        tracker_.Answer(h.iteration, h.status == static_cast<uint8_t>(Status::Code::kUnsupported)
                                         ? Status::Unsupported(std::move(why))
                                         : Status::Rejected(std::move(why)), "");
      }
    } else {  // ERROR: the server rejected an operation
      const Status error = Status::Rejected(peer + " rejected key '" + tracker_.Name(h.key) + "' (iteration " +
                                            std::to_string(h.iteration) + "): " + text);
      Log(LogLevel::kWarning, Name(), error.message());
      c = Completing(tracker_.Reject(h.key, h.iteration, error));
    }
  }
  cv_.notify_all();
  Finish(&c);
  return Status::Ok();
}

}  // namespace p3
