// Unit tests of the server's pure parts: the aggregation state machine (init, push, held pushes, completion,
// update, broadcast, rejection, copy on write), the memory bound's admission, the buffer pool and the per-key
// step cache of SliceOptimizer. No network, no threads except where admission must block.
// Built and run by tests/test_cpp_server_parts.py.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "admission.h"
#include "aggregator.h"
#include "buffer_pool.h"
#include "p3/slice_optimizer.h"
#include "check.h"

namespace {

using namespace p3;

// What the aggregator asked the server to do, in order.
struct Recorder {
  struct Sent {
    uint64_t key;
    uint32_t slice;
    uint64_t iteration;
    int32_t priority;
    std::vector<float> value;
    std::shared_ptr<std::vector<char>> buffer;  // kept only when `keep` (a send still in flight)
    const char* data = nullptr;                 // where the broadcast value lay
  };
  std::vector<Sent> broadcasts;
  std::vector<std::pair<int, std::string>> rejects;
  std::vector<UpdateRequest> updates;
  std::vector<std::vector<float>> aggregates;
  int held = 0;
  bool keep = false;
  Status update_status;
  bool use_update = true;

  Aggregator::Hooks Hooks() {
    Aggregator::Hooks h;
    if (use_update) {
      h.update = [this](const UpdateRequest& r) {
        updates.push_back(r);
        const float* g = static_cast<const float*>(r.aggregated);
        aggregates.emplace_back(g, g + r.count);
        if (!update_status.ok()) return update_status;
        float* v = static_cast<float*>(r.value);
        for (uint64_t i = 0; i < r.count; ++i) v[i] -= 0.5f * g[i];  // plain SGD, lr 0.5
        return Status::Ok();
      };
    }
    h.broadcast = [this](const SliceEntry& s, int32_t priority) {
      const float* v = reinterpret_cast<const float*>(s.value->data());
      broadcasts.push_back(Sent{s.key, s.slice, s.iteration, priority, std::vector<float>(v, v + s.count),
                                keep ? s.value : nullptr, s.value->data()});
    };
    h.reject = [this](int w, const Header&, const std::string& why) { rejects.emplace_back(w, why); };
    h.held = [this](Frame*) { ++held; };
    return h;
  }
};

BufferPool g_pool(1 << 20);

Frame MakeFrame(Command c, int sender, uint64_t key, uint32_t slice, uint64_t iteration, std::vector<float> data,
                uint64_t count = 0, int32_t priority = 0) {
  Frame f;
  f.header.command = c;
  f.header.sender = sender;
  f.header.key = key;
  f.header.slice = slice;
  f.header.iteration = iteration;
  f.header.priority = priority;
  f.header.count = count ? count : data.size();
  f.header.dtype = DType::kFloat32;
  f.header.payload_bytes = data.size() * sizeof(float);
  f.payload = g_pool.Take(f.header.payload_bytes);
  if (!data.empty()) std::memcpy(f.payload.data(), data.data(), f.header.payload_bytes);
  return f;
}

// Inits key 7 slice 0 (3 elements) on two workers with value {1, 2, 3}.
void InitTwo(Aggregator* a) {
  a->OnFrame(MakeFrame(Command::kInit, 1, 7, 0, 0, {}, 3));
  a->OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, {1, 2, 3}));
}

void TestInitBroadcastsWorkerZerosValue() {
  Recorder r;
  Aggregator a(2, r.Hooks());
  a.OnFrame(MakeFrame(Command::kInit, 1, 7, 0, 0, {}, 3, -4));
  CHECK(r.broadcasts.empty());  // not before every worker declared the slice
  a.OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, {1, 2, 3}, 0, -4));
  CHECK(r.broadcasts.size() == 1);
  CHECK(r.broadcasts[0].iteration == 0 && r.broadcasts[0].priority == -4);
  CHECK((r.broadcasts[0].value == std::vector<float>{1, 2, 3}));
  CHECK(r.updates.empty() && r.rejects.empty());
}

