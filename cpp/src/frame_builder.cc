#include "frame_builder.h"

#include "codec.h"

namespace p3 {

Header HelloFrame(int32_t sender) {
  Header h;
  h.command = Command::kHello;
  h.sender = sender;
  h.byte_order = HostByteOrder();
  return h;
}

Header SliceFrame(Command command, int32_t sender, const SliceId& s, int32_t priority, uint64_t payload_bytes) {
  Header h;
  h.command = command;
  h.priority = priority;
  h.sender = sender;
  h.dtype = s.dtype;
  h.slice = s.slice;
  h.key = s.key;
  h.offset = s.offset;
  h.count = s.count;
  h.iteration = s.iteration;
  h.payload_bytes = payload_bytes;
  return h;
}

Header ErrorFrame(int32_t sender, Status::Code code, const SliceId& s, int32_t priority, uint64_t payload_bytes) {
  Header h;
  h.command = Command::kError;
  h.status = static_cast<uint8_t>(code);
  h.priority = priority;
  h.sender = sender;
  h.slice = s.slice;
  h.key = s.key;
  h.iteration = s.iteration;
  h.payload_bytes = payload_bytes;
  return h;
}

Header RequestFrame(int32_t sender, uint16_t type, uint64_t id, int32_t priority, uint64_t payload_bytes) {
  Header h;
  h.command = Command::kRequest;
  h.priority = priority;
  h.sender = sender;
  h.request = type;
  h.iteration = id;
  h.payload_bytes = payload_bytes;
  return h;
}

Header ReplyFrame(int32_t sender, const Header& request, Status::Code code, int32_t priority,
                  uint64_t payload_bytes) {
  Header h;
  h.command = Command::kReply;
  h.status = static_cast<uint8_t>(code);
  h.priority = priority;
  h.sender = sender;
  h.request = request.request;
  h.iteration = request.iteration;
  h.payload_bytes = payload_bytes;
  return h;
}

Header PauseFrame(int32_t sender, bool paused, int32_t priority) {
  Header h;
  h.command = paused ? Command::kPause : Command::kResume;
  h.priority = priority;
  h.sender = sender;
  return h;
}

Header BarrierFrame(uint64_t sequence) {
  Header h;
  h.command = Command::kBarrier;
  h.key = sequence;
  return h;
}

Header ControlFrame(Command command, int32_t sender, uint64_t payload_bytes) {
  Header h;
  h.command = command;
  h.sender = sender;
  h.payload_bytes = payload_bytes;
  return h;
}

}  // namespace p3
