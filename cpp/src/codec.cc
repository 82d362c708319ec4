#include "codec.h"

#include <cstring>

namespace p3 {
namespace {

// Explicit little-endian byte order, whatever the host's.
class Writer {
 public:
  explicit Writer(uint8_t* out) : p_(out) {}
  template <typename T>
  void Put(T v) {
    uint64_t u = static_cast<uint64_t>(v);
    for (size_t i = 0; i < sizeof(T); ++i) *p_++ = static_cast<uint8_t>(u >> (8 * i));
  }

 private:
  uint8_t* p_;
};

class Reader {
 public:
  Reader(const uint8_t* in, size_t len) : p_(in), end_(in + len) {}
  template <typename T>
  bool Get(T* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return false;
    uint64_t u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) u |= static_cast<uint64_t>(*p_++) << (8 * i);
    *v = static_cast<T>(u);
    return true;
  }
  bool GetString(std::string* s) {
    uint16_t n;
    if (!Get(&n) || static_cast<size_t>(end_ - p_) < n) return false;
    s->assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }
  bool done() const { return p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

void PutString(std::string* out, const std::string& s) {
  uint8_t len[2];
  Writer(len).Put(static_cast<uint16_t>(s.size()));
  out->append(reinterpret_cast<const char*>(len), 2);
  out->append(s);
}

template <typename T>
void PutValue(std::string* out, T v) {
  uint8_t buf[sizeof(T)];
  Writer(buf).Put(v);
  out->append(reinterpret_cast<const char*>(buf), sizeof(T));
}

bool IsDataCommand(Command c) {
  return c == Command::kInit || c == Command::kPush || c == Command::kBroadcast;
}

}  // namespace

const char* RoleName(Role r) {
  switch (r) {
    case Role::kScheduler: return "scheduler";
    case Role::kServer: return "server";
    case Role::kWorker: return "worker";
  }
  return "?";
}

const char* CommandName(Command c) {
  switch (c) {
    case Command::kRegister: return "REGISTER";
    case Command::kNodeTable: return "NODE_TABLE";
    case Command::kBarrier: return "BARRIER";
    case Command::kBarrierDone: return "BARRIER_DONE";
    case Command::kFinish: return "FINISH";
    case Command::kShutdown: return "SHUTDOWN";
    case Command::kNodeFailed: return "NODE_FAILED";
    case Command::kError: return "ERROR";
    case Command::kHello: return "HELLO";
    case Command::kInit: return "INIT";
    case Command::kPush: return "PUSH";
    case Command::kBroadcast: return "BROADCAST";
    case Command::kBye: return "BYE";
    case Command::kRequest: return "REQUEST";
    case Command::kReply: return "REPLY";
    case Command::kHeartbeat: return "HEARTBEAT";
    case Command::kPause: return "PAUSE";
    case Command::kResume: return "RESUME";
  }
  return "?";
}

ByteOrder HostByteOrder() {
  const uint16_t probe = 1;
  uint8_t first;
  std::memcpy(&first, &probe, 1);
  return first == 1 ? ByteOrder::kLittleEndian : ByteOrder::kBigEndian;
}

const char* ByteOrderName(ByteOrder order) {
  switch (order) {
    case ByteOrder::kLittleEndian: return "little-endian";
    case ByteOrder::kBigEndian: return "big-endian";
    case ByteOrder::kUndeclared: break;
  }
  return "undeclared";
}

Status CheckHello(const Header& h, bool* byte_order_mismatch) {
  *byte_order_mismatch = false;
  if (h.command != Command::kHello) return Status::Invalid(std::string("expected HELLO, got ") + CommandName(h.command));
  if (h.payload_bytes != 0) return Status::Invalid("HELLO with a " + std::to_string(h.payload_bytes) + "-byte payload");
  const ByteOrder here = HostByteOrder();
  if (h.byte_order != here) {
    *byte_order_mismatch = true;
    const ByteOrder theirs = h.byte_order == ByteOrder::kLittleEndian || h.byte_order == ByteOrder::kBigEndian
                                 ? h.byte_order
                                 : ByteOrder::kUndeclared;
    return Status::Invalid("worker " + std::to_string(h.sender) + " sends payloads in " + ByteOrderName(theirs) +
                           " byte order, this server's host is " + ByteOrderName(here) + ": p3kv does not convert "
                           "payloads, so every worker and server of a job must run on hosts of one byte order");
  }
  return Status::Ok();
}

bool IsValidCommand(uint8_t raw) { return raw >= 1 && raw < kNumCommands; }

void EncodeHeader(const Header& h, uint8_t out[kHeaderBytes]) {
  std::memset(out, 0, kHeaderBytes);
  Writer w(out);
  w.Put(h.magic);
  w.Put(h.version);
  w.Put(static_cast<uint8_t>(h.command));
  w.Put(h.status);
  w.Put(h.priority);
  w.Put(h.sender);
  w.Put(static_cast<uint8_t>(h.dtype));
  w.Put(static_cast<uint8_t>(h.byte_order));
  w.Put(h.request);
  w.Put(h.slice);
  w.Put(h.key);
  w.Put(h.offset);
  w.Put(h.count);
  w.Put(h.iteration);
  w.Put(h.payload_bytes);
}

bool IsOtherVersion(const uint8_t in[kHeaderBytes]) {
  Reader r(in, kHeaderBytes);
  uint32_t magic = 0;
  uint16_t version = 0;
  r.Get(&magic);
  r.Get(&version);
  return magic == kMagic && version != kProtocolVersion;
}

Status DecodeHeader(const uint8_t in[kHeaderBytes], uint64_t max_payload_bytes, Header* out,
                    const char* limit_name) {
  Reader r(in, kHeaderBytes);
  Header h;
  uint8_t command = 0;
  uint8_t dtype = 0;
  uint8_t byte_order = 0;
  r.Get(&h.magic);
  r.Get(&h.version);
  r.Get(&command);
  r.Get(&h.status);
  r.Get(&h.priority);
  r.Get(&h.sender);
  r.Get(&dtype);
  r.Get(&byte_order);
  r.Get(&h.request);
  r.Get(&h.slice);
  r.Get(&h.key);
  r.Get(&h.offset);
  r.Get(&h.count);
  r.Get(&h.iteration);
  r.Get(&h.payload_bytes);
  if (h.magic != kMagic) return Status::Invalid("bad magic (not a p3kv peer, or a corrupt stream)");
  if (h.version != kProtocolVersion) {
    return Status::Invalid("protocol version " + std::to_string(h.version) + ", expected " +
                           std::to_string(kProtocolVersion) + " (mixed p3kv versions in one job?)");
  }
  if (!IsValidCommand(command)) return Status::Invalid("unknown command " + std::to_string(command));
  if (!IsValidDType(dtype)) return Status::Invalid("unknown dtype " + std::to_string(dtype));
  h.command = static_cast<Command>(command);
  h.dtype = static_cast<DType>(dtype);
  if (h.status != 0) {
    if (h.command != Command::kReply && h.command != Command::kError) {
      return Status::Invalid(std::string("a status on a ") + CommandName(h.command) + " frame");
    }
    if (h.status > static_cast<uint8_t>(Status::Code::kUnsupported)) {
      return Status::Invalid("unknown status " + std::to_string(h.status));
    }
  }
  // Any value is carried; CheckHello judges it (naming what it cannot use).
  h.byte_order = static_cast<ByteOrder>(byte_order);
  if (h.payload_bytes > max_payload_bytes) {
    return Status::Invalid("payload of " + std::to_string(h.payload_bytes) + " bytes exceeds the limit of " +
                           std::to_string(max_payload_bytes) + " (" + limit_name + ")");
  }
  if (IsDataCommand(h.command)) {
    const uint64_t size = DTypeSize(h.dtype);
    if (h.count == 0 || h.count > max_payload_bytes / size) {
      return Status::Invalid("slice element count " + std::to_string(h.count) + " out of range");
    }
    if (h.payload_bytes != 0 && h.payload_bytes != h.count * size) {
      return Status::Invalid("payload of " + std::to_string(h.payload_bytes) + " bytes does not hold " +
                             std::to_string(h.count) + " " + DTypeName(h.dtype) + " elements");
    }
    if (h.command != Command::kInit && h.payload_bytes == 0) {
      return Status::Invalid(std::string(CommandName(h.command)) + " frame without payload");
    }
  } else if (h.payload_bytes > kMaxControlBytes && h.command != Command::kRequest && h.command != Command::kReply) {
    // Requests and replies may carry optimizer states (as large as the parameters): they get the data limit.
    return Status::Invalid("control frame of " + std::to_string(h.payload_bytes) + " bytes");
  }
  *out = h;
  return Status::Ok();
}

std::string EncodeRegistration(const Registration& r) {
  std::string out;
  PutValue(&out, static_cast<uint8_t>(r.role));
  PutString(&out, r.host);
  PutValue(&out, r.port);
  PutValue(&out, r.num_worker);
  PutValue(&out, r.num_server);
  PutValue(&out, r.rank);
  return out;
}

Status DecodeRegistration(const std::string& bytes, Registration* out) {
  Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  uint8_t role;
  Registration reg;
  if (!r.Get(&role) || role > static_cast<uint8_t>(Role::kWorker) || !r.GetString(&reg.host) ||
      !r.Get(&reg.port) || !r.Get(&reg.num_worker) || !r.Get(&reg.num_server) ||
      (!r.done() && (!r.Get(&reg.rank) || !r.done()))) {
    return Status::Invalid("malformed registration");
  }
  reg.role = static_cast<Role>(role);
  *out = reg;
  return Status::Ok();
}

std::string EncodeNodeTable(const NodeTable& t) {
  std::string out;
  PutValue(&out, t.your_rank);
  PutValue(&out, static_cast<uint32_t>(t.nodes.size()));
  for (const NodeInfo& n : t.nodes) {
    PutValue(&out, static_cast<uint8_t>(n.role));
    PutValue(&out, n.rank);
    PutString(&out, n.host);
    PutValue(&out, n.port);
  }
  return out;
}

Status DecodeNodeTable(const std::string& bytes, NodeTable* out) {
  Reader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  NodeTable t;
  uint32_t n;
  if (!r.Get(&t.your_rank) || !r.Get(&n) || n > 1u << 16) return Status::Invalid("malformed node table");
  for (uint32_t i = 0; i < n; ++i) {
    NodeInfo info;
    uint8_t role;
    if (!r.Get(&role) || role > static_cast<uint8_t>(Role::kWorker) || !r.Get(&info.rank) ||
        !r.GetString(&info.host) || !r.Get(&info.port)) {
      return Status::Invalid("malformed node table entry");
    }
    info.role = static_cast<Role>(role);
    t.nodes.push_back(info);
  }
  if (!r.done()) return Status::Invalid("trailing bytes after node table");
  *out = t;
  return Status::Ok();
}

}  // namespace p3
