// Unit tests of the gatekeeper's refusal log budget (cpp/src/refusal_log.h): a flooding address spends its own
// budget and the shared one but never another address's; counts of unlogged refusals are reported per source;
// the table of sources stays bounded. No sockets, no threads, time passed in.
#include <string>

#include "check.h"
#include "refusal_log.h"

namespace {

using namespace p3;
using Clock = RefusalLog::Clock;

int Logged(RefusalLog* log, const std::string& source, int refusals, Clock::time_point now) {
  int logged = 0;
  for (int i = 0; i < refusals; ++i) logged += log->Refused(source, now).log ? 1 : 0;
  return logged;
}

void AFloodDoesNotHideAnotherAddress() {
  const auto t0 = Clock::now();
  RefusalLog log(t0);
  // The flood spends its own reserve and the whole shared budget...
  const int flood = Logged(&log, "127.0.0.2", 1000, t0);
  CHECK(flood == static_cast<int>(RefusalLog::kSourceBurst + RefusalLog::kSharedBurst));
  CHECK(!log.Refused("127.0.0.2", t0).log);
  // ...yet another address is still named, up to its own reserve, at the same instant.
  CHECK(Logged(&log, "127.0.0.1", 3, t0) == 3);
  CHECK(Logged(&log, "127.0.0.1", 100, t0) == static_cast<int>(RefusalLog::kSourceBurst) - 3);
}

void UnloggedRefusalsAreCountedPerSourceAndReported() {
  const auto t0 = Clock::now();
  RefusalLog log(t0);
  Logged(&log, "10.0.0.9", 1000, t0);  // 790 unlogged
  Logged(&log, "10.0.0.8", 20, t0);    // its own 10, then nothing: 10 unlogged
  // One second later each source has one token of its own again: the next line reports its own count.
  const auto t1 = t0 + std::chrono::seconds(1);
  const RefusalLog::Decision flood = log.Refused("10.0.0.9", t1);
  CHECK(flood.log && !flood.others);
  CHECK(flood.unlogged == 1000 - static_cast<uint64_t>(RefusalLog::kSourceBurst + RefusalLog::kSharedBurst));
  const RefusalLog::Decision other = log.Refused("10.0.0.8", t1);
  CHECK(other.log && other.unlogged == 10);
  const RefusalLog::Decision again = log.Refused("10.0.0.8", t1 + std::chrono::seconds(1));
  CHECK(again.log && again.unlogged == 0);
}

void TheTableOfSourcesIsBounded() {
  const auto t0 = Clock::now();
  RefusalLog log(t0);
  for (size_t i = 0; i < 10 * RefusalLog::kSources; ++i) {
    const std::string source = "127.1." + std::to_string(i / 256) + "." + std::to_string(i % 256);
    Logged(&log, source, static_cast<int>(RefusalLog::kSourceBurst), t0);  // each spends its reserve: not idle
  }
  CHECK(log.tracked_sources() == RefusalLog::kSources);
  // Sources without a place share the shared budget, and their count says so.
  const std::string late = "127.2.0.1";
  while (log.Refused(late, t0).log) {
  }
  const RefusalLog::Decision d = log.Refused(late, t0 + std::chrono::seconds(1));
  CHECK(d.log && d.others && d.unlogged >= 1);
  // Once the reserves have refilled, idle sources make room for new ones.
  const auto later = t0 + std::chrono::seconds(60);
  const RefusalLog::Decision fresh = log.Refused("127.3.0.1", later);
  CHECK(fresh.log && !fresh.others && fresh.unlogged == 0);
  CHECK(log.tracked_sources() == RefusalLog::kSources);
}

}  // namespace

int main() {
  return p3test::RunTests({
      {"a flood does not hide another address", AFloodDoesNotHideAnotherAddress},
      {"unlogged refusals are counted per source and reported", UnloggedRefusalsAreCountedPerSourceAndReported},
      {"the table of sources is bounded", TheTableOfSourcesIsBounded},
  });
}
