// Internal. The server's memory bound on received frames (P3_SERVER_QUEUE_BYTES). Every payload byte that a
// receiver has read and the consumer has not yet aggregated counts against it, whether the frame waits in
// the priority queue or is held for a later iteration. Each worker gets an equal share, so a fast worker
// cannot use up the bound while a slow one's pushes, which every slice needs, wait behind it; a worker over its
// share stops being read (TCP backpressure). A frame larger than the share is admitted alone.
// Held frames (pushes for a later iteration, or before the slice's INIT is complete) count against the share
// too: a worker that runs ahead is read while its held bytes are under its share, so the server holds at most
// about one share (plus one frame) per worker, not up to the aggregator's per-slice cap of 8·W frames of every
// slice. Its held frames wait for the other workers' pushes, which arrive on their own connections under their
// own shares, so blocking it is safe as long as the workers push each key's iterations in order and declare
// keys in the same order (what the aggregator requires anyway).
// Such a pause lasts as long as the slowest worker lags, so the paused worker must not take it for a stalled
// server: a receiver that waits longer than a moment tells its worker (PauseNotice: the server sends PAUSE, then
// RESUME once it reads again), and the worker's stall check spares it meanwhile (sender.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace p3 {

class Admission {
 public:
  // Runs on the receiver thread of `worker`, no lock held: true when its Admit has waited `notice_after_s` and
  // goes on waiting, false when that wait ends (admitted or aborted).
  using PauseNotice = std::function<void(int worker, bool paused)>;
  Admission(uint64_t budget_bytes, int workers, PauseNotice notice = nullptr, double notice_after_s = 0);
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // A frame's share of the bound; releases it when destroyed. The Admission must outlive it.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& o) noexcept : owner_(o.owner_), worker_(o.worker_), bytes_(o.bytes_), held_(o.held_) {
      o.owner_ = nullptr;
    }
    Ticket& operator=(Ticket&& o) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { Release(); }
    void Release();

   private:
    friend class Admission;
    Admission* owner_ = nullptr;
    int worker_ = -1;
    uint64_t bytes_ = 0;
    bool held_ = false;
  };

  // Receiver thread of `worker`: waits until `bytes` more fit in the worker's share. False once aborted.
  bool Admit(int worker, uint64_t bytes, Ticket* ticket);
  // Consumer thread: the frame now waits for other workers' pushes (see the class comment).
  void MarkHeld(Ticket* ticket);
  // The bytes each worker may have outstanding (queued and held).
  uint64_t share() const { return share_; }
  // Any thread: wakes every waiting receiver; Admit fails from now on.
  void Abort();
  // Any thread: payload bytes outstanding for all workers, and those held for a later iteration.
  uint64_t outstanding() const;
  uint64_t held() const;

 private:
  void Release(Ticket* t);

  const uint64_t share_;
  const PauseNotice notice_;
  const double notice_after_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> outstanding_;  // by worker: queued + held
  std::vector<uint64_t> held_;         // by worker
  bool aborted_ = false;
};

}  // namespace p3
