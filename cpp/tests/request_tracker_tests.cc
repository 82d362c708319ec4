// Unit tests of the worker's request tracker (cpp/src/request_tracker.h): completion once every broadcast slice
// landed, broadcasts checked against the slices sent, rejections (at once, after the last writer, or once the
// sender let go of every slice still queued), the job's failure (no new writes, every callback handed back once
// nothing touches the buffers), control requests. No sockets, no threads.
// Built and run by tests/test_cpp_worker_parts.py.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "frame_builder.h"
#include "p3/slicer.h"
#include "request_tracker.h"

namespace {

using namespace p3;

// Key 7: 5 float32 elements in slices of 2 over 2 servers (slices 0 and 2 on server 0, slice 1 on server 1).
constexpr uint64_t kKey = 7;

RequestTracker::Key FiveFloats() {
  uint64_t round_robin = 0;
  return RequestTracker::Key{"layer0_weight", DType::kFloat32, 5, SliceKey(5, 2, 2, &round_robin)};
}

// The broadcast header a server would send for slice `index` of `k` in `iteration`.
Header BroadcastOf(const RequestTracker::Key& k, uint32_t index, uint64_t iteration) {
  const Slice& s = k.slices[index];
  return SliceFrame(Command::kBroadcast, s.server, SliceId{kKey, s.index, s.offset, s.count, k.dtype, iteration}, 0,
                    s.count * sizeof(float));
}

// Records how often a callback ran and with what.
struct Calls {
  int count = 0;
  Status last;
  RequestTracker::Callback Callback() {
    return [this](const Status& st) {
      ++count;
      last = st;
    };
  }
};

// Lands one broadcast slice: StartWrite, copy `value` into place, EndWrite.
RequestTracker::Completion Land(RequestTracker* t, const RequestTracker::Key& k, uint32_t index, uint64_t iteration,
                                float value) {
  const Header h = BroadcastOf(k, index, iteration);
  char* dst = nullptr;
  CHECK(t->StartWrite(k.slices[index].server, h, &dst).ok());
  CHECK(dst != nullptr);
  if (dst == nullptr) return {};
  CHECK(t->writers() == 1);
  for (uint64_t i = 0; i < h.count; ++i) std::memcpy(dst + i * sizeof(float), &value, sizeof(float));
  return t->EndWrite(h, true);
}

void TestOperationCompletesOnceEverySliceLanded() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  CHECK(!t.Declare(kKey, k).ok());  // a key is declared once
  std::vector<float> out(5, 0.0f);
  Calls calls;
  RequestTracker::Completion now;
  CHECK(t.Begin(kKey, reinterpret_cast<char*>(out.data()), calls.Callback(), &now) == 0);  // the init
  CHECK(!now.done && !t.Idle(kKey));
  RequestTracker::Completion c = Land(&t, k, 2, 0, 3.0f);
  CHECK(c.received && !c.completed && !c.done);
  c = Land(&t, k, 0, 0, 1.0f);
  CHECK(c.received && !c.completed && !c.done);
  c = Land(&t, k, 1, 0, 2.0f);
  CHECK(c.received && c.completed && c.done && c.status.ok());
  c.Run();
  CHECK(calls.count == 1 && calls.last.ok());
  CHECK((out == std::vector<float>{1, 1, 2, 2, 3}));  // each slice at its offset in the caller's buffer
  CHECK(t.Idle(kKey) && t.AllIdle() && t.writers() == 0);
  CHECK(t.TakeError(kKey).ok());
}

void TestAKeyWithoutSlicesCompletesAtOnce() {
  RequestTracker t;
  CHECK(t.Declare(1, RequestTracker::Key{"empty", DType::kFloat32, 0, {}}).ok());
  Calls calls;
  RequestTracker::Completion now;
  CHECK(t.Begin(1, nullptr, calls.Callback(), &now) == 0);
  CHECK(t.Begin(1, nullptr, calls.Callback(), &now) == 1);  // iterations advance all the same
  CHECK(now.completed && now.done && t.Idle(1));
  now.Run();
  CHECK(calls.count == 1 && calls.last.ok());
}

void TestIterationsOfOneKeyCompleteSeparately() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> first(5), second(5);
  Calls a, b;
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(first.data()), a.Callback(), &now);
  CHECK(t.Begin(kKey, reinterpret_cast<char*>(second.data()), b.Callback(), &now) == 1);
  for (uint32_t i = 0; i < 3; ++i) Land(&t, k, i, 1, 9.0f).Run();  // iteration 1 completes first
  CHECK(a.count == 0 && b.count == 1 && !t.Idle(kKey));
  CHECK((second == std::vector<float>(5, 9.0f)) && (first == std::vector<float>(5, 0.0f)));
  for (uint32_t i = 0; i < 3; ++i) Land(&t, k, i, 0, 4.0f).Run();
  CHECK(a.count == 1 && t.Idle(kKey));
}

