// Unit tests of the core's pure parts: priority queue ordering, codec round-trip and validation, slicer,
// float16 conversion and aggregation; and the socket's check for a connection to itself (loopback only). Built and
// run by tests/test_cpp_unit.py.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "codec.h"
#include "frame_builder.h"
#include "p3/dtype.h"
#include "handshake.h"
#include "priority_queue.h"
#include "p3/slicer.h"
#include "socket.h"
#include "virtual_stream.h"
#include "check.h"

namespace {

using p3::Header;
using p3::PriorityQueue;

void TestQueuePriorityThenFifo() {
  PriorityQueue<int> q;
  // (priority, id): ids of equal priority must come out in arrival order.
  const std::vector<std::pair<int, int>> in = {{0, 1}, {-3, 2}, {5, 3}, {0, 4}, {5, 5}, {-3, 6}, {0, 7}};
  for (auto [prio, id] : in) CHECK(q.Push(prio, id));
  std::vector<int> out;
  q.Close();
  while (auto v = q.Pop()) out.push_back(*v);
  CHECK((out == std::vector<int>{3, 5, 1, 4, 7, 2, 6}));
}

void TestQueueManyEqualPrioritiesKeepFifo() {
  // A comparator that is not a strict weak ordering (ps-lite's `<=`) scrambles long runs of equals.
  PriorityQueue<int> q;
  for (int i = 0; i < 10000; ++i) q.Push(i % 3 == 0 ? 1 : 0, i);
  q.Close();
  int last_hi = -1, last_lo = -1;
  bool hi_phase = true, ordered = true;
  while (auto v = q.Pop()) {
    const bool hi = *v % 3 == 0;
    if (hi && !hi_phase) ordered = false;
    if (!hi) hi_phase = false;
    int& last = hi ? last_hi : last_lo;
    if (*v < last) ordered = false;
    last = *v;
  }
  CHECK(ordered);
}

void TestQueueUrgentOvertakesQueued() {
  PriorityQueue<std::string> q;
  for (int i = 0; i < 100; ++i) q.Push(-10, "bulk");
  q.Push(0, "urgent");
  auto first = q.Pop();
  CHECK(first && *first == "urgent");
}

void TestQueueCloseDrainsThenEnds() {
  PriorityQueue<int> q;
  q.Push(0, 1);
  q.Push(0, 2);
  q.Close();
  CHECK(!q.Push(0, 3));  // closed: refused, never silently queued
  CHECK(q.Pop() == 1);
  CHECK(q.Pop() == 2);
  CHECK(!q.Pop().has_value());
}

void TestQueueAbortDrops() {
  PriorityQueue<int> q;
  q.Push(0, 1);
  q.Abort();
  CHECK(!q.Pop().has_value());
}

void TestQueueCloseWakesBlockedConsumer() {
  PriorityQueue<int> q;
  bool ended = false;
  std::thread consumer([&] { ended = !q.Pop().has_value(); });
  q.Close();
  consumer.join();
  CHECK(ended);
}

void TestQueuePopForTimesOut() {
  PriorityQueue<int> q;
  CHECK(!q.PopFor(std::chrono::milliseconds(10)).has_value());
}

Header SampleHeader() {
  Header h;
  h.command = p3::Command::kPush;
  h.priority = -17;
  h.sender = 3;
  h.dtype = p3::DType::kFloat16;
  h.slice = 9;
  h.key = 0x8123456789abcdefull;
  h.offset = 450000;
  h.count = 50000;
  h.iteration = 1234567;
  h.payload_bytes = 100000;
  return h;
}

void TestCodecRoundTrip() {
  const Header h = SampleHeader();
  uint8_t buf[p3::kHeaderBytes];
  p3::EncodeHeader(h, buf);
  Header d;
  CHECK(p3::DecodeHeader(buf, 1 << 30, &d).ok());
  CHECK(d.command == h.command && d.priority == h.priority && d.sender == h.sender && d.dtype == h.dtype);
  CHECK(d.slice == h.slice && d.key == h.key && d.offset == h.offset && d.count == h.count);
  CHECK(d.iteration == h.iteration && d.payload_bytes == h.payload_bytes);
  // Little-endian on the wire whatever the host: magic bytes spell "P3KV".
  CHECK(std::memcmp(buf, "P3KV", 4) == 0);
}

void TestCodecRejects() {
  uint8_t buf[p3::kHeaderBytes];
  Header d;
  auto rejects = [&](const std::function<void(Header&)>& mutate, const char* why) {
    Header h = SampleHeader();
    mutate(h);
    p3::EncodeHeader(h, buf);
    const p3::Status st = p3::DecodeHeader(buf, 1 << 30, &d);
    if (st.ok()) std::fprintf(stderr, "accepted a frame with %s\n", why);
    CHECK(!st.ok());
  };
  rejects([](Header& h) { h.magic = 0x12345678; }, "bad magic");
  rejects([](Header& h) { h.version = 99; }, "wrong version");
  rejects([](Header& h) { h.command = static_cast<p3::Command>(77); }, "unknown command");
  rejects([](Header& h) { h.dtype = static_cast<p3::DType>(42); }, "unknown dtype");
  rejects([](Header& h) { h.payload_bytes = 1ull << 40; }, "oversized payload");
  rejects([](Header& h) { h.payload_bytes = 99999; }, "payload that is not count * dtype size");
  rejects([](Header& h) { h.count = 0; }, "zero count");
  rejects([](Header& h) { h.payload_bytes = 0; }, "push without payload");
  rejects([](Header& h) {
    h.command = p3::Command::kBarrier;
    h.payload_bytes = 2 << 20;
  }, "huge control frame");
}

void TestHelloDeclaresTheByteOrderAndAMismatchIsRefused() {
  uint8_t buf[p3::kHeaderBytes];
  Header d;
  p3::EncodeHeader(p3::HelloFrame(3), buf);
  CHECK(p3::DecodeHeader(buf, 1 << 30, &d).ok());
  bool mismatch = true;
  CHECK(p3::CheckHello(d, &mismatch).ok() && !mismatch);
  CHECK(d.sender == 3 && d.byte_order == p3::HostByteOrder());
  const bool little = p3::HostByteOrder() == p3::ByteOrder::kLittleEndian;
  d.byte_order = little ? p3::ByteOrder::kBigEndian : p3::ByteOrder::kLittleEndian;
  p3::Status st = p3::CheckHello(d, &mismatch);
  CHECK(!st.ok() && mismatch);
  CHECK(st.message().find("worker 3 sends payloads in big-endian byte order") != std::string::npos || !little);
  CHECK(st.message().find("this server's host is little-endian") != std::string::npos || !little);
  d.byte_order = p3::ByteOrder::kUndeclared;  // a version-1 peer (refused by the version check before this)
  st = p3::CheckHello(d, &mismatch);
  CHECK(!st.ok() && mismatch && st.message().find("undeclared byte order") != std::string::npos);
  Header h = p3::HelloFrame(0);
  h.version = 1;  // the protocol before HELLO declared the byte order
  p3::EncodeHeader(h, buf);
  st = p3::DecodeHeader(buf, 1 << 30, &d);
  CHECK(!st.ok() && st.message().find("protocol version 1, expected 5") != std::string::npos);
  h = p3::HelloFrame(0);
  h.command = p3::Command::kPush;
  CHECK(!p3::CheckHello(h, &mismatch).ok() && !mismatch);
}

void TestRegistrationAndTableRoundTrip() {
  p3::Registration r{p3::Role::kServer, "10.0.0.7", 9001, 4, 2};
  p3::Registration r2;
  CHECK(p3::DecodeRegistration(p3::EncodeRegistration(r), &r2).ok());
  CHECK(r2.role == r.role && r2.host == r.host && r2.port == r.port && r2.num_worker == 4 && r2.num_server == 2);
  CHECK(!p3::DecodeRegistration("\x01", &r2).ok());
  CHECK(r2.rank == -1);  // not asked for
  r.rank = 3;  // P3_WORKER_RANK: asked for, and an encoding without it (older nodes) still decodes
  const std::string with_rank = p3::EncodeRegistration(r);
  CHECK(p3::DecodeRegistration(with_rank, &r2).ok() && r2.rank == 3);
  CHECK(p3::DecodeRegistration(with_rank.substr(0, with_rank.size() - 4), &r2).ok() && r2.rank == -1);
  CHECK(!p3::DecodeRegistration(with_rank + "x", &r2).ok());
  CHECK(!p3::DecodeRegistration(with_rank.substr(0, with_rank.size() - 2), &r2).ok());
  p3::NodeTable t;
  t.your_rank = 1;
  t.nodes = {{p3::Role::kServer, 0, "a", 1}, {p3::Role::kWorker, 1, "bb", 0}};
  p3::NodeTable t2;
  const std::string bytes = p3::EncodeNodeTable(t);
  CHECK(p3::DecodeNodeTable(bytes, &t2).ok());
  CHECK(t2.your_rank == 1 && t2.nodes.size() == 2 && t2.nodes[1].host == "bb" && t2.nodes[0].port == 1);
  CHECK(!p3::DecodeNodeTable(bytes.substr(0, bytes.size() - 1), &t2).ok());
  CHECK(!p3::DecodeNodeTable(bytes + "x", &t2).ok());
}

void TestSlicer() {
  uint64_t rr = 0;
  auto one = p3::SliceKey(1, 50000, 3, &rr);
  CHECK(one.size() == 1 && one[0].count == 1 && one[0].server == 0 && rr == 1);
  auto exact = p3::SliceKey(50000, 50000, 3, &rr);
  CHECK(exact.size() == 1 && exact[0].count == 50000 && exact[0].server == 1);
  auto over = p3::SliceKey(50001, 50000, 3, &rr);
  CHECK(over.size() == 2 && over[0].count == 50000 && over[1].count == 1 && over[1].offset == 50000);
  CHECK(over[0].server == 2 && over[1].server == 0);  // the counter runs across keys
  auto none = p3::SliceKey(0, 50000, 3, &rr);
  CHECK(none.empty());
  uint64_t covered = 0;
  for (const auto& s : p3::SliceKey(1234567, 1000, 4, &rr)) covered += s.count;
  CHECK(covered == 1234567);
}

void TestHalf() {
  // Exact values survive, rounding is to nearest even, range ends saturate as numpy does.
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    CHECK(p3::HalfToFloat(p3::FloatToHalf(f)) == f);
  }
  CHECK(p3::FloatToHalf(1.0f + 1.0f / 2048) == p3::FloatToHalf(1.0f));         // tie -> even
  CHECK(p3::FloatToHalf(1.0f + 3.0f / 2048) == p3::FloatToHalf(1.0f + 2.0f / 1024));  // tie -> even (up)
  CHECK(std::isinf(p3::HalfToFloat(p3::FloatToHalf(70000.0f))));
  CHECK(std::isnan(p3::HalfToFloat(p3::FloatToHalf(std::nanf("")))));
  CHECK(p3::HalfToFloat(p3::FloatToHalf(1e-9f)) == 0.0f);
}

