// Internal. The only code that fills frame headers (codec.h turns them into bytes): one function per kind of
// frame, so that each field means one thing per command and every command's fields are set in one place.
// Pure functions, any thread. Fields a function does not take stay at their defaults (zero, sender -1).
#pragma once

#include <cstdint>

#include "p3/dtype.h"
#include "p3/message.h"
#include "p3/status.h"

namespace p3 {

// Which slice a data frame (or a rejection of one) is about.
struct SliceId {
  uint64_t key = 0;
  uint32_t slice = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
  DType dtype = DType::kFloat32;
  uint64_t iteration = 0;
};

// A worker's first frame on a data connection: its rank and this host's payload byte order.
Header HelloFrame(int32_t sender);
// INIT, PUSH (worker -> server) and BROADCAST (server -> workers) of one slice.
Header SliceFrame(Command command, int32_t sender, const SliceId& s, int32_t priority, uint64_t payload_bytes);
// A rejection of the slice operation `s` (key, slice, iteration), or of a frame to the scheduler (s = {}); the
// payload explains it.
Header ErrorFrame(int32_t sender, Status::Code code, const SliceId& s, int32_t priority, uint64_t payload_bytes);
// A control request of `type` with id `id` (worker -> server), and its reply: `code` is Ok, or the error that
// the payload explains.
Header RequestFrame(int32_t sender, uint16_t type, uint64_t id, int32_t priority, uint64_t payload_bytes);
Header ReplyFrame(int32_t sender, const Header& request, Status::Code code, int32_t priority, uint64_t payload_bytes);
// PAUSE (`paused`) or RESUME (server -> worker): the server stops or starts again reading the worker's data
// connection on purpose; `priority` places it in the server's send queue (ahead of broadcasts).
Header PauseFrame(int32_t sender, bool paused, int32_t priority);
// A worker's barrier number `sequence` (worker -> scheduler).
Header BarrierFrame(uint64_t sequence);
// Frames whose only content is the command and the payload: REGISTER, NODE_TABLE, BARRIER_DONE, FINISH,
// SHUTDOWN, HEARTBEAT, BYE, PAUSE, RESUME, and NODE_FAILED (a node's last words: why it is going down).
Header ControlFrame(Command command, int32_t sender, uint64_t payload_bytes);

}  // namespace p3