void TestPushesSumThenUpdateThenBroadcast() {
  Recorder r;
  Aggregator a(2, r.Hooks());
  InitTwo(&a);
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}, 0, -2));
  CHECK(r.updates.empty());
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {3, 5, 7}, 0, -2));
  CHECK(r.updates.size() == 1);
  CHECK((r.aggregates[0] == std::vector<float>{4, 6, 8}));
  CHECK(r.updates[0].iteration == 1 && r.updates[0].key == 7 && r.updates[0].key_slices == 1);
  CHECK(r.broadcasts.size() == 2);
  CHECK((r.broadcasts[1].value == std::vector<float>{-1, -1, -1}));  // {1,2,3} - 0.5 * {4,6,8}
  CHECK(r.broadcasts[1].iteration == 1 && r.broadcasts[1].priority == -2);
}

void TestAggregateOnlyBroadcastsTheSum() {
  Recorder r;
  r.use_update = false;
  Aggregator a(3, r.Hooks());
  a.OnFrame(MakeFrame(Command::kInit, 2, 1, 0, 0, {}, 2));
  a.OnFrame(MakeFrame(Command::kInit, 1, 1, 0, 0, {}, 2));
  a.OnFrame(MakeFrame(Command::kInit, 0, 1, 0, 0, {0, 0}));
  for (int w : {2, 0, 1}) a.OnFrame(MakeFrame(Command::kPush, w, 1, 0, 1, {float(w), 1}));
  CHECK(r.broadcasts.size() == 2);
  CHECK((r.broadcasts[1].value == std::vector<float>{3, 3}));
}

void TestAggregateOnlySwapsTheSumIntoTheValueUnlessASendHoldsIt() {
  Recorder r;
  r.use_update = false;
  Aggregator a(2, r.Hooks());
  InitTwo(&a);  // the value {1, 2, 3}
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {3, 5, 7}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 2, {0, 0, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 2, {1, 0, 0}));
  CHECK(r.broadcasts.size() == 3);
  CHECK((r.broadcasts[1].value == std::vector<float>{4, 6, 8}));
  // The swapped-out accumulator held the old value: the next iteration's first push replaced it, not added to it.
  CHECK((r.broadcasts[2].value == std::vector<float>{1, 0, 1}));
  // No copy: the sum's buffer became the value, and the old value's buffer the next accumulator.
  CHECK(a.value_copies() == 0);
  CHECK(r.broadcasts[1].data != r.broadcasts[0].data && r.broadcasts[2].data == r.broadcasts[0].data);
  r.keep = true;  // from iteration 3 on, each broadcast stays "in flight"
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 3, {2, 2, 2}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 3, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 4, {5, 5, 5}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 4, {1, 2, 3}));
  CHECK(a.value_copies() == 1);  // iteration 4 could not take the buffer iteration 3's send holds
  const float* sent = reinterpret_cast<const float*>(r.broadcasts[3].buffer->data());
  CHECK(sent[0] == 3.0f && sent[1] == 3.0f && sent[2] == 3.0f);  // what iteration 3's send reads is unchanged
  CHECK((r.broadcasts[4].value == std::vector<float>{6, 7, 8}));
  CHECK(r.broadcasts[3].buffer != r.broadcasts[4].buffer);
}

void TestLaterIterationIsHeldUntilItsTurn() {
  Recorder r;
  Aggregator a(2, r.Hooks());
  InitTwo(&a);
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 2, {10, 10, 10}));  // worker 0 runs ahead
  CHECK(r.held == 1 && a.held_frames() == 1 && r.updates.empty());
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {1, 1, 1}));
  CHECK(r.updates.size() == 1 && a.held_frames() == 0);  // iteration 1 done; the held push now counts for 2
  CHECK((r.aggregates[0] == std::vector<float>{2, 2, 2}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 2, {2, 2, 2}));
  CHECK(r.updates.size() == 2 && r.updates[1].iteration == 2);
  CHECK((r.aggregates[1] == std::vector<float>{12, 12, 12}));  // iterations never mix
  CHECK(r.rejects.empty());
}

void TestPushesBeforeInitCompletesAreHeld() {
  Recorder r;
  Aggregator a(2, r.Hooks());
  a.OnFrame(MakeFrame(Command::kInit, 1, 7, 0, 0, {}, 3));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {1, 1, 1}));
  CHECK(r.held == 1);
  a.OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, {1, 2, 3}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}));
  CHECK(r.updates.size() == 1 && r.rejects.empty());
}