void TestBFloat16() {
  // torch's bfloat16: the high half of a float32, rounded to nearest even; nan stays nan, overflow gives inf.
  for (float f : {0.0f, 1.0f, -2.5f, 3.3895313892515355e+38f, 1.1754943508222875e-38f}) {
    CHECK(p3::BFloat16ToFloat(p3::FloatToBFloat16(f)) == f);
  }
  CHECK(p3::FloatToBFloat16(1.0f + 1.0f / 256) == p3::FloatToBFloat16(1.0f));                 // tie -> even
  CHECK(p3::FloatToBFloat16(1.0f + 3.0f / 256) == p3::FloatToBFloat16(1.0f + 2.0f / 128));    // tie -> even (up)
  CHECK(p3::FloatToBFloat16(1.0f + 1.5f / 256) == p3::FloatToBFloat16(1.0f + 1.0f / 128));    // above half: up
  CHECK(std::isinf(p3::BFloat16ToFloat(p3::FloatToBFloat16(3.4e38f))));
  CHECK(std::isnan(p3::BFloat16ToFloat(p3::FloatToBFloat16(std::nanf("")))));
  // Summed in float32, rounded once: 1 + 2^-8 + 2^-8 is 1 + 2^-7 exactly (a bfloat16 sum would stay at 1).
  const uint16_t a[2] = {p3::FloatToBFloat16(1.0f), p3::FloatToBFloat16(1.0f / 256)};
  float acc[2];
  p3::CopyToAccumulator(p3::DType::kBFloat16, a, acc, 2);
  p3::AddToAccumulator(p3::DType::kBFloat16, a + 1, acc, 1);
  p3::AddToAccumulator(p3::DType::kBFloat16, a + 1, acc, 1);
  uint16_t out[2];
  p3::CopyFromAccumulator(p3::DType::kBFloat16, acc, out, 2);
  CHECK(p3::BFloat16ToFloat(out[0]) == 1.0f + 1.0f / 128);
  CHECK(p3::DTypeSize(p3::DType::kBFloat16) == 2 && p3::AccumulatorType(p3::DType::kBFloat16) == p3::DType::kFloat32);
  p3::DType parsed;
  CHECK(p3::ParseDType("bfloat16", &parsed) && parsed == p3::DType::kBFloat16);
}

