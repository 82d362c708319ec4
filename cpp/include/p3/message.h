// Public. The wire format: every frame is a fixed 64-byte little-endian Header followed by
// `payload_bytes` bytes. The priority travels in every header so that each hop (worker send queue,
// server processing queue, server send queue) can order slices without looking at the payload.
#pragma once

#include <cstdint>
#include <string>

#include "p3/dtype.h"

namespace p3 {

constexpr uint32_t kMagic = 0x564b3350;  // "P3KV" read as little-endian bytes
// 2: HELLO declares the worker's payload byte order (version 1 sent none).
// 3: control messages have their own fields (status, request type) instead of reusing key and a reserved
//    byte; the command is one byte. A peer of another version is refused naming both versions.
// 4: a REPLY may carry status kUnsupported (the server has no request handler), which version 3 refused.
// 5: PAUSE and RESUME (server -> worker), which version 4 refused as unknown commands.
constexpr uint16_t kProtocolVersion = 5;
constexpr size_t kHeaderBytes = 64;
// Control payloads (node tables, error texts) are small; anything larger is hostile or corrupt.
constexpr uint64_t kMaxControlBytes = 1 << 20;
// How errors name that limit (it is fixed: no variable raises it).
constexpr const char* kControlLimitName = "the fixed 1 MiB limit of frames to and from the scheduler";

enum class Command : uint16_t {
  kRegister = 1,     // node -> scheduler: role, address, job size
  kNodeTable = 2,    // scheduler -> node: your rank, every server's address
  kBarrier = 3,      // worker -> scheduler; key = barrier sequence number (barriers are numbered like keys)
  kBarrierDone = 4,  // scheduler -> worker
  kFinish = 5,       // worker -> scheduler: this worker is done
  kShutdown = 6,     // scheduler -> node: the job is over, exit cleanly
  kNodeFailed = 7,   // scheduler -> node: payload names the dead node
  kError = 8,        // any -> peer: payload explains a rejected request (key/slice/iteration identify it)
  kHello = 9,        // worker -> server: first frame on a data connection, carries the worker's rank
  kInit = 10,        // worker -> server: declare a slice; worker 0 also sends its initial value
  kPush = 11,        // worker -> server: a gradient slice for `iteration`
  kBroadcast = 12,   // server -> every worker: the slice's new value, unrequested (no pull in P3)
  kBye = 13,         // worker -> server: orderly end of the data connection
  kRequest = 14,     // worker -> server: control request (`request` = its type), e.g. the optimizer
  kReply = 15,       // server -> worker: answer to kRequest (same type and id); `status` marks an error
  kHeartbeat = 16,   // node <-> scheduler, every heartbeat_interval: silence means a hung node or a cut network
  // server -> worker: the server stops reading this worker's data connection on purpose (the worker is over its
  // share of P3_SERVER_QUEUE_BYTES, admission.h), and RESUME when it reads again. While paused, the worker does
  // not count its sends' lack of progress against P3_HEARTBEAT_TIMEOUT (a stalled server is caught otherwise).
  kPause = 17,
  kResume = 18,
};
constexpr int kNumCommands = 19;  // array bound for per-command counters (index = value)

const char* CommandName(Command c);
bool IsValidCommand(uint8_t raw);

// Headers and control payloads are little-endian; data payloads (slice values and gradients) travel in the
// sender's host byte order, unconverted (no copy on either side). A worker's HELLO declares that order and a
// server refuses a worker whose order differs from its own (codec.h: CheckHello).
enum class ByteOrder : uint8_t { kUndeclared = 0, kLittleEndian = 1, kBigEndian = 2 };
ByteOrder HostByteOrder();
const char* ByteOrderName(ByteOrder order);

// Filled only by the frame builder (cpp/src/frame_builder.h), one function per kind of frame. On the wire, in
// this order: magic u32, version u16, command u8, status u8, priority i32, sender i32, dtype u8, byte_order
// u8, request u16, slice u32, key u64, offset u64, count u64, iteration u64, payload_bytes u64 (64 bytes).
struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  Command command = Command::kError;
  uint8_t status = 0;    // REPLY, ERROR: the Status::Code of the answer (0 = Ok); 0 on every other frame
  int32_t priority = 0;  // larger is more urgent; layer k of L gets -k (MXNet's convention)
  int32_t sender = -1;   // rank of the sending node within its role
  DType dtype = DType::kFloat32;
  ByteOrder byte_order = ByteOrder::kUndeclared;  // HELLO: the sender's payload byte order
  uint16_t request = 0;    // REQUEST, REPLY: the request type (what the server's request handler is asked)
  uint32_t slice = 0;      // slice index within the key
  uint64_t key = 0;
  uint64_t offset = 0;     // first element of the slice within the key
  uint64_t count = 0;      // elements in the slice
  uint64_t iteration = 0;  // 0 = init, then 1, 2, ... per key; REQUEST, REPLY: the request's id
  uint64_t payload_bytes = 0;
};

}  // namespace p3
