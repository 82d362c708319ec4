// Test-only, preloaded (LD_PRELOAD) into an MXNet ps-lite process: every ps::ZMQVan::SendMsg waits
// P3_TEST_SEND_DELAY_US microseconds first, then sends as before. A slow sender widens the races of a node's
// teardown so they happen every run (tests/test_mxnet_p3_teardown.py). ps-lite lives in libmxnet.so, which Python
// opens privately (RTLD_LOCAL): the real function is looked up in that library (P3_TEST_PS_LIB) by its C++ name.
#include <dlfcn.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace {

using SendFn = int (*)(void*, const void*);
constexpr char kSendMsg[] = "_ZN2ps6ZMQVan7SendMsgERKNS_7MessageE";  // ps::ZMQVan::SendMsg(const ps::Message&)

SendFn RealSend() {
  static SendFn real = [] {
    const char* lib = std::getenv("P3_TEST_PS_LIB");
    void* handle = lib ? dlopen(lib, RTLD_NOLOAD | RTLD_LAZY) : nullptr;
    auto fn = handle ? reinterpret_cast<SendFn>(dlsym(handle, kSendMsg)) : nullptr;
    if (fn == nullptr) {
      std::fprintf(stderr, "slow_ps_send: %s not found in P3_TEST_PS_LIB=%s\n", kSendMsg, lib ? lib : "(unset)");
      std::abort();
    }
    const char* us = std::getenv("P3_TEST_SEND_DELAY_US");
    std::fprintf(stderr, "slow_ps_send: every ps-lite send waits %s us\n", us ? us : "0");
    return fn;
  }();
  return real;
}

}  // namespace

// The mangled name defines the member function itself, so libmxnet.so's calls bind here first.
extern "C" int _ZN2ps6ZMQVan7SendMsgERKNS_7MessageE(void* van, const void* msg) {
  const SendFn real = RealSend();
  const char* us_text = std::getenv("P3_TEST_SEND_DELAY_US");
  const long us = us_text ? std::atol(us_text) : 0;
  timespec delay{us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&delay, &delay) != 0 && errno == EINTR) {
  }
  return real(van, msg);
}