void TestBadRequestsAreRejectedWithReasons() {
  Recorder r;
  Aggregator a(2, r.Hooks());
  a.OnFrame(MakeFrame(Command::kPush, 0, 9, 0, 1, {1}));
  CHECK(r.rejects.size() == 1 && r.rejects[0].second.find("never initialised") != std::string::npos);
  InitTwo(&a);
  a.OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, {1, 2, 3}));
  CHECK(r.rejects.size() == 2 && r.rejects[1].second.find("already initialised") != std::string::npos);
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {1, 1, 1}));
  CHECK(r.rejects.size() == 3 && r.rejects[2].second.find("second push") != std::string::npos);
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}));
  CHECK(r.rejects.size() == 4 && r.rejects[3].second.find("already complete") != std::string::npos);
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 2, {1, 1}));  // wrong size
  CHECK(r.rejects.size() == 5 && r.rejects[4].second.find("same shape") != std::string::npos);
  CHECK(r.updates.size() == 1);
}

void TestWorkersDisagreeingOnShapeFailTheSliceForAll() {
  Recorder r;
  Aggregator a(3, r.Hooks());
  a.OnFrame(MakeFrame(Command::kInit, 1, 7, 0, 0, {}, 3));
  a.OnFrame(MakeFrame(Command::kInit, 2, 7, 0, 0, {}, 4));
  // Worker 2 is told, and so is worker 1, which declared the slice and would otherwise wait for ever.
  CHECK(r.rejects.size() == 2 && r.rejects[0].first == 2 && r.rejects[1].first == 1);
  a.OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, {1, 2, 3}));
  CHECK(r.rejects.size() == 3 && r.rejects[2].first == 0 && r.broadcasts.empty());
}

void TestFailedUpdateRejectsEveryWorkerAndKeepsHeldPushes() {
  Recorder r;
  Aggregator a(2, r.Hooks());
  InitTwo(&a);
  r.update_status = Status::Rejected("boom");
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 2, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {1, 1, 1}));
  CHECK(r.rejects.size() == 2 && r.rejects[0].second.find("boom") != std::string::npos);
  CHECK(r.broadcasts.size() == 1);  // only the init
  CHECK(a.held_frames() == 0);      // the held push was replayed, not stranded
  r.update_status = Status::Ok();
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 2, {1, 1, 1}));
  CHECK(r.broadcasts.size() == 2 && r.broadcasts[1].iteration == 2);
}

void TestBroadcastSharesTheValueAndCopiesOnlyWhileASendHoldsIt() {
  Recorder r;
  Aggregator a(1, r.Hooks());
  a.OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, {1, 2, 3}));
  r.broadcasts.clear();
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {2, 2, 2}));
  CHECK(a.value_copies() == 0);  // no send held the value: updated in place
  r.keep = true;                 // now the broadcast of iteration 2 stays "in flight"
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 2, {2, 2, 2}));
  CHECK(a.value_copies() == 0);
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 3, {2, 2, 2}));
  CHECK(a.value_copies() == 1);  // iteration 3 could not write into the buffer iteration 2's send holds
  const float* sent = reinterpret_cast<const float*>(r.broadcasts[1].buffer->data());
  CHECK(sent[0] == -1.0f && r.broadcasts[2].value[0] == -2.0f);  // 1-1-1, then -1-1
  CHECK(r.broadcasts[1].buffer != r.broadcasts[2].buffer);
}