void TestAggregation() {
  const uint16_t a[3] = {p3::FloatToHalf(1.5f), p3::FloatToHalf(-2.0f), p3::FloatToHalf(0.25f)};
  float acc[3];
  p3::CopyToAccumulator(p3::DType::kFloat16, a, acc, 3);
  p3::AddToAccumulator(p3::DType::kFloat16, a, acc, 3);
  uint16_t out[3];
  p3::CopyFromAccumulator(p3::DType::kFloat16, acc, out, 3);
  CHECK(p3::HalfToFloat(out[0]) == 3.0f && p3::HalfToFloat(out[1]) == -4.0f && p3::HalfToFloat(out[2]) == 0.5f);
  const int64_t x[2] = {1, -5};
  int64_t ax[2];
  p3::CopyToAccumulator(p3::DType::kInt64, x, ax, 2);
  p3::AddToAccumulator(p3::DType::kInt64, x, ax, 2);
  CHECK(ax[0] == 2 && ax[1] == -10);
}

// Runs both ends of the handshake over a socket pair; returns (acceptor's status, connector's status).
std::pair<p3::Status, p3::Status> Handshake(const std::string& acceptor_secret, const std::string& connector_secret) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return {p3::Status::IoError("socketpair"), p3::Status()};
  p3::Socket acceptor(fds[0]), connector(fds[1]);
  p3::Status a;
  std::thread t([&] {
    a = p3::AuthenticateConnector(acceptor, acceptor_secret, 2.0);
    if (!a.ok()) acceptor.Shutdown();  // a refusing acceptor hangs up, as the servers do
  });
  const p3::Status c = p3::AuthenticateToAcceptor(connector, connector_secret, 2.0);
  t.join();
  return {a, c};
}