void TestABroadcastThatDoesNotMatchTheSliceSentIsAnError() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), nullptr, &now);
  char* dst = nullptr;
  Header h = BroadcastOf(k, 0, 0);
  CHECK(!t.StartWrite(1, h, &dst).ok() && dst == nullptr);  // slice 0 belongs to server 0
  h.offset = 1;
  CHECK(!t.StartWrite(0, h, &dst).ok());
  h = BroadcastOf(k, 0, 0);
  h.dtype = DType::kFloat64;
  CHECK(!t.StartWrite(0, h, &dst).ok());
  h = BroadcastOf(k, 0, 0);
  h.slice = 3;
  const Status st = t.StartWrite(0, h, &dst);
  CHECK(!st.ok() && st.message().find("of key 'layer0_weight', which has fewer") != std::string::npos);
  h = BroadcastOf(k, 0, 0);
  h.key = 8;
  CHECK(!t.StartWrite(0, h, &dst).ok());
  CHECK(t.writers() == 0 && !t.Idle(kKey));
  // A slice for an iteration nobody waits for is skipped, not an error.
  CHECK(t.StartWrite(0, BroadcastOf(k, 0, 5), &dst).ok() && dst == nullptr && t.writers() == 0);
}

void TestARejectionCompletesAtOnceAndLateSlicesAreSkipped() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  Calls calls;
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), calls.Callback(), &now);
  RequestTracker::Completion c = t.Reject(kKey, 0, Status::Rejected("no optimizer"));
  CHECK(c.done && c.status.code() == Status::Code::kRejected);
  c.Run();
  CHECK(calls.count == 1 && calls.last.message() == "no optimizer" && t.Idle(kKey));
  char* dst = reinterpret_cast<char*>(1);
  CHECK(t.StartWrite(0, BroadcastOf(k, 0, 0), &dst).ok() && dst == nullptr);  // the late slice is dropped
  CHECK(!t.Reject(kKey, 0, Status::Rejected("again")).done);                   // nothing left to complete
  CHECK(t.TakeError(kKey).message() == "no optimizer");                         // the first rejection, once
  CHECK(t.TakeError(kKey).ok());
  CHECK(!t.Reject(99, 0, Status::Rejected("unknown key")).done);
}

void TestARejectionWaitsForTheSliceBeingWritten() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  Calls calls;
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), calls.Callback(), &now);
  char* dst = nullptr;
  const Header landing = BroadcastOf(k, 0, 0);
  CHECK(t.StartWrite(0, landing, &dst).ok() && dst != nullptr);
  // Server 1 rejects while server 0's slice is still being read into the caller's buffer: the caller must not
  // get the buffer back yet, and no further slice may start writing into it.
  RequestTracker::Completion c = t.Reject(kKey, 0, Status::Rejected("bad shape"));
  CHECK(!c.done && calls.count == 0);
  char* other = nullptr;
  CHECK(t.StartWrite(0, BroadcastOf(k, 2, 0), &other).ok() && other == nullptr);
  CHECK(t.writers() == 1);
  c = t.EndWrite(landing, true);
  CHECK(c.done && !c.received && c.status.message() == "bad shape");
  c.Run();
  CHECK(calls.count == 1 && t.Idle(kKey) && t.writers() == 0);
}

void TestAFailedReadCompletesNothing() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), nullptr, &now);
  char* dst = nullptr;
  const Header h = BroadcastOf(k, 1, 0);
  CHECK(t.StartWrite(1, h, &dst).ok() && dst != nullptr);
  const RequestTracker::Completion c = t.EndWrite(h, false);  // the connection broke mid-payload
  CHECK(!c.done && !c.received && t.writers() == 0 && !t.Idle(kKey));
}

