// Unit tests of the frame builder (cpp/src/frame_builder.h) through the codec: every kind of frame survives
// encode + decode with the fields it sets and zeros elsewhere, control fields have their own places (a request's
// type is not its key, a reply's error is its status), and the decoder refuses what protocol 5 forbids.
// Built and run by tests/test_cpp_worker_parts.py.
#include <cstring>
#include <string>

#include "check.h"
#include "codec.h"
#include "frame_builder.h"

namespace {

using namespace p3;

// Encodes and decodes `h`; false (with the reason on stderr) if the decoder refuses it.
bool RoundTrip(const Header& h, Header* out) {
  uint8_t buf[kHeaderBytes];
  EncodeHeader(h, buf);
  const Status st = DecodeHeader(buf, 1 << 30, out);
  if (!st.ok()) std::fprintf(stderr, "refused: %s\n", st.message().c_str());
  return st.ok();
}

void TestSliceFramesCarryTheSliceAndNoControlFields() {
  const SliceId id{0x8123456789abcdefull, 9, 450000, 50000, DType::kFloat16, 1234567};
  for (Command c : {Command::kInit, Command::kPush, Command::kBroadcast}) {
    Header d;
    CHECK(RoundTrip(SliceFrame(c, 3, id, -17, 100000), &d));
    CHECK(d.command == c && d.sender == 3 && d.priority == -17 && d.dtype == DType::kFloat16);
    CHECK(d.key == id.key && d.slice == 9 && d.offset == 450000 && d.count == 50000 && d.iteration == 1234567);
    CHECK(d.payload_bytes == 100000 && d.status == 0 && d.request == 0 && d.byte_order == ByteOrder::kUndeclared);
  }
  Header d;
  CHECK(RoundTrip(SliceFrame(Command::kInit, 1, id, 0, 0), &d) && d.payload_bytes == 0);  // INIT of ranks > 0
}

void TestARequestsTypeAndIdHaveTheirOwnFieldsAndTheReplyEchoesThem() {
  Header req;
  CHECK(RoundTrip(RequestFrame(2, 65535, 41, 7, 12), &req));
  CHECK(req.command == Command::kRequest && req.request == 65535 && req.iteration == 41 && req.sender == 2);
  CHECK(req.key == 0 && req.priority == 7 && req.payload_bytes == 12 && req.status == 0);
  Header ok, error;
  CHECK(RoundTrip(ReplyFrame(1, req, Status::Code::kOk, 9, 3), &ok));
  CHECK(ok.command == Command::kReply && ok.request == 65535 && ok.iteration == 41 && ok.status == 0);
  CHECK(ok.sender == 1 && ok.key == 0 && ok.payload_bytes == 3);
  CHECK(RoundTrip(ReplyFrame(1, req, Status::Code::kInvalid, 9, 30), &error));
  CHECK(error.status == static_cast<uint8_t>(Status::Code::kInvalid) && error.request == 65535);
}

void TestAnErrorNamesTheRejectedOperationAndItsStatus() {
  SliceId id;
  id.key = 5;
  id.slice = 2;
  id.iteration = 8;
  Header d;
  CHECK(RoundTrip(ErrorFrame(0, Status::Code::kRejected, id, 100, 20), &d));
  CHECK(d.command == Command::kError && d.status == static_cast<uint8_t>(Status::Code::kRejected));
  CHECK(d.key == 5 && d.slice == 2 && d.iteration == 8 && d.count == 0 && d.priority == 100 && d.sender == 0);
}

void TestControlFramesCarryOnlyTheirCommandSenderAndPayload() {
  for (Command c : {Command::kRegister, Command::kNodeTable, Command::kBarrierDone, Command::kFinish,
                    Command::kShutdown, Command::kHeartbeat, Command::kBye, Command::kNodeFailed}) {
    Header d;
    CHECK(RoundTrip(ControlFrame(c, 4, 10), &d));
    CHECK(d.command == c && d.sender == 4 && d.payload_bytes == 10 && d.key == 0 && d.iteration == 0);
    CHECK(d.status == 0 && d.request == 0 && d.priority == 0);
  }
  Header d;
  CHECK(RoundTrip(PauseFrame(3, true, 77), &d) && d.command == Command::kPause && d.sender == 3);
  CHECK(d.priority == 77 && d.payload_bytes == 0 && d.status == 0 && d.key == 0 && d.iteration == 0);
  CHECK(RoundTrip(PauseFrame(3, false, 77), &d) && d.command == Command::kResume && d.sender == 3);
  CHECK(RoundTrip(BarrierFrame(12), &d) && d.command == Command::kBarrier && d.key == 12 && d.payload_bytes == 0);
  CHECK(RoundTrip(HelloFrame(6), &d) && d.command == Command::kHello && d.sender == 6);
  CHECK(d.byte_order == HostByteOrder() && d.payload_bytes == 0);
}

void TestTheWireLayoutOfProtocol5() {
  uint8_t buf[kHeaderBytes];
  Header req = RequestFrame(2, 0x0304, 0x1122334455667788ull, -1, 5);
  EncodeHeader(ReplyFrame(9, req, Status::Code::kRejected, 0, 5), buf);
  CHECK(std::memcmp(buf, "P3KV", 4) == 0);
  CHECK(buf[4] == 5 && buf[5] == 0);                                             // version u16
  CHECK(buf[6] == static_cast<uint8_t>(Command::kReply));                        // command u8
  CHECK(buf[7] == static_cast<uint8_t>(Status::Code::kRejected));                // status u8
  CHECK(buf[16] == 0 && buf[17] == 0);                                           // dtype, byte order
  CHECK(buf[18] == 0x04 && buf[19] == 0x03);                                     // request u16
  CHECK(buf[48] == 0x88 && buf[55] == 0x11);                                     // iteration u64: the id
  CHECK(buf[56] == 5);                                                           // payload_bytes u64
  EncodeHeader(HelloFrame(1), buf);
  CHECK(buf[17] == static_cast<uint8_t>(HostByteOrder()));
}

void TestTheDecoderRefusesMisplacedOrUnknownStatusesAndOtherVersions() {
  uint8_t buf[kHeaderBytes];
  Header d;
  Header push = SliceFrame(Command::kPush, 0, SliceId{1, 0, 0, 4, DType::kFloat32, 1}, 0, 16);
  push.status = static_cast<uint8_t>(Status::Code::kRejected);  // a status only travels with REPLY and ERROR
  EncodeHeader(push, buf);
  Status st = DecodeHeader(buf, 1 << 30, &d);
  CHECK(!st.ok() && st.message().find("a status on a PUSH frame") != std::string::npos);
  Header reply = ReplyFrame(0, RequestFrame(0, 1, 1, 0, 0), Status::Code::kOk, 0, 0);
  reply.status = 200;
  EncodeHeader(reply, buf);
  st = DecodeHeader(buf, 1 << 30, &d);
  CHECK(!st.ok() && st.message().find("unknown status 200") != std::string::npos);
  // The last code (protocol 4's addition) travels; the one past it does not.
  reply.status = static_cast<uint8_t>(Status::Code::kUnsupported);
  EncodeHeader(reply, buf);
  CHECK(DecodeHeader(buf, 1 << 30, &d).ok() && d.status == static_cast<uint8_t>(Status::Code::kUnsupported));
  reply.status = static_cast<uint8_t>(Status::Code::kUnsupported) + 1;
  EncodeHeader(reply, buf);
  CHECK(!DecodeHeader(buf, 1 << 30, &d).ok());
  Header hello = HelloFrame(0);
  hello.version = 4;  // a peer of the previous protocol (it knows no PAUSE or RESUME)
  EncodeHeader(hello, buf);
  st = DecodeHeader(buf, 1 << 30, &d);
  CHECK(!st.ok() && st.message().find("protocol version 4, expected 5") != std::string::npos);
  CHECK(IsOtherVersion(buf));  // a p3kv peer of another version: the server and scheduler tell it why
  buf[6] = 0;  // an unknown command
  buf[4] = static_cast<uint8_t>(kProtocolVersion);  // of this version
  CHECK(!DecodeHeader(buf, 1 << 30, &d).ok() && !IsOtherVersion(buf));
  buf[0] = 'X';  // not p3kv at all
  buf[4] = 2;
  CHECK(!IsOtherVersion(buf));
}

}  // namespace

#define RUN(t) {#t, t}

int main() {
  return p3test::RunTests({
      RUN(TestSliceFramesCarryTheSliceAndNoControlFields),
      RUN(TestARequestsTypeAndIdHaveTheirOwnFieldsAndTheReplyEchoesThem),
      RUN(TestAnErrorNamesTheRejectedOperationAndItsStatus),
      RUN(TestControlFramesCarryOnlyTheirCommandSenderAndPayload),
      RUN(TestTheWireLayoutOfProtocol5),
      RUN(TestTheDecoderRefusesMisplacedOrUnknownStatusesAndOtherVersions),
  });
}
