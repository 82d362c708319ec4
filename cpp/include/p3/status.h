// Public. Status: the result of an operation that can fail at run time. Travels through callbacks and
// becomes a Python exception (P3Error / P3TimeoutError / ConfigError / UnsupportedRequest) in the bindings.
#pragma once

#include <functional>
#include <string>
#include <utility>

namespace p3 {

class Status {
 public:
  // Travels in REPLY/ERROR headers: append only (the decoder refuses a code past the last).
  enum class Code { kOk, kInvalid, kIoError, kPeerLost, kTimeout, kRejected, kAborted, kInterrupted, kUnsupported };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status Invalid(std::string m) { return Status(Code::kInvalid, std::move(m)); }
  static Status IoError(std::string m) { return Status(Code::kIoError, std::move(m)); }
  static Status PeerLost(std::string m) { return Status(Code::kPeerLost, std::move(m)); }
  static Status Timeout(std::string m) { return Status(Code::kTimeout, std::move(m)); }
  static Status Rejected(std::string m) { return Status(Code::kRejected, std::move(m)); }
  static Status Aborted(std::string m) { return Status(Code::kAborted, std::move(m)); }
  // A blocking wait ended because its InterruptCheck said so (Ctrl-C): Python raises KeyboardInterrupt.
  static Status Interrupted(std::string m) { return Status(Code::kInterrupted, std::move(m)); }
  // The peer has no handler for what was asked (a server without a request handler got a control request).
  static Status Unsupported(std::string m) { return Status(Code::kUnsupported, std::move(m)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // The same status with `context` prepended to its message ("context: message").
  Status WithContext(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message_);
  }

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// Polled (about every 200 ms, with no lock held) by long blocking waits so that the caller can abort them,
// e.g. on Ctrl-C in Python. Returning true ends the wait with Interrupted.
using InterruptCheck = std::function<bool()>;

}  // namespace p3
