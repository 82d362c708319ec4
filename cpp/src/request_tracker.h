// Internal. The worker's pending operations as a state machine with no sockets, locks or threads: which keys
// exist, which operations (an init or a push of a key, per iteration) still expect broadcast slices, which
// receivers are writing into a caller's buffer right now, and the control requests awaiting their reply.
// The Worker owns one, calls it only with its mutex held, and runs the Completions it returns after releasing
// the mutex (a callback may call back into the worker). cpp/tests/request_tracker_tests.cc drives it directly.
//
// Why writers are tracked: a broadcast slice is read from the socket straight into the caller's buffer (no
// copy), outside the lock. An operation that fails meanwhile (a server rejects it, or the job fails) must not
// be handed back to the caller (MXNet would reuse the buffer) until that write has ended.
// Why sends are tracked too: the sender writes each slice of a push straight from the caller's gradient (no
// copy either). A failed operation must not be handed back while any of its slices is still queued for a
// server, whether that slice is later sent or dropped (SendHold).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "p3/dtype.h"
#include "p3/message.h"
#include "p3/slicer.h"
#include "p3/status.h"

namespace p3 {

// What the sender holds of one operation: each of its queued frames keeps a reference (OutMessage::hold), and
// the last one goes when the sender is done with the last frame (sent, dropped on a failed connection, refused,
// or thrown away when the sender stops). Only then may the caller's gradient be freed or reused.
// The tracker keeps a weak reference. When a failed operation still has frames queued, it asks (Want) to hear
// of the release: `on_release` then runs on whichever thread drops the last reference, possibly with the
// sender's or the worker's mutex held, so it must only hand the news on (it may not call into the tracker).
// An operation that succeeds does not wait for it: a server broadcasts a slice only once it received every
// worker's push of that slice, and the receiver writes a broadcast only after the sender returned from writing
// that push (Connection::AwaitWritten), so the sender reads no more of the gradient by then.
class SendHold {
 public:
  // `on_release` is set before the first reference is handed to the sender.
  explicit SendHold(std::function<void()> on_release = nullptr) : on_release_(std::move(on_release)) {}
  void set_on_release(std::function<void()> on_release) { on_release_ = std::move(on_release); }
  ~SendHold() {
    if (wanted_.load() && on_release_) on_release_();
  }
  SendHold(const SendHold&) = delete;
  SendHold& operator=(const SendHold&) = delete;
  void Want() { wanted_.store(true); }

 private:
  std::atomic<bool> wanted_{false};
  std::function<void()> on_release_;
};

class RequestTracker {
 public:
  using Callback = std::function<void(const Status&)>;

  // What to run once the worker's mutex is released: `done(status)` if done is set.
  struct Completion {
    Callback done;
    Status status;
    bool received = false;   // EndWrite: the slice counted towards its operation
    bool completed = false;  // ...and was its last one
    void Run() {
      if (done) done(status);
    }
  };

  struct Key {
    std::string name;
    DType dtype = DType::kFloat32;
    uint64_t count = 0;
    std::vector<Slice> slices;
  };

  // Declares `key`; Invalid if it is known already. Its first operation (Begin) is its init, iteration 0.
  Status Declare(uint64_t key, Key k);
  // Null if `key` was never declared.
  const Key* Find(uint64_t key) const;
  // The key's name for messages (its number if unknown).
  std::string Name(uint64_t key) const;

  // Starts the key's next operation, whose broadcast slices land in `out` and whose frames the sender holds
  // through `hold` (none: nothing borrowed); returns its iteration. A key without slices has nothing to wait
  // for: *now then holds the completion to run at once.
  uint64_t Begin(uint64_t key, char* out, Callback done, Completion* now, std::weak_ptr<SendHold> hold = {});

  // A broadcast slice from `server` arrived (header read, payload not yet): checks it against the slice this
  // worker sent and sets *dst to where its payload goes, counting a writer until EndWrite. *dst is null (and
  // nothing is counted) when its operation is gone or failed: the payload is then skipped.
  Status StartWrite(int server, const Header& h, char** dst);
  // The write StartWrite allowed has ended; `ok` says the whole payload landed. Returns what to run: the
  // operation's callback when this was its last slice, or when it failed meanwhile and this was its last writer.
  Completion EndWrite(const Header& h, bool ok);

  // A server rejected (key, iteration): no new writes into `out` start, and the operation completes with `error`
  // once nothing touches the caller's buffers any more: at once, or when its last writer is done (EndWrite), or
  // when the sender released its last frame (Released), whichever comes last. The key's next Wait reports it
  // too (TakeError).
  Completion Reject(uint64_t key, uint64_t iteration, const Status& error);
  // The SendHold of (key, iteration) asked for was released: completes the operation if it failed and no
  // writer is left.
  Completion Released(uint64_t key, uint64_t iteration);

  // The job failed: no new writes start from now on. Once writers() is 0, FailAll(status) fails every pending
  // operation with `status` and returns the completions of those the sender holds nothing of; the others
  // complete through Released (the worker shuts its connections, so the sender drops their frames promptly).
  void MarkFailed() { failed_ = true; }
  std::vector<Completion> FailAll(const Status& status);
  // Receivers writing into caller buffers right now.
  int writers() const { return writers_; }

  bool Idle(uint64_t key) const;
  bool AllIdle() const;
  // The first rejection of `key` since the last call (Ok if none), then forgets it.
  Status TakeError(uint64_t key);
  // The first rejection of any key since the last call (keys in key order), then forgets them all.
  Status TakeAllErrors();
  // What is still expected, for a timeout's message: "N slices still expected from servers {0, 2}" (and
  // "; M failed operations still queued in the sender" when some are).
  std::string Missing() const;

  // Control requests: a new id whose reply is awaited; the reply (ignored if the requester gave up);
  // whether it came; and, once, its result (the reply, or the server's error), forgetting the request.
  uint64_t NewRequest();
  void Answer(uint64_t id, Status status, std::string reply);
  bool Answered(uint64_t id) const;
  Status TakeAnswer(uint64_t id, std::string* reply);

 private:
  struct Op {
    uint64_t iteration;
    char* out;
    size_t remaining;  // slices not yet received
    Callback done;
    int writers = 0;   // receivers writing a slice into `out` right now
    Status failed;     // a server rejected it: completes with this once nothing touches its buffers
    std::weak_ptr<SendHold> hold;  // expired once the sender holds none of its frames
  };
  struct KeyState {
    Key key;
    uint64_t next_iteration = 0;
    std::deque<Op> ops;  // in iteration order
    Status error;        // first rejection since the last TakeError
  };
  // Whether the sender still holds frames of `op`; if so, asks to hear of their release (Released).
  static bool StillSending(const Op& op);
  // A failed `op` with no writer left and nothing in the sender: its completion (erasing it), else nothing.
  static Completion TryRelease(KeyState* ks, std::deque<Op>::iterator op);
  struct PendingRequest {
    bool done = false;
    Status status;
    std::string reply;
  };

  std::map<uint64_t, KeyState> keys_;
  std::map<uint64_t, PendingRequest> requests_;  // by id
  uint64_t next_request_ = 1;
  int writers_ = 0;
  bool failed_ = false;
};

}  // namespace p3
