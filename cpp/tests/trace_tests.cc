// Tests of the node's trace (p3/trace.h): records kept in order, a bounded ring once full that keeps the latest
// records and counts the overwritten ones, nothing recorded when off. Built and run by tests/test_cpp_unit.py.
#include <cstdint>
#include <thread>
#include <vector>

#include "p3/trace.h"
#include "check.h"

namespace {

using p3::Trace;
using p3::TraceEvent;

std::vector<uint64_t> Keys(const Trace& t) {
  std::vector<uint64_t> keys;
  for (const p3::TraceRecord& r : t.Snapshot()) keys.push_back(r.key);
  return keys;
}

void TestKeepsEverythingBelowCapacity() {
  Trace t(true, 8);
  for (uint64_t k = 0; k < 5; ++k) t.Record(TraceEvent::kSend, k, 0, 0, 0, -1);
  CHECK((Keys(t) == std::vector<uint64_t>{0, 1, 2, 3, 4}));
  CHECK(t.dropped() == 0);
}

void TestFullRingKeepsLatestAndCountsDropped() {
  Trace t(true, 4);
  for (uint64_t k = 0; k < 11; ++k) t.Record(TraceEvent::kSend, k, 0, 0, 0, -1);
  CHECK((Keys(t) == std::vector<uint64_t>{7, 8, 9, 10}));  // oldest first
  CHECK(t.dropped() == 7);
  t.Record(TraceEvent::kSend, 11, 0, 0, 0, -1);
  CHECK((Keys(t) == std::vector<uint64_t>{8, 9, 10, 11}));
  CHECK(t.dropped() == 8);
}

void TestManyThreadsStayWithinCapacity() {
  Trace t(true, 1000);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&t, i] {
      for (uint64_t k = 0; k < 10000; ++k) t.Record(TraceEvent::kEnqueue, k, static_cast<uint32_t>(i), 0, 0, -1);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(t.Snapshot().size() == 1000);
  CHECK(t.dropped() == 39000);
}

void TestDisabledRecordsNothing() {
  Trace t(false, 4);
  for (uint64_t k = 0; k < 10; ++k) t.Record(TraceEvent::kSend, k, 0, 0, 0, -1);
  CHECK(t.Snapshot().empty());
  CHECK(t.dropped() == 0);
}

}  // namespace

int main() {
  const std::vector<p3test::Test> tests = {
      {"keeps_everything_below_capacity", TestKeepsEverythingBelowCapacity},
      {"full_ring_keeps_latest_and_counts_dropped", TestFullRingKeepsLatestAndCountsDropped},
      {"many_threads_stay_within_capacity", TestManyThreadsStayWithinCapacity},
      {"disabled_records_nothing", TestDisabledRecordsNothing},
  };
  return p3test::RunTests(tests);
}
