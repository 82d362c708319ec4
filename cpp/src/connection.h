// Internal. One framed TCP connection to a named peer. Writers take turns by claiming the byte stream for a
// whole frame, so the sender thread and control paths can share it; reads belong to exactly one thread (the
// connection's receiver). The descriptor stays blocking for that reader: the sender's writes that must not
// block say so per call (MSG_DONTWAIT).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "p3/counters.h"
#include "p3/message.h"
#include "socket.h"
#include "p3/status.h"

namespace p3 {

// A frame read piece by piece as bytes arrive (Connection::ReadAvailable), for a loop that serves many peers and
// must never block on one of them.
struct PartialFrame {
  uint8_t head[kHeaderBytes] = {};
  size_t head_got = 0;
  Header header;            // valid once head_got == kHeaderBytes
  std::string payload;      // grows as the payload arrives: a header's claim allocates nothing by itself
  std::chrono::steady_clock::time_point started;  // when its first byte came
  bool begun() const { return head_got > 0; }
};

class Connection {
 public:
  // `limit_name` names max_payload_bytes in errors (see DecodeHeader).
  Connection(Socket socket, std::string peer, uint64_t max_payload_bytes, Counters* counters,
             const char* limit_name = "P3_MAX_MESSAGE_BYTES");

  // Any thread but the sender's. Sends header + payload (h.payload_bytes bytes at `payload`) as one frame,
  // blocking; waits first for a frame another thread has started here to finish.
  Status Send(const Header& h, const void* payload);
  // Failure path, any thread: sends one frame if that is possible within about `timeout_s` (another
  // thread may be in the middle of a frame here), and leaves the connection unusable for data.
  void SendLastWords(const Header& h, const void* payload, double timeout_s);

  // Sender thread only: the non-blocking frame path (sender.h). TryClaimWrites claims the byte stream unless
  // another thread is writing a frame; the claim lasts across WriteSome calls until ReleaseWrites, so Send
  // and SendLastWords wait for a partly written frame instead of landing inside it.
  bool TryClaimWrites();
  // Writes what the socket takes now of the frame (head = its encoded header) past *written bytes and
  // advances *written; counts the frame once it is complete. Never blocks.
  Status WriteSome(const Header& h, const uint8_t* head, const void* payload, uint64_t* written);
  // `torn`: the frame was abandoned part-way, so the stream is garbage from here on and every later write
  // fails (or, for last words, is skipped) instead of sending a header the peer would read as payload.
  void ReleaseWrites(bool torn);
  // Sender thread, holding the claim: the frame it now writes is `h`. Only an INIT or PUSH reads the caller's
  // array, so only those are noted: any other frame (a REQUEST carries its id in `iteration` and key 0, slice 0)
  // must never be taken for the push of a slice that a broadcast is about.
  void NoteWriting(const Header& h);
  // Receiver thread, before writing a broadcast into the caller's memory: waits while the sender is still in the
  // call that wrote the last bytes of this worker's push of the same slice. The server broadcasts a slice only
  // after it has received the whole push, so the bytes were already copied into the kernel and the wait is one
  // non-blocking call; but the sender's read of the caller's array ends only when that call returns, and a
  // broadcast into the same array (in-place pushpull), or a caller who reuses the array on completion, must come
  // after it. The claim's mutex makes that order a real happens-before (ThreadSanitizer cannot see the one
  // through the sockets). A broadcast of a slice whose push is not yet all written (the sender is between calls,
  // waiting for room) breaks the protocol: that is an error at once, never a wait on a peer that may not read.
  Status AwaitWritten(const Header& h);
  // The error for a frame to this peer that could not progress for `stalled_s` seconds.
  Status SendStalled(const Header& h, double stalled_s) const;
  // Any thread. The SO_SNDTIMEO bound (0: none). The sender applies it per destination: a peer that takes no
  // byte for this long fails the frame, as a blocking write would.
  double SendTimeout() const { return socket_.SendTimeout(); }
  void SetSendTimeout(double timeout_s) const { socket_.SetSendTimeout(timeout_s); }
  // Any thread (the receiver, on PAUSE and RESUME). The peer declared that it stops reading this connection on
  // purpose (backpressure), or that it reads again. While it is paused the sender does not hold a lack of
  // progress against the send timeout, and every change restarts the count (Sender::Wake tells the sender).
  void SetPeerPaused(bool paused) {
    if (peer_paused_.exchange(paused) != paused) pause_changes_.fetch_add(1);
  }
  bool PeerPaused() const { return peer_paused_.load(); }
  // How often the pause state changed so far: a pause and resume between two looks still restart the count.
  uint64_t PauseChanges() const { return pause_changes_.load(); }
  // Receiver thread only. Reads and validates the next header; the payload must be consumed next.
  Status ReadHeader(Header* h);
  Status ReadPayload(void* dst, uint64_t len);
  Status ReadPayload(std::string* dst, uint64_t len);
  Status SkipPayload(uint64_t len);
  // Receiver thread, before reading frames: once a frame's first byte has come, ReadHeader and the ReadPayload
  // that follows must have the whole frame within `timeout_s` in all (0: no bound), else they fail with Timeout.
  // A peer may be silent between frames for as long as it likes.
  void SetFrameDeadline(double timeout_s) { frame_deadline_s_ = timeout_s; }
  // The receiving loop's thread: reads what has arrived of the frame in `f` without blocking. *complete is
  // true when f holds a whole validated frame (the caller then starts the next one with a fresh PartialFrame).
  Status ReadAvailable(PartialFrame* f, bool* complete);
  int fd() const { return socket_.fd(); }
  // Receiver thread, before any frame: checks that the connecting peer holds `secret` (handshake.h).
  Status Authenticate(const std::string& secret, double timeout_s) const;
  // Receiver thread: a read that sees no byte for this long fails with Timeout (0: wait forever).
  void SetReceiveTimeout(double timeout_s) const { socket_.SetReceiveTimeout(timeout_s); }
  bool WaitReadable(double timeout_s) const { return socket_.WaitReadable(timeout_s); }

