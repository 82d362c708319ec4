// Internal. The only serializer: headers and control payloads to and from bytes. Every decoded field is
// validated here, before anyone allocates or indexes with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "p3/message.h"
#include "p3/status.h"

namespace p3 {

enum class Role : uint8_t { kScheduler = 0, kServer = 1, kWorker = 2 };
const char* RoleName(Role r);

void EncodeHeader(const Header& h, uint8_t out[kHeaderBytes]);
// Checks magic, version, command and dtype, and that the payload fits `max_payload_bytes` (and the
// control limit for control commands) and, for data commands, equals count * dtype size when present.
// `limit_name` says in the error where max_payload_bytes comes from (a variable to raise, or a fixed limit).
Status DecodeHeader(const uint8_t in[kHeaderBytes], uint64_t max_payload_bytes, Header* out,
                    const char* limit_name = "P3_MAX_MESSAGE_BYTES");

// A p3kv header of another protocol version (DecodeHeader refuses it). Its sender is told why in a frame of
// this version, which it refuses in turn naming both versions: each side then says what is wrong.
bool IsOtherVersion(const uint8_t in[kHeaderBytes]);

// Checks a worker's first frame: a HELLO without payload, declaring this host's byte order (the error names
// both orders; *byte_order_mismatch tells that case apart, for the server to tell the worker).
Status CheckHello(const Header& h, bool* byte_order_mismatch);

struct NodeInfo {
  Role role = Role::kWorker;
  int32_t rank = -1;
  std::string host;
  uint16_t port = 0;
};

struct Registration {
  Role role = Role::kWorker;
  std::string host;
  uint16_t port = 0;  // servers: where workers connect
  uint32_t num_worker = 0;
  uint32_t num_server = 0;
  int32_t rank = -1;  // the rank asked for, or -1 (an optional trailing field: older encoders omit it)
};

struct NodeTable {
  int32_t your_rank = -1;
  std::vector<NodeInfo> nodes;  // every server and worker, servers in rank order first
};

std::string EncodeRegistration(const Registration& r);
Status DecodeRegistration(const std::string& bytes, Registration* out);
std::string EncodeNodeTable(const NodeTable& t);
Status DecodeNodeTable(const std::string& bytes, NodeTable* out);

}  // namespace p3