void TestTheJobsFailureStopsWritesAndHandsBackEveryCallback() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  CHECK(t.Declare(8, RequestTracker::Key{"bias", DType::kFloat32, 1, {Slice{0, 0, 1, 1}}}).ok());
  std::vector<float> out(5), bias(1);
  Calls calls;
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), calls.Callback(), &now);
  t.Begin(8, reinterpret_cast<char*>(bias.data()), calls.Callback(), &now);
  char* dst = nullptr;
  const Header h = BroadcastOf(k, 0, 0);
  CHECK(t.StartWrite(0, h, &dst).ok() && dst != nullptr);
  t.MarkFailed();
  char* other = reinterpret_cast<char*>(1);
  CHECK(t.StartWrite(1, BroadcastOf(k, 1, 0), &other).ok() && other == nullptr);  // no new writes
  CHECK(t.writers() == 1);  // the worker waits for this before FailAll
  CHECK(!t.EndWrite(h, true).done);  // the failure completes it, not the slice
  CHECK(t.writers() == 0);
  std::vector<RequestTracker::Completion> completions = t.FailAll(Status::PeerLost("server 1 died"));
  CHECK(completions.size() == 2 && t.AllIdle());
  for (auto& c : completions) c.Run();
  CHECK(calls.count == 2 && calls.last.code() == Status::Code::kPeerLost);
}

// An operation whose push frames the sender still holds (a SendHold alive), with a counter of its releases.
struct Held {
  int releases = 0;
  std::shared_ptr<SendHold> hold = std::make_shared<SendHold>();
  Held() {
    hold->set_on_release([this] { ++releases; });
  }
};

void TestARejectionWaitsForItsSlicesStillQueuedInTheSender() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  Calls calls;
  Held held;  // slices for server 1 are still queued behind a slow connection
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), calls.Callback(), &now, held.hold);
  // Server 0 rejects: the sender still reads the gradient for server 1, so the caller must not get it back.
  RequestTracker::Completion c = t.Reject(kKey, 0, Status::Rejected("no optimizer"));
  CHECK(!c.done && calls.count == 0 && !t.Idle(kKey) && !t.AllIdle());
  CHECK(t.Missing().find("1 failed operations still held") != std::string::npos);
  char* dst = reinterpret_cast<char*>(1);
  CHECK(t.StartWrite(1, BroadcastOf(k, 1, 0), &dst).ok() && dst == nullptr);  // still no writes into `out`
  CHECK(!t.Released(kKey, 0).done);  // not released yet: nothing happens
  // The sender sends (or drops) the last frame: the release is reported once, and completes the operation.
  held.hold.reset();
  CHECK(held.releases == 1 && calls.count == 0);
  c = t.Released(kKey, 0);
  CHECK(c.done && c.status.message() == "no optimizer");
  c.Run();
  CHECK(calls.count == 1 && t.Idle(kKey));
  CHECK(!t.Released(kKey, 0).done);  // once
  CHECK(t.TakeError(kKey).message() == "no optimizer");
}

void TestTheLastWriterOfARejectionLeavesItToTheSender() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  Calls calls;
  Held held;
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), calls.Callback(), &now, held.hold);
  char* dst = nullptr;
  const Header landing = BroadcastOf(k, 0, 0);
  CHECK(t.StartWrite(0, landing, &dst).ok() && dst != nullptr);
  CHECK(!t.Reject(kKey, 0, Status::Rejected("bad shape")).done);
  CHECK(!t.EndWrite(landing, true).done);  // the writer is done, the sender is not
  CHECK(calls.count == 0 && !t.Idle(kKey) && t.writers() == 0);
  held.hold.reset();
  CHECK(held.releases == 1);
  t.Released(kKey, 0).Run();
  CHECK(calls.count == 1 && calls.last.message() == "bad shape" && t.Idle(kKey));
}

void TestASuccessfulOperationNeitherWaitsForNorHearsOfTheSender() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  Calls calls;
  Held held;
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), calls.Callback(), &now, held.hold);
  // Every broadcast slice landed, so every server had this worker's whole push: the sender reads no more of it
  // even if it has not yet let go of the frame.
  for (uint32_t i = 0; i < 3; ++i) Land(&t, k, i, 0, 1.0f).Run();
  CHECK(calls.count == 1 && calls.last.ok() && t.Idle(kKey));
  held.hold.reset();
  CHECK(held.releases == 0);  // nobody asked: no release reported (no work for the worker's release thread)
}

