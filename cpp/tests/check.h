// Internal to the C++ test programs: CHECK counts a failure and goes on (so one run reports every broken
// expectation), and RunTests prints PASS/FAIL per test and the "N passed, M failed" line that the
// tests/test_cpp_*.py wrappers look for.
#pragma once

#include <atomic>
#include <cstdio>
#include <utility>
#include <vector>

namespace p3test {

// Atomic: the whole-job programs CHECK on several threads at once (each worker of in_process_job.h).
inline std::atomic<int>& FailedChecks() {
  static std::atomic<int> failed{0};
  return failed;
}

using Test = std::pair<const char*, void (*)()>;

inline int RunTests(const std::vector<Test>& tests) {
  int passed = 0, failed = 0;
  for (const auto& [name, fn] : tests) {
    const int before = FailedChecks();
    fn();
    const bool ok = FailedChecks() == before;
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    std::fflush(stdout);
    (ok ? passed : failed) += 1;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace p3test

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++p3test::FailedChecks();                                                      \
    }                                                                                \
  } while (0)
