#include "p3/log.h"

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace p3 {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::mutex g_write_mu;  // keeps lines from interleaving
const char* kNames[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed); }

void Log(LogLevel level, const std::string& who, const std::string& message) {
  if (!LogEnabled(level)) return;
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(g_write_mu);
  std::fprintf(stderr, "%s %s p3kv.core[%s]: %s\n", stamp, kNames[static_cast<int>(level)], who.c_str(),
               message.c_str());
  std::fflush(stderr);
}

std::string Seconds(double s) {
  char buf[32];
  if (s >= 100 || s == static_cast<double>(static_cast<long long>(s))) {
    std::snprintf(buf, sizeof buf, "%.0f", s);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", s);
  }
  return buf;
}

}  // namespace p3