void TestKeySlicesCountsTheKeysSlicesHere() {
  Recorder r;
  Aggregator a(1, r.Hooks());
  a.OnFrame(MakeFrame(Command::kInit, 0, 5, 0, 0, {1}));
  a.OnFrame(MakeFrame(Command::kInit, 0, 5, 3, 0, {1}));
  a.OnFrame(MakeFrame(Command::kInit, 0, 6, 1, 0, {1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 5, 3, 1, {1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 6, 1, 1, {1}));
  CHECK(r.updates.size() == 2 && r.updates[0].key_slices == 2 && r.updates[1].key_slices == 1);
  CHECK(a.num_slices() == 3);
}

void TestFloat16IsSummedInFloat32AndRounded() {
  Recorder r;
  Aggregator::Hooks h;
  std::vector<uint16_t> seen;
  h.update = [&](const UpdateRequest& u) {
    const uint16_t* g = static_cast<const uint16_t*>(Aggregated(u));
    seen.assign(g, g + u.count);
    return Status::Ok();
  };
  h.broadcast = [](const SliceEntry&, int32_t) {};
  h.reject = [&](int, const Header&, const std::string& why) { r.rejects.emplace_back(0, why); };
  Aggregator a(2, h);
  auto half = [](std::vector<float> v) {
    Frame f;
    f.header.dtype = DType::kFloat16;
    f.header.count = v.size();
    f.header.payload_bytes = v.size() * 2;
    f.payload = g_pool.Take(f.header.payload_bytes);
    uint16_t* p = reinterpret_cast<uint16_t*>(f.payload.data());
    for (size_t i = 0; i < v.size(); ++i) p[i] = FloatToHalf(v[i]);
    return f;
  };
  for (int w : {1, 0}) {
    Frame f = half(w == 0 ? std::vector<float>{0, 0} : std::vector<float>{});
    f.header.command = Command::kInit;
    f.header.sender = w;
    f.header.count = 2;
    a.OnFrame(std::move(f));
  }
  for (int w : {0, 1}) {
    Frame f = half({2048, 0.5f});
    f.header.command = Command::kPush;
    f.header.sender = w;
    f.header.iteration = 1;
    a.OnFrame(std::move(f));
  }
  CHECK(r.rejects.empty() && seen.size() == 2);
  CHECK(HalfToFloat(seen[0]) == 4096.0f && HalfToFloat(seen[1]) == 1.0f);
}

void TestAdmissionSharesTheBoundPerWorker() {
  Admission adm(100, 2);  // 50 bytes per worker
  Admission::Ticket a, b, c;
  CHECK(adm.Admit(0, 40, &a));
  CHECK(adm.Admit(1, 50, &b));  // worker 1's share is its own
  // Worker 0 is over its share: its receiver waits until the consumer is done with the first frame.
  auto waiting = std::async(std::launch::async, [&] { return adm.Admit(0, 20, &c); });
  CHECK(waiting.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  a.Release();
  CHECK(waiting.wait_for(std::chrono::seconds(5)) == std::future_status::ready && waiting.get());
  CHECK(adm.outstanding() == 70);
  // A frame larger than the whole share is admitted alone.
  Admission::Ticket big;
  b.Release();
  CHECK(adm.Admit(1, 500, &big));
  big.Release();
  c.Release();
  CHECK(adm.outstanding() == 0);
}

void TestAdmissionReadsAWorkerWhoseHeldFramesAreUnderItsShare() {
  Admission adm(100, 2);  // 50 bytes per worker
  Admission::Ticket held, next;
  CHECK(adm.Admit(0, 30, &held));
  adm.MarkHeld(&held);  // waits for worker 1; the next frame may be the one that releases it
  auto admitted = std::async(std::launch::async, [&] { return adm.Admit(0, 50, &next); });
  CHECK(admitted.wait_for(std::chrono::seconds(5)) == std::future_status::ready && admitted.get());
  // Abort wakes a waiting receiver and refuses from then on.
  Admission::Ticket blocked;
  auto refused = std::async(std::launch::async, [&] { return adm.Admit(0, 50, &blocked); });
  CHECK(refused.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout);
  adm.Abort();
  CHECK(refused.wait_for(std::chrono::seconds(5)) == std::future_status::ready && !refused.get());
}

void TestHeldFramesCountAgainstTheWorkersShare() {
  // A worker that pushes far ahead: every frame is held, and once its held bytes reach its share it is no
  // longer read until the others catch up (before, a worker with nothing but held frames was never blocked).
  Admission adm(100, 2);  // 50 bytes per worker
  std::vector<Admission::Ticket> held(3);
  for (Admission::Ticket& t : held) {
    CHECK(adm.Admit(0, 20, &t));
    adm.MarkHeld(&t);
  }
  CHECK(adm.outstanding() == 60 && adm.held() == 60);  // the third was admitted while 40 < 50 were held
  Admission::Ticket fourth;
  auto waiting = std::async(std::launch::async, [&] { return adm.Admit(0, 20, &fourth); });
  CHECK(waiting.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  CHECK(adm.outstanding() <= adm.share() + 20);
  // Worker 1 is read meanwhile (its own share): its push completes an iteration and releases a held frame.
  Admission::Ticket other;
  CHECK(adm.Admit(1, 50, &other));
  other.Release();
  held[0].Release();
  held[1].Release();
  CHECK(waiting.wait_for(std::chrono::seconds(5)) == std::future_status::ready && waiting.get());
  fourth.Release();
  held[2].Release();
  CHECK(adm.outstanding() == 0 && adm.held() == 0);
}

void TestAggregatorHeldFramesStayWithinTheBound() {
  // Through the aggregator: worker 0 pushes iterations 1..10 of a slice while worker 1 has pushed nothing; the
  // receiver (here: this loop) admits each frame before it reaches the aggregator, as the server's does. The
  // frames held at any time stay within worker 0's share plus one frame.
  Admission adm(2 * 120, 2);  // 120 bytes per worker: 10 floats (40 bytes) per push, so 3 held, then a 4th
  Recorder r;
  Aggregator::Hooks hooks = r.Hooks();
  hooks.held = [&](Frame* f) { adm.MarkHeld(&f->ticket); };
  Aggregator a(2, hooks);
  a.OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, std::vector<float>(10, 0.0f)));
  a.OnFrame(MakeFrame(Command::kInit, 1, 7, 0, 0, {}, 10));
  std::atomic<int> admitted{0};
  std::mutex mu;
  std::vector<Frame> inbox;
  std::thread receiver([&] {
    for (uint64_t it = 1; it <= 10; ++it) {
      Frame f = MakeFrame(Command::kPush, 0, 7, 0, it, std::vector<float>(10, 1.0f));
      if (!adm.Admit(0, 40, &f.ticket)) return;
      std::lock_guard<std::mutex> lock(mu);
      inbox.push_back(std::move(f));
      admitted.fetch_add(1);
    }
  });
  // The consumer: aggregates whatever the receiver admitted, until the receiver is blocked.
  auto consume = [&] {
    std::vector<Frame> now;
    {
      std::lock_guard<std::mutex> lock(mu);
      now.swap(inbox);
    }
    for (Frame& f : now) a.OnFrame(std::move(f));
  };
  for (int i = 0; i < 50; ++i) {
    consume();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(admitted.load() < 10);  // blocked: before, all 10 were admitted (and held)
  CHECK(adm.outstanding() <= adm.share() + 40);
  CHECK(a.held_frames() <= 4);
  // Worker 1 catches up iteration by iteration; worker 0's frames flow again and every iteration completes.
  for (uint64_t it = 1; it <= 10; ++it) {
    a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, it, std::vector<float>(10, 2.0f)));
    const auto start = std::chrono::steady_clock::now();
    while (r.updates.size() < it && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
      consume();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      CHECK(adm.outstanding() <= adm.share() + 40);
    }
  }
  receiver.join();
  CHECK(r.updates.size() == 10 && r.rejects.empty() && adm.outstanding() == 0);
  for (const std::vector<float>& sum : r.aggregates) CHECK(sum == std::vector<float>(10, 3.0f));
}

void TestInitBeyondTheSliceBudgetIsRejectedBeforeAllocation() {
  Recorder r;
  Aggregator a(2, r.Hooks(), /*slice_budget_bytes=*/1000);  // 3 floats: 12 value + 12 accumulator bytes
  a.OnFrame(MakeFrame(Command::kInit, 1, 99, 0, 0, {}, 1u << 26));  // a 64-byte INIT claiming 2^26 elements
  CHECK(r.rejects.size() == 1 && r.rejects[0].first == 1);
  CHECK(r.rejects[0].second.find("P3_SERVER_SLICE_BYTES") != std::string::npos);
  CHECK(a.num_slices() == 0 && a.slice_bytes() == 0);
  InitTwo(&a);  // a slice within the budget still works
  CHECK(a.num_slices() == 1 && a.slice_bytes() == 24 && r.broadcasts.size() == 1);
}

void TestBufferPoolFillGrowsWithTheBytesThatArrive() {
  BufferPool pool(1000);
  const size_t claimed = 8 * BufferPool::kEagerBytes;
  size_t offered = 0;
  BufferPool::Buffer b;
  // The "socket" delivers 1.5 eager buffers, then fails: at most two eager sizes were ever asked for.
  Status st = pool.Fill(claimed, [&](char*, size_t n) {
    offered += n;
    return offered > BufferPool::kEagerBytes * 3 / 2 ? Status::IoError("truncated") : Status::Ok();
  }, &b);
  CHECK(!st.ok() && offered <= 2 * BufferPool::kEagerBytes && b.data() == nullptr);
  std::vector<char> src(3 * BufferPool::kEagerBytes + 5);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7);
  size_t at = 0;
  st = pool.Fill(src.size(), [&](char* dst, size_t n) {
    std::memcpy(dst, src.data() + at, n);
    at += n;
    return Status::Ok();
  }, &b);
  CHECK(st.ok() && b.size() == src.size() && std::memcmp(b.data(), src.data(), src.size()) == 0);
}