void TestHandshake() {
  auto [a, c] = Handshake("s3cret", "s3cret");
  CHECK(a.ok() && c.ok());
  std::tie(a, c) = Handshake("s3cret", "wrong");
  CHECK(a.code() == p3::Status::Code::kRejected && !c.ok());
  std::tie(a, c) = Handshake("", "s3cret");
  CHECK(!a.ok() && !c.ok());
  // A peer that does not speak the handshake: garbage instead of the answer.
  int fds[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  p3::Socket acceptor(fds[0]), peer(fds[1]);
  std::thread t([&] {
    unsigned char challenge[41];
    peer.RecvAll(challenge, sizeof challenge);
    std::vector<unsigned char> garbage(64, 0xab);
    peer.SendAll(garbage.data(), garbage.size());
  });
  CHECK(p3::AuthenticateConnector(acceptor, "s3cret", 2.0).code() == p3::Status::Code::kRejected);
  t.join();
}

// A socket bound to a loopback port and connected to that same port is connected to itself (TCP's simultaneous
// open), which Socket::Connect must not take for its peer; a real connection between two sockets is not.
void TestASocketConnectedToItselfIsTold() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  p3::Socket self(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  addr.sin_port = htons(self.LocalPort());
  CHECK(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  CHECK(self.ConnectedToItself());

  p3::Socket listener, client, server;
  CHECK(p3::Socket::Listen("127.0.0.1", 0, 0, &listener).ok());
  CHECK(p3::Socket::Connect("127.0.0.1", listener.LocalPort(), 0, 2.0, &client).ok());
  std::string peer;
  CHECK(listener.Accept(2.0, &server, &peer).ok());
  CHECK(!client.ConnectedToItself() && !server.ConnectedToItself() && !listener.ConnectedToItself());
}

// Items queued together run back to back (a serial device); after an idle gap the clock restarts from now.
void TestVirtualStream() {
  using Clock = p3::VirtualStream::Clock;
  using std::chrono::milliseconds;
  std::mutex mu;
  std::vector<std::pair<int, Clock::time_point>> done;
  const Clock::time_point t0 = Clock::now();
  {
    p3::VirtualStream stream;
    for (int i = 0; i < 3; ++i) {
      stream.Run(milliseconds(20), [&, i] {
        std::lock_guard<std::mutex> lock(mu);
        done.emplace_back(i, Clock::now());
      });
    }
    std::this_thread::sleep_for(milliseconds(150));
    const Clock::time_point t1 = Clock::now();
    stream.Run(milliseconds(10), [&] {
      std::lock_guard<std::mutex> lock(mu);
      done.emplace_back(3, Clock::now());
    });
    std::this_thread::sleep_for(milliseconds(100));
    std::lock_guard<std::mutex> lock(mu);
    CHECK(done.size() == 4);
    if (done.size() != 4) return;
    for (int i = 0; i < 4; ++i) CHECK(done[i].first == i);
    CHECK(done[0].second - t0 >= milliseconds(20));
    CHECK(done[2].second - t0 >= milliseconds(60));  // serial: 3 x 20 ms, not 20 ms in parallel
    CHECK(done[3].second - t1 >= milliseconds(10));
    CHECK(done[3].second - t1 < milliseconds(60));  // idle time is not owed: it starts at submission
  }
}

}  // namespace

int main() {
  const std::vector<std::pair<const char*, void (*)()>> tests = {
      {"queue_priority_then_fifo", TestQueuePriorityThenFifo},
      {"queue_many_equal_priorities_keep_fifo", TestQueueManyEqualPrioritiesKeepFifo},
      {"queue_urgent_overtakes_queued", TestQueueUrgentOvertakesQueued},
      {"queue_close_drains_then_ends", TestQueueCloseDrainsThenEnds},
      {"queue_abort_drops", TestQueueAbortDrops},
      {"queue_close_wakes_blocked_consumer", TestQueueCloseWakesBlockedConsumer},
      {"queue_pop_for_times_out", TestQueuePopForTimesOut},
      {"codec_round_trip", TestCodecRoundTrip},
      {"codec_rejects", TestCodecRejects},
      {"hello_declares_the_byte_order", TestHelloDeclaresTheByteOrderAndAMismatchIsRefused},
      {"registration_and_table_round_trip", TestRegistrationAndTableRoundTrip},
      {"slicer", TestSlicer},
      {"half", TestHalf},
      {"bfloat16", TestBFloat16},
      {"aggregation", TestAggregation},
      {"handshake", TestHandshake},
      {"a_socket_connected_to_itself_is_told", TestASocketConnectedToItselfIsTold},
      {"virtual_stream", TestVirtualStream},
  };
  return p3test::RunTests(tests);
}
