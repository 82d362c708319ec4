// Public. Per-command message counters of one node (frames and payload bytes, sent and received).
// Tests use them to prove protocol properties (no pull request, one broadcast per slice per worker).
// Thread-safe (relaxed atomics; read them after the traffic of interest has completed).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "p3/message.h"

namespace p3 {

struct Counters {
  std::array<std::atomic<uint64_t>, kNumCommands> sent{};
  std::array<std::atomic<uint64_t>, kNumCommands> received{};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> rejected_frames{0};  // frames refused by validation

  void CountSent(Command c, uint64_t bytes) {
    sent[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
    bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
  }
  void CountReceived(Command c, uint64_t bytes) {
    received[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
    bytes_received.fetch_add(bytes, std::memory_order_relaxed);
  }
};

}  // namespace p3