void TestBufferPoolReusesBuffersBySize() {
  BufferPool pool(1000);
  char* first;
  {
    BufferPool::Buffer b = pool.Take(400);
    first = b.data();
  }
  BufferPool::Buffer again = pool.Take(400);
  CHECK(again.data() == first && pool.reused() == 1 && pool.allocated() == 1);
  BufferPool::Buffer other = pool.Take(300);  // another size: a new buffer
  CHECK(pool.allocated() == 2);
  {
    BufferPool::Buffer big = pool.Take(2000);  // beyond what the pool keeps: freed, not kept
  }
  BufferPool::Buffer big2 = pool.Take(2000);
  CHECK(pool.allocated() == 4);
}

void TestSliceOptimizerWithoutKernelAggregatesOrCallsTheFunction() {
  SliceOptimizer opt;
  std::vector<float> value = {1, 2}, sum = {4, 6};
  UpdateRequest r{1, 0, 0, 2, 1, DType::kFloat32, sum.data(), value.data(), 1};
  CHECK(opt.Update(r).ok());
  CHECK((value == std::vector<float>{4, 6}));  // aggregate only
  int calls = 0;
  CHECK(opt.UseFunction([&](const UpdateRequest&) {
          ++calls;
          return Status::Ok();
        }).ok());
  CHECK(opt.Update(r).ok() && calls == 1);
}

