// Internal. P3's server-side aggregation as a state machine with no sockets, threads or locks: the server is
// I/O around it, and cpp/tests/aggregator_tests.cc drives it directly.
//
// Per slice: an INIT from every worker (worker 0's carries the value) → broadcast of the value (iteration 0);
// then, per iteration, a PUSH from every worker summed into the accumulator → update → broadcast. A push for
// a later iteration is held until the slice gets there, so iterations never mix; anything inconsistent is
// rejected with the reason, and a slice whose workers disagree on its shape fails for all of them.
//
// A worker that leaves (BYE, after its last frame) has contributed every iteration it ever will: a slice that
// needs a later iteration from it can never complete. WorkerLeft fails those iterations at once (pending,
// held and later pushes), naming the worker, its last iteration and the key, instead of leaving the other
// workers waiting for ever (uneven steps per worker). A worker that finished the same last iteration as
// the others leaves nothing behind: nothing needs it any more.
//
// The broadcast shares the slice's value buffer with the sends instead of copying it: the next update can only
// come after every worker received this broadcast (a worker pushes iteration i+1 of a key once it has
// iteration i), so the buffer is written again only when the sends are done. A worker that pipelines pushes
// without waiting breaks that order; then the update copies the value first (copy on write).
// Consumer thread only.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "admission.h"
#include "buffer_pool.h"
#include "p3/message.h"
#include "p3/status.h"
#include "p3/update.h"

namespace p3 {

// A received INIT or PUSH: its header, its payload, and its share of the server's memory bound.
struct Frame {
  Header header;
  BufferPool::Buffer payload;
  Admission::Ticket ticket;
};

// A slice as the hooks see it.
struct SliceEntry {
  uint64_t key = 0;
  uint32_t slice = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
  DType dtype = DType::kFloat32;
  uint64_t iteration = 0;                    // last completed iteration (0 = init)
  std::shared_ptr<std::vector<char>> value;  // the parameter slice; shared with sends in flight
};

class Aggregator {
 public:
  struct Hooks {
    // The slice completed iteration `r.iteration` (≥ 1): update r.value from r.aggregated. Empty: the value
    // becomes the aggregate ("aggregate only"). A non-Ok status rejects the iteration for every worker.
    Updater update;
    // Send `s.value` (do not modify it) to every worker.
    std::function<void(const SliceEntry& s, int32_t priority)> broadcast;
    // Tell `worker` that the request `h` was refused, and why.
    std::function<void(int worker, const Header& h, const std::string& why)> reject;
    // Optional: `f` now waits for a later iteration (for the memory bound's accounting).
    std::function<void(Frame* f)> held;
    // Optional: a slice needs an iteration from a worker that has left, so the job cannot go on (`why` says
    // which worker, key and iterations). Called once per stranded iteration, after its rejections.
    std::function<void(const std::string& why)> stranded;
  };

  // `slice_budget_bytes` bounds the slices' memory (value, accumulator, float16 rounding buffer) over the job:
  // an INIT that would pass it is rejected before anything is allocated (0: no bound). A 64-byte INIT may
  // declare a slice of any size, so without the bound a peer could make the server allocate without limit.
  Aggregator(int workers, Hooks hooks, uint64_t slice_budget_bytes = 0)
      : workers_(workers), hooks_(std::move(hooks)), slice_budget_(slice_budget_bytes),
        left_(static_cast<size_t>(workers), false) {}

  // An INIT or PUSH frame from worker h.sender (validated by the codec; the payload matches payload_bytes).
  void OnFrame(Frame f);
  // Worker `w` said goodbye after its last frame (OnFrame was called for every frame it sent). Rejects, for
  // every other worker, each push (pending, held or later) and init that needs a contribution `w` never sent.
  void WorkerLeft(int w);

  size_t num_slices() const { return slices_.size(); }
  // Updates that had to copy the value because a broadcast of it was still being sent.
  uint64_t value_copies() const { return value_copies_.load(std::memory_order_relaxed); }  // any thread
  // Pushes held for a later iteration, over all slices.
  size_t held_frames() const;
  // Payload bytes of the slices' values (and accumulators) allocated so far.
  uint64_t slice_bytes() const { return slice_bytes_; }

 private:
  struct Slice {
    SliceEntry entry;
    std::vector<char> accum;    // this iteration's sum, in AccumulatorType(dtype)
    std::vector<char> rounded;  // float16, bfloat16 only: the sum rounded back for the update function
    std::vector<bool> contributed;
    std::vector<uint64_t> sent;  // per worker: frames (INIT, then one PUSH per iteration) it sent this slice
    int arrived = 0;
    bool initialized = false;
    std::deque<Frame> held;
    std::string broken;  // why the slice can never initialise (workers disagree on it); empty if fine
  };

  Slice* Find(const Header& h);
  void OnInit(Slice* s, Frame f);
  void OnPush(Slice* s, Frame f);
  void Complete(Slice* s, int32_t priority);
  void ReplayHeld(Slice* s);
  // Non-empty when a worker that left never sent iteration `iteration` of `s` (iteration 0 = INIT).
  std::string NeedsDeparted(const Slice& s, uint64_t key, uint64_t iteration) const;
  // `s`'s current iteration can never complete (`why`): reject its contributors and stop the job.
  void Strand(Slice* s, const Header& h, const std::string& why);

  const int workers_;
  const Hooks hooks_;
  const uint64_t slice_budget_;
  std::map<std::pair<uint64_t, uint32_t>, Slice> slices_;
  std::map<uint64_t, uint32_t> key_slices_;  // slices of each key held here
  std::vector<bool> left_;                    // workers that said goodbye
  std::atomic<uint64_t> value_copies_{0};
  uint64_t slice_bytes_ = 0;
};

}  // namespace p3
