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
// A duration as messages spell it: "3", "0.8", "2.5" (seconds, without trailing zeros; never rounded to 0).
std::string Seconds(double s);

}  // namespace p3
