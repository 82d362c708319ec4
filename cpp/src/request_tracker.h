// Internal. The worker's pending operations as a state machine with no sockets, locks or threads: which keys
// exist, which operations (an init or a push of a key, per iteration) still expect broadcast slices, which
// receivers are writing into a caller's buffer right now, and the control requests awaiting their reply.
// The Worker owns one, calls it only with its mutex held, and runs the Completions it returns after releasing
// the mutex (a callback may call back into the worker). cpp/tests/request_tracker_tests.cc drives it directly.
//
// Why writers are tracked: a broadcast slice is read from the socket straight into the caller's buffer (no
// copy), outside the lock. An operation that fails meanwhile (a server rejects it, or the job fails) must not
// be handed back to the caller (MXNet would reuse the buffer) until that write has ended.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "p3/dtype.h"
#include "p3/message.h"
#include "p3/slicer.h"
#include "p3/status.h"

namespace p3 {

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

  // Starts the key's next operation, whose broadcast slices land in `out`; returns its iteration. A key
  // without slices has nothing to wait for: *now then holds the completion to run at once.
  uint64_t Begin(uint64_t key, char* out, Callback done, Completion* now);

  // A broadcast slice from `server` arrived (header read, payload not yet): checks it against the slice this
  // worker sent and sets *dst to where its payload goes, counting a writer until EndWrite. *dst is null (and
  // nothing is counted) when its operation is gone or failed: the payload is then skipped.
  Status StartWrite(int server, const Header& h, char** dst);
  // The write StartWrite allowed has ended; `ok` says the whole payload landed. Returns what to run: the
  // operation's callback when this was its last slice, or when it failed meanwhile and this was its last writer.
  Completion EndWrite(const Header& h, bool ok);

  // A server rejected (key, iteration): the operation completes with `error` at once, or when its last writer
  // is done. The key's next Wait reports it too (TakeError).
  Completion Reject(uint64_t key, uint64_t iteration, const Status& error);

  // The job failed: no new writes start from now on. Once writers() is 0, FailAll() hands back every pending
  // operation's callback (to be called with the job's failure) and forgets the operations.
  void MarkFailed() { failed_ = true; }
  std::vector<Callback> FailAll();
  // Receivers writing into caller buffers right now.
  int writers() const { return writers_; }

  bool Idle(uint64_t key) const;
  bool AllIdle() const;
  // The first rejection of `key` since the last call (Ok if none), then forgets it.
  Status TakeError(uint64_t key);
  // The first rejection of any key since the last call (keys in key order), then forgets them all.
  Status TakeAllErrors();
  // What is still expected, for a timeout's message: "N slices still expected from servers {0, 2}".
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
    Status failed;     // a server rejected it: completes with this once the last writer is done
  };
  struct KeyState {
    Key key;
    uint64_t next_iteration = 0;
    std::deque<Op> ops;  // in iteration order
    Status error;        // first rejection since the last TakeError
  };
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