  // Any thread. Unblocks the receiver; later sends fail.
  void Shutdown() { socket_.Shutdown(); }
  // Any thread, on the way out after SendLastWords: ends our direction (FIN after what was sent), then reads and
  // drops what the peer still sends until it closes or `timeout_s` passes. Closing a socket with unread input
  // makes the kernel reset the connection and drop what was not yet delivered - the last words among it.
  void Linger(double timeout_s);
  // Who is at the other end, for error messages ("server 1 at 10.0.0.2:9000").
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }

 private:
  // Waits up to timeout_s (< 0: forever) for no frame in progress, then claims the stream. False at once if
  // the caller itself holds the claim (its frame cannot finish while it waits) or the stream is torn.
  bool ClaimWrites(double timeout_s);
  Status FrameError(const Header& h, const Status& st) const;
  // Around WriteSome's call: marks the noted frame's write call (false when h is not the noted frame), then ends
  // it, and forgets the frame once `all_written` (AwaitWritten).
  bool EnterWriteCall(const Header& h);
  void LeaveWriteCall(bool all_written);

  // RecvAll bounded by the current frame's deadline (when there is one).
  Status RecvFrameBytes(void* dst, uint64_t len, bool first);

  Socket socket_;
  std::string peer_;
  const uint64_t max_payload_bytes_;
  const char* const limit_name_;
  double frame_deadline_s_ = 0;  // receiver thread only
  std::chrono::steady_clock::time_point frame_end_;  // receiver thread only
  Counters* counters_;
  std::mutex claim_mu_;
  std::condition_variable claim_cv_;
  bool claimed_ = false;        // guarded by claim_mu_: a frame is being written
  std::thread::id claim_owner_;  // guarded by claim_mu_
  bool torn_ = false;            // guarded by claim_mu_: a frame was cut off, the stream is unusable
  // A frame that reads the caller's array (INIT, PUSH), by command and slice: a control frame (REQUEST carries a
  // request id in `iteration`) has no identity, so no broadcast or write call can be taken for it.
  struct FrameId {
    Command command = Command::kRequest;
    uint64_t key = 0;
    uint32_t slice = 0;
    uint64_t iteration = 0;
    bool set = false;
    static FrameId Of(const Header& h) {
      const bool reads_array = h.command == Command::kInit || h.command == Command::kPush;
      return reads_array ? FrameId{h.command, h.key, h.slice, h.iteration, true} : FrameId();
    }
    bool SameSlice(const Header& h) const {
      return set && key == h.key && slice == h.slice && iteration == h.iteration;
    }
    // The frame `h` itself (the sender, around its write call).
    bool Is(const Header& h) const { return SameSlice(h) && command == h.command; }
    // The frame whose array a BROADCAST `h` lands in.
    bool AnsweredBy(const Header& h) const { return h.command == Command::kBroadcast && SameSlice(h); }
  };
  FrameId writing_;  // guarded by claim_mu_: the claimed frame, once the sender named it, until all written
  bool in_call_ = false;  // guarded by claim_mu_: the sender is inside a write call of writing_
  int awaiting_ = 0;      // guarded by claim_mu_: receivers in AwaitWritten (the sender notifies only then)
  std::atomic<bool> peer_paused_{false};
  std::atomic<uint64_t> pause_changes_{0};
};

}  // namespace p3