void TestSliceOptimizerAsksForTheStepOncePerKeyAndIteration() {
  SliceOptimizer opt;
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kSgd;
  spec.momentum = 0.9;
  std::vector<uint64_t> asked;
  CHECK(opt.UseKernel(spec, [&](uint64_t key, StepParams* step) {
          asked.push_back(key);
          step->lr = 0.5;
          return Status::Ok();
        }).ok());
  // Key 3 has three slices here, key 4 one; the slices of key 3 complete iterations out of step with each other.
  std::vector<float> v[4] = {{1, 1}, {1, 1}, {1, 1}, {1, 1}};
  std::vector<float> g = {2, 2};
  auto update = [&](uint64_t key, uint32_t slice, uint64_t iteration, uint32_t key_slices) {
    UpdateRequest r{key, slice, 0, 2, iteration, DType::kFloat32, g.data(), v[key == 4 ? 3 : slice].data(),
                    key_slices};
    CHECK(opt.Update(r).ok());
  };
  update(3, 0, 1, 3);
  update(4, 0, 1, 1);
  update(3, 1, 1, 3);
  update(3, 0, 2, 3);  // slice 0 runs ahead to iteration 2 before slice 2 has done iteration 1
  update(3, 2, 1, 3);
  update(3, 1, 2, 3);
  update(3, 2, 2, 3);
  CHECK((asked == std::vector<uint64_t>{3, 4, 3}));  // key 3: once for iteration 1, once for 2
  CHECK(opt.step_calls() == 3);
  // SGD momentum 0.9, lr 0.5: mom = -1 then -1.9; weight 1 -> 0 -> -1.9 on every slice of key 3.
  for (int s = 0; s < 3; ++s) CHECK(v[s][0] == -1.9f && v[s][1] == -1.9f);
  CHECK(v[3][0] == 0.0f);
  const SliceOptimizer::States* st = opt.StatesOf(3, 2);
  CHECK(st != nullptr && st->arrays.size() == 1 && st->count == 2);
}

bool Names(const std::string& why, const std::string& what) { return why.find(what) != std::string::npos; }

void TestAWorkerThatLeftAfterTheLastIterationStrandsNothing() {
  Recorder r;
  std::vector<std::string> stranded;
  Aggregator::Hooks hooks = r.Hooks();
  hooks.stranded = [&](const std::string& why) { stranded.push_back(why); };
  Aggregator a(2, hooks);
  InitTwo(&a);
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 1, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 1, {1, 1, 1}));
  // Worker 1 finished iteration 2 and closed while worker 0's push of the same iteration is still on its way.
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 2, {1, 1, 1}));
  a.WorkerLeft(1);
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 2, {1, 1, 1}));
  CHECK(r.broadcasts.size() == 3 && r.broadcasts[2].iteration == 2);
  CHECK(r.rejects.empty() && stranded.empty());
}

