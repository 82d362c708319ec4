// Public. Minimal leveled logging to stderr, one line per record, prefixed with the node's identity.
// The level is process-wide and set once at start-up (the Python layer maps P3_LOG_LEVEL onto it).
// Thread-safe.
#pragma once

#include <string>

namespace p3 {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void Log(LogLevel level, const std::string& who, const std::string& message);

}  // namespace p3
