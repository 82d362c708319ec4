#include "request_tracker.h"

#include <set>
#include <utility>

namespace p3 {

Status RequestTracker::Declare(uint64_t key, Key k) {
  if (keys_.count(key) != 0) return Status::Invalid("key '" + k.name + "' is already initialised");
  keys_[key].key = std::move(k);
  return Status::Ok();
}

const RequestTracker::Key* RequestTracker::Find(uint64_t key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &it->second.key;
}

std::string RequestTracker::Name(uint64_t key) const {
  const Key* k = Find(key);
  return k == nullptr ? std::to_string(key) : k->name;
}

uint64_t RequestTracker::Begin(uint64_t key, char* out, Callback done, Completion* now, std::weak_ptr<SendHold> hold) {
  KeyState& ks = keys_.at(key);
  const uint64_t iteration = ks.next_iteration++;
  if (ks.key.slices.empty()) {
    now->done = std::move(done);
    now->completed = true;
  } else {
    ks.ops.push_back(Op{iteration, out, ks.key.slices.size(), std::move(done), 0, Status(), std::move(hold)});
  }
  return iteration;
}

bool RequestTracker::StillSending(const Op& op) {
  std::shared_ptr<SendHold> hold = op.hold.lock();
  if (!hold) return false;
  // Asked before this reference goes: if it turns out to be the last one, the release is reported all the same.
  hold->Want();
  return true;
}

RequestTracker::Completion RequestTracker::TryRelease(KeyState* ks, std::deque<Op>::iterator op) {
  Completion c;
  if (op->failed.ok() || op->writers > 0 || StillSending(*op)) return c;
  c.done = std::move(op->done);
  c.status = op->failed;
  ks->ops.erase(op);
  return c;
}

Status RequestTracker::StartWrite(int server, const Header& h, char** dst) {
  *dst = nullptr;
  auto it = keys_.find(h.key);
  if (it == keys_.end()) return Status::Invalid("broadcast of unknown key " + std::to_string(h.key));
  KeyState& ks = it->second;
  const Key& k = ks.key;
  if (h.slice >= k.slices.size()) {
    return Status::Invalid("broadcast of slice " + std::to_string(h.slice) + " of key '" + k.name +
                           "', which has fewer");
  }
  const Slice& s = k.slices[h.slice];
  if (s.offset != h.offset || s.count != h.count || s.server != server || h.dtype != k.dtype ||
      h.payload_bytes != s.count * DTypeSize(k.dtype)) {
    return Status::Invalid("broadcast of key '" + k.name + "' slice " + std::to_string(h.slice) +
                           " does not match the slice this worker sent");
  }
  if (failed_) return Status::Ok();
  for (Op& op : ks.ops) {
    if (op.iteration != h.iteration) continue;
    if (op.failed.ok()) {
      *dst = op.out + s.offset * DTypeSize(k.dtype);
      ++op.writers;
      ++writers_;
    }
    break;
  }
  return Status::Ok();
}

RequestTracker::Completion RequestTracker::EndWrite(const Header& h, bool ok) {
  Completion c;
  --writers_;
  auto kit = keys_.find(h.key);
  if (kit == keys_.end()) return c;  // (FailAll may have forgotten the operation; keys are never forgotten)
  KeyState& ks = kit->second;
  auto op = ks.ops.begin();
  while (op != ks.ops.end() && op->iteration != h.iteration) ++op;
  if (op == ks.ops.end()) return c;  // FailAll completed it already
  --op->writers;
  // A server rejected the operation (or the job failed) while this slice was being written: the last writer
  // completes it, unless the sender still holds some of its slices.
  if (!op->failed.ok()) return TryRelease(&ks, op);
  if (!ok || failed_) return c;  // a failed read fails the job; FailAll completes the operation
  c.received = true;
  if (--op->remaining == 0) {
    c.completed = true;
    c.done = std::move(op->done);
    ks.ops.erase(op);
  }
  return c;
}

RequestTracker::Completion RequestTracker::Reject(uint64_t key, uint64_t iteration, const Status& error) {
  Completion c;
  auto it = keys_.find(key);
  if (it == keys_.end()) return c;
  KeyState& ks = it->second;
  for (auto op = ks.ops.begin(); op != ks.ops.end(); ++op) {
    if (op->iteration != iteration || !op->failed.ok()) continue;
    // No new writes start; the last writer (EndWrite) or the sender's release (Released) may complete it.
    op->failed = error;
    c = TryRelease(&ks, op);
    break;
  }
  if (ks.error.ok()) ks.error = error;
  return c;
}

RequestTracker::Completion RequestTracker::Released(uint64_t key, uint64_t iteration) {
  auto it = keys_.find(key);
  if (it == keys_.end()) return {};
  KeyState& ks = it->second;
  for (auto op = ks.ops.begin(); op != ks.ops.end(); ++op) {
    if (op->iteration == iteration) return TryRelease(&ks, op);
  }
  return {};  // completed already (its last writer saw the release first)
}

std::vector<RequestTracker::Completion> RequestTracker::FailAll(const Status& status) {
  failed_ = true;
  std::vector<Completion> completions;
  for (auto& [key, ks] : keys_) {
    for (auto op = ks.ops.begin(); op != ks.ops.end();) {
      op->failed = status;
      if (op->writers > 0 || StillSending(*op)) {
        ++op;
        continue;
      }
      completions.push_back(Completion{std::move(op->done), status});
      op = ks.ops.erase(op);
    }
  }
  return completions;
}

bool RequestTracker::Idle(uint64_t key) const {
  auto it = keys_.find(key);
  return it == keys_.end() || it->second.ops.empty();
}

bool RequestTracker::AllIdle() const {
  for (const auto& [key, ks] : keys_) {
    if (!ks.ops.empty()) return false;
  }
  return true;
}

Status RequestTracker::TakeError(uint64_t key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) return Status::Ok();
  Status error;
  std::swap(error, it->second.error);
  return error;
}

Status RequestTracker::TakeAllErrors() {
  Status first;
  for (auto& [key, ks] : keys_) {
    if (first.ok()) first = ks.error;
    ks.error = Status::Ok();
  }
  return first;
}

std::string RequestTracker::Missing() const {
  size_t slices = 0;
  size_t held = 0;
  std::set<int> servers;
  for (const auto& [key, ks] : keys_) {
    for (const Op& op : ks.ops) {
      if (!op.failed.ok()) {
        ++held;  // nothing more is expected of it: it waits for the sender (or a writer) to let go
        continue;
      }
      slices += op.remaining;
      for (const Slice& s : ks.key.slices) servers.insert(s.server);
    }
  }
  std::string names;
  for (int s : servers) names += (names.empty() ? "" : ", ") + std::to_string(s);
  std::string text = std::to_string(slices) + " slices still expected from servers {" + names + "}";
  if (held > 0) text += "; " + std::to_string(held) + " failed operations still held by the sender or a receiver";
  return text;
}

uint64_t RequestTracker::NewRequest() {
  const uint64_t id = next_request_++;
  requests_[id];
  return id;
}

void RequestTracker::Answer(uint64_t id, Status status, std::string reply) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;  // the requester gave up (timeout)
  it->second.done = true;
  it->second.status = std::move(status);
  it->second.reply = std::move(reply);
}

bool RequestTracker::Answered(uint64_t id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.done;
}

Status RequestTracker::TakeAnswer(uint64_t id, std::string* reply) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return Status::Invalid("no request " + std::to_string(id));
  Status st = std::move(it->second.status);
  *reply = std::move(it->second.reply);
  requests_.erase(it);
  return st;
}

}  // namespace p3
