#include "admission.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>

namespace p3 {

Admission::Admission(uint64_t budget_bytes, int workers, PauseNotice notice, double notice_after_s)
    : share_(std::max<uint64_t>(1, budget_bytes / static_cast<uint64_t>(std::max(workers, 1)))),
      notice_(std::move(notice)),
      notice_after_s_(notice_after_s),
      outstanding_(static_cast<size_t>(std::max(workers, 1)), 0),
      held_(static_cast<size_t>(std::max(workers, 1)), 0) {}

Admission::Ticket& Admission::Ticket::operator=(Ticket&& o) noexcept {
  if (this != &o) {
    Release();
    owner_ = o.owner_;
    worker_ = o.worker_;
    bytes_ = o.bytes_;
    held_ = o.held_;
    o.owner_ = nullptr;
  }
  return *this;
}

void Admission::Ticket::Release() {
  if (owner_ != nullptr) owner_->Release(this);
  owner_ = nullptr;
}

bool Admission::Admit(int worker, uint64_t bytes, Ticket* ticket) {
  const size_t w = static_cast<size_t>(worker);
  std::unique_lock<std::mutex> lock(mu_);
  const auto fits = [&] {
    const uint64_t out = outstanding_[w];
    // A worker whose outstanding frames are all held is still read while they are under its share: the next
    // frame may be the one that completes an iteration and releases them.
    return aborted_ || out == 0 || out + bytes <= share_ || (out == held_[w] && out < share_);
  };
  bool paused = false;
  // Waits shorter than notice_after_s_ (the consumer catching up) say nothing; a longer one may last as long as
  // the slowest worker lags, and the worker hears of it.
  if (!cv_.wait_for(lock, std::chrono::duration<double>(notice_after_s_), fits) && notice_) {
    lock.unlock();
    notice_(worker, true);
    paused = true;
    lock.lock();
  }
  cv_.wait(lock, fits);
  if (aborted_) return false;  // no RESUME: the server is going down, and says why
  outstanding_[w] += bytes;
  ticket->Release();
  ticket->owner_ = this;
  ticket->worker_ = worker;
  ticket->bytes_ = bytes;
  ticket->held_ = false;
  lock.unlock();
  if (paused) notice_(worker, false);
  return true;
}

void Admission::MarkHeld(Ticket* ticket) {
  if (ticket->owner_ != this || ticket->held_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_[static_cast<size_t>(ticket->worker_)] += ticket->bytes_;
    ticket->held_ = true;
  }
  cv_.notify_all();  // the worker may now have nothing but held frames
}

void Admission::Release(Ticket* t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t w = static_cast<size_t>(t->worker_);
    outstanding_[w] -= t->bytes_;
    if (t->held_) held_[w] -= t->bytes_;
  }
  cv_.notify_all();
}

void Admission::Abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
}

uint64_t Admission::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::accumulate(outstanding_.begin(), outstanding_.end(), uint64_t{0});
}

uint64_t Admission::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::accumulate(held_.begin(), held_.end(), uint64_t{0});
}

}  // namespace p3
