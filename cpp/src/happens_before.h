// Internal. Happens-before edges that travel through the network rather than through memory, told to
// ThreadSanitizer (no code at all in other builds).
//
// A worker pushes a slice straight from the caller's gradient and may receive that slice's broadcast straight into
// the same memory (out == grad, as MXNet's in-place pushpull does). The sender's last read of the gradient comes
// before the receiver's first write, because a server broadcasts a slice only after it has received this
// worker's whole push of it: the order is real, but it passes through the sockets, where ThreadSanitizer cannot
// see it. Both sides name the payload's address.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace p3 {

// Sender thread: a frame whose payload was borrowed at `payload` is now entirely on the wire.
inline void PayloadSent([[maybe_unused]] const void* payload) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(payload));
#endif
}

// Receiver thread: a broadcast is about to be written at `dst`.
inline void BroadcastArriving([[maybe_unused]] void* dst) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(dst);
#endif
}

}  // namespace p3