void TestAWorkerThatLeftEarlyFailsPendingHeldAndLaterPushes() {
  Recorder r;
  std::vector<std::string> stranded;
  Aggregator::Hooks hooks = r.Hooks();
  hooks.stranded = [&](const std::string& why) { stranded.push_back(why); };
  Aggregator a(3, hooks);
  a.OnFrame(MakeFrame(Command::kInit, 2, 7, 0, 0, {}, 3));
  a.OnFrame(MakeFrame(Command::kInit, 1, 7, 0, 0, {}, 3));
  a.OnFrame(MakeFrame(Command::kInit, 0, 7, 0, 0, {1, 2, 3}));
  for (int w : {0, 1, 2}) a.OnFrame(MakeFrame(Command::kPush, w, 7, 0, 1, {1, 1, 1}));
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 2, {1, 1, 1}));  // pending: worker 2 will never push it
  a.OnFrame(MakeFrame(Command::kPush, 0, 7, 0, 3, {1, 1, 1}));  // held for iteration 3
  CHECK(a.held_frames() == 1 && r.rejects.empty());
  a.WorkerLeft(2);  // after its iteration 1
  CHECK(r.rejects.size() == 2 && a.held_frames() == 0);
  for (const auto& [w, why] : r.rejects) {
    CHECK(w == 0);
    CHECK(Names(why, "worker 2 has left the job") && Names(why, "after its iteration 1 of key 7"));
  }
  CHECK(Names(r.rejects[0].second, "iteration 2 of key 7"));
  CHECK(Names(r.rejects[1].second, "iteration 3 of key 7"));
  CHECK(stranded.size() == 2);
  a.OnFrame(MakeFrame(Command::kPush, 1, 7, 0, 2, {1, 1, 1}));  // a later push is refused at once
  CHECK(r.rejects.size() == 3 && r.rejects[2].first == 1 && Names(r.rejects[2].second, "worker 2 has left"));
  CHECK(r.broadcasts.size() == 2 && r.updates.size() == 1);  // init and iteration 1 only
  // A key that worker 2 never declared can never initialise.
  a.OnFrame(MakeFrame(Command::kInit, 0, 8, 0, 0, {1}));
  CHECK(r.rejects.size() == 4 && Names(r.rejects[3].second, "without declaring key 8") &&
        Names(r.rejects[3].second, "can never initialise"));
  CHECK(stranded.size() == 4);
}

}  // namespace

#define RUN(t) {#t, t}

int main() {
  return p3test::RunTests({
      RUN(TestInitBroadcastsWorkerZerosValue),
      RUN(TestPushesSumThenUpdateThenBroadcast),
      RUN(TestAggregateOnlyBroadcastsTheSum),
      RUN(TestAggregateOnlySwapsTheSumIntoTheValueUnlessASendHoldsIt),
      RUN(TestLaterIterationIsHeldUntilItsTurn),
      RUN(TestPushesBeforeInitCompletesAreHeld),
      RUN(TestBadRequestsAreRejectedWithReasons),
      RUN(TestWorkersDisagreeingOnShapeFailTheSliceForAll),
      RUN(TestFailedUpdateRejectsEveryWorkerAndKeepsHeldPushes),
      RUN(TestBroadcastSharesTheValueAndCopiesOnlyWhileASendHoldsIt),
      RUN(TestKeySlicesCountsTheKeysSlicesHere),
      RUN(TestFloat16IsSummedInFloat32AndRounded),
      RUN(TestAdmissionSharesTheBoundPerWorker),
      RUN(TestAdmissionReadsAWorkerWhoseHeldFramesAreUnderItsShare),
      RUN(TestHeldFramesCountAgainstTheWorkersShare),
      RUN(TestAggregatorHeldFramesStayWithinTheBound),
      RUN(TestBufferPoolReusesBuffersBySize),
      RUN(TestInitBeyondTheSliceBudgetIsRejectedBeforeAllocation),
      RUN(TestBufferPoolFillGrowsWithTheBytesThatArrive),
      RUN(TestSliceOptimizerWithoutKernelAggregatesOrCallsTheFunction),
      RUN(TestSliceOptimizerAsksForTheStepOncePerKeyAndIteration),
      RUN(TestAWorkerThatLeftAfterTheLastIterationStrandsNothing),
      RUN(TestAWorkerThatLeftEarlyFailsPendingHeldAndLaterPushes),
  });
}