void TestTheJobsFailureHandsBackHeldOperationsOnceTheSenderLetGo() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  CHECK(t.Declare(8, RequestTracker::Key{"bias", DType::kFloat32, 1, {Slice{0, 0, 1, 1}}}).ok());
  std::vector<float> out(5), bias(1);
  Calls held_calls, free_calls;
  Held held;
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), held_calls.Callback(), &now, held.hold);
  t.Begin(8, reinterpret_cast<char*>(bias.data()), free_calls.Callback(), &now, std::weak_ptr<SendHold>());
  std::vector<RequestTracker::Completion> completions = t.FailAll(Status::PeerLost("server 1 died"));
  CHECK(completions.size() == 1 && !t.AllIdle() && t.Idle(8));
  completions[0].Run();
  CHECK(free_calls.count == 1 && held_calls.count == 0);
  held.hold.reset();  // the sender drops the frames to the dead server
  CHECK(held.releases == 1);
  RequestTracker::Completion c = t.Released(kKey, 0);
  CHECK(c.done && c.status.code() == Status::Code::kPeerLost);
  c.Run();
  CHECK(held_calls.count == 1 && t.AllIdle());
}

void TestMissingNamesTheSlicesAndServersStillExpected() {
  RequestTracker t;
  const RequestTracker::Key k = FiveFloats();
  CHECK(t.Declare(kKey, k).ok());
  std::vector<float> out(5);
  RequestTracker::Completion now;
  t.Begin(kKey, reinterpret_cast<char*>(out.data()), nullptr, &now);
  Land(&t, k, 1, 0, 1.0f);
  // The key's servers: the worker names them in a timeout.
  CHECK(t.Missing() == "2 slices still expected from servers {0, 1}");
  for (uint32_t i : {0u, 2u}) Land(&t, k, i, 0, 1.0f);
  CHECK(t.Missing() == "0 slices still expected from servers {}");
}

void TestWaitAllReportsTheFirstRejectionOfAnyKeyOnce() {
  RequestTracker t;
  CHECK(t.Declare(1, RequestTracker::Key{"a", DType::kFloat32, 1, {Slice{0, 0, 1, 0}}}).ok());
  CHECK(t.Declare(2, RequestTracker::Key{"b", DType::kFloat32, 1, {Slice{0, 0, 1, 0}}}).ok());
  RequestTracker::Completion now;
  float a = 0, b = 0;
  t.Begin(1, reinterpret_cast<char*>(&a), nullptr, &now);
  t.Begin(2, reinterpret_cast<char*>(&b), nullptr, &now);
  t.Reject(2, 0, Status::Rejected("b failed"));
  t.Reject(1, 0, Status::Rejected("a failed"));
  CHECK(t.TakeAllErrors().message() == "a failed");
  CHECK(t.TakeAllErrors().ok() && t.TakeError(2).ok());
}

void TestRequestsAreAnsweredOnceAndLateRepliesIgnored() {
  RequestTracker t;
  const uint64_t a = t.NewRequest(), b = t.NewRequest();
  CHECK(a != b && !t.Answered(a) && !t.Answered(b));
  t.Answer(b, Status::Ok(), "states");
  CHECK(t.Answered(b) && !t.Answered(a));
  std::string reply;
  CHECK(t.TakeAnswer(b, &reply).ok() && reply == "states");
  t.Answer(b, Status::Ok(), "late");  // its requester is gone: ignored
  CHECK(!t.Answered(b) && !t.TakeAnswer(b, &reply).ok());
  t.Answer(a, Status::Rejected("server 0: ValueError: bad optimizer"), "");
  const Status st = t.TakeAnswer(a, &reply);
  CHECK(st.code() == Status::Code::kRejected && st.message() == "server 0: ValueError: bad optimizer");
}

}  // namespace

#define RUN(t) {#t, t}

int main() {
  return p3test::RunTests({
      RUN(TestOperationCompletesOnceEverySliceLanded),
      RUN(TestAKeyWithoutSlicesCompletesAtOnce),
      RUN(TestIterationsOfOneKeyCompleteSeparately),
      RUN(TestABroadcastThatDoesNotMatchTheSliceSentIsAnError),
      RUN(TestARejectionCompletesAtOnceAndLateSlicesAreSkipped),
      RUN(TestARejectionWaitsForTheSliceBeingWritten),
      RUN(TestAFailedReadCompletesNothing),
      RUN(TestTheJobsFailureStopsWritesAndHandsBackEveryCallback),
      RUN(TestARejectionWaitsForItsSlicesStillQueuedInTheSender),
      RUN(TestTheLastWriterOfARejectionLeavesItToTheSender),
      RUN(TestASuccessfulOperationNeitherWaitsForNorHearsOfTheSender),
      RUN(TestTheJobsFailureHandsBackHeldOperationsOnceTheSenderLetGo),
      RUN(TestMissingNamesTheSlicesAndServersStillExpected),
      RUN(TestWaitAllReportsTheFirstRejectionOfAnyKeyOnce),
      RUN(TestRequestsAreAnsweredOnceAndLateRepliesIgnored),
  });
}
