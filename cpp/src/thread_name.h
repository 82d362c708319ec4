// Internal. Names the calling thread, so that per-thread CPU measurements (benchmarks/emulation/thread_usage.py),
// `top -H` and gdb tell p3kv's threads apart from the interpreter's and the framework's (all "python" otherwise).
// The kernel keeps at most 15 bytes; longer names are cut. The virtual GPU's timer thread is deliberately left
// unnamed: the emulation recognises it by the name it inherits from its creator (thread_cap.gpu_side).
#pragma once

#include <pthread.h>

#include <string>

namespace p3 {

inline void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());  // ERANGE past 15 bytes: cut, never refused
}

}  // namespace p3
