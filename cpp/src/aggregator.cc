#include "aggregator.h"

#include <algorithm>
#include <cstring>

#include "frame_builder.h"

namespace p3 {
namespace {
// Pushes for later iterations that a slice holds back, per worker; more means a broken or hostile peer.
constexpr size_t kMaxHeldPerWorker = 8;
}  // namespace

size_t Aggregator::held_frames() const {
  size_t n = 0;
  for (const auto& [id, s] : slices_) n += s.held.size();
  return n;
}

Aggregator::Slice* Aggregator::Find(const Header& h) {
  const auto id = std::make_pair(h.key, h.slice);
  auto it = slices_.find(id);
  if (it != slices_.end()) return &it->second;
  if (h.command != Command::kInit) {
    hooks_.reject(h.sender, h, "key " + std::to_string(h.key) + " slice " + std::to_string(h.slice) +
                                   " was never initialised on this server: call init before push");
    return nullptr;
  }
  const uint64_t value_bytes = h.count * DTypeSize(h.dtype);
  const uint64_t needed = value_bytes + h.count * DTypeSize(AccumulatorType(h.dtype)) +
                          (AccumulatorType(h.dtype) != h.dtype ? value_bytes : 0);
  if (slice_budget_ != 0 && needed > slice_budget_ - std::min(slice_budget_, slice_bytes_)) {
    hooks_.reject(h.sender, h, "INIT of key " + std::to_string(h.key) + " slice " + std::to_string(h.slice) + " (" +
                                   std::to_string(h.count) + " elements) needs " + std::to_string(needed) +
                                   " bytes of slice memory, but the server holds " + std::to_string(slice_bytes_) +
                                   " of its " + std::to_string(slice_budget_) + " already (P3_SERVER_SLICE_BYTES): "
                                   "raise it or add servers");
    return nullptr;
  }
  Slice& s = slices_[id];
  s.entry.key = h.key;
  s.entry.slice = h.slice;
  s.entry.offset = h.offset;
  s.entry.count = h.count;
  s.entry.dtype = h.dtype;
  // Allocated once per slice for the job; INIT carries at most the value, so nothing is read into these.
  s.entry.value = std::make_shared<std::vector<char>>(h.count * DTypeSize(h.dtype));
  s.accum.resize(h.count * DTypeSize(AccumulatorType(h.dtype)));
  if (AccumulatorType(h.dtype) != h.dtype) s.rounded.resize(s.entry.value->size());
  s.contributed.assign(static_cast<size_t>(workers_), false);
  s.sent.assign(static_cast<size_t>(workers_), 0);
  slice_bytes_ += s.entry.value->size() + s.accum.size() + s.rounded.size();
  key_slices_[h.key] += 1;
  return &s;
}

void Aggregator::OnFrame(Frame f) {
  const Header& h = f.header;
  Slice* s = Find(h);
  if (s == nullptr) return;
  if (!s->broken.empty()) {
    hooks_.reject(h.sender, h, s->broken);
    return;
  }
  const SliceEntry& e = s->entry;
  if (h.count != e.count || h.dtype != e.dtype || h.offset != e.offset) {
    const std::string why = "slice " + std::to_string(h.slice) + " holds " + std::to_string(e.count) + " " +
                            DTypeName(e.dtype) + " elements at offset " + std::to_string(e.offset) + ", got " +
                            std::to_string(h.count) + " " + DTypeName(h.dtype) + " at " + std::to_string(h.offset) +
                            " from worker " + std::to_string(h.sender) + ": every worker must use the same shape "
                            "and dtype for a key, and init keys in the same order";
    hooks_.reject(h.sender, h, why);
    if (!s->initialized) {
      // The workers disagree on the key itself: it can never initialise. Fail it for everyone who declared it,
      // now and later, instead of leaving them waiting.
      s->broken = why;
      for (int w = 0; w < workers_; ++w) {
        if (s->contributed[static_cast<size_t>(w)]) hooks_.reject(w, h, why);
      }
    }
    return;
  }
  const std::string gone = NeedsDeparted(*s, h.key, h.command == Command::kInit ? 0 : h.iteration);
  if (!gone.empty()) {
    hooks_.reject(h.sender, h, gone);
    if (hooks_.stranded) hooks_.stranded(gone);
    return;
  }
  if (h.command == Command::kInit) {
    OnInit(s, std::move(f));
  } else {
    OnPush(s, std::move(f));
  }
}

void Aggregator::OnInit(Slice* s, Frame f) {
  const Header& h = f.header;
  const size_t w = static_cast<size_t>(h.sender);
  if (s->initialized || s->contributed[w]) {
    hooks_.reject(h.sender, h, "key " + std::to_string(h.key) + " is already initialised");
    return;
  }
  std::vector<char>& value = *s->entry.value;
  if (h.sender == 0) {
    if (f.payload.size() != value.size()) {
      hooks_.reject(h.sender, h, "worker 0's init carries no value");
      return;
    }
    std::memcpy(value.data(), f.payload.data(), value.size());
  }
  s->contributed[w] = true;
  s->sent[w] = std::max<uint64_t>(s->sent[w], 1);
  if (++s->arrived < workers_) return;
  s->initialized = true;
  s->entry.iteration = 0;
  s->arrived = 0;
  s->contributed.assign(s->contributed.size(), false);
  hooks_.broadcast(s->entry, h.priority);
  ReplayHeld(s);
}

void Aggregator::OnPush(Slice* s, Frame f) {
  const Header& h = f.header;
  const size_t w = static_cast<size_t>(h.sender);
  if (s->initialized && h.iteration <= s->entry.iteration) {
    hooks_.reject(h.sender, h, "iteration " + std::to_string(h.iteration) + " of this slice is already complete "
                               "(duplicate or out-of-order push)");
    return;
  }
  if (!s->initialized || h.iteration > s->entry.iteration + 1) {
    // A fast worker is ahead: hold its push until the slice's current iteration completes.
    if (s->held.size() >= kMaxHeldPerWorker * static_cast<size_t>(workers_)) {
      hooks_.reject(h.sender, h, "too many pushes ahead of the slice's current iteration " +
                                     std::to_string(s->entry.iteration));
      return;
    }
    if (hooks_.held) hooks_.held(&f);
    s->sent[w] = std::max(s->sent[w], h.iteration + 1);
    s->held.push_back(std::move(f));
    return;
  }
  if (s->contributed[w]) {
    hooks_.reject(h.sender, h, "second push for iteration " + std::to_string(h.iteration));
    return;
  }
  if (s->arrived == 0) {
    CopyToAccumulator(s->entry.dtype, f.payload.data(), s->accum.data(), s->entry.count);
  } else {
    AddToAccumulator(s->entry.dtype, f.payload.data(), s->accum.data(), s->entry.count);
  }
  s->contributed[w] = true;
  s->sent[w] = std::max(s->sent[w], h.iteration + 1);
  const int32_t priority = h.priority;
  f = Frame();  // the payload is summed: give its buffer and memory share back before the update
  if (++s->arrived == workers_) Complete(s, priority);
}

void Aggregator::Complete(Slice* s, int32_t priority) {
  SliceEntry& e = s->entry;
  e.iteration += 1;
  s->arrived = 0;
  s->contributed.assign(s->contributed.size(), false);
  if (e.value.use_count() > 1) {
    // A broadcast of the previous value is still queued: update a copy (see the file comment).
    e.value = std::make_shared<std::vector<char>>(*e.value);
    value_copies_.fetch_add(1, std::memory_order_relaxed);
  }
  // Float16 sums are rounded only if the update reads them (Aggregated()).
  const bool rounds = AccumulatorType(e.dtype) != e.dtype;
  const UpdateRequest req{e.key, e.slice, e.offset, e.count, e.iteration, e.dtype,
                          rounds ? nullptr : s->accum.data(), e.value->data(), key_slices_[e.key], s->accum.data(),
                          rounds ? s->rounded.data() : nullptr,
                          // The value is this slice's alone now (copied above if a broadcast still held it).
                          rounds ? nullptr : &s->accum, rounds ? nullptr : e.value.get()};
  Status updated;
  if (hooks_.update) {
    updated = hooks_.update(req);
  } else {
    CopyAggregate(req);
  }
  if (updated.ok()) {
    hooks_.broadcast(e, priority);
  } else {
    Header h;
    h.key = e.key;
    h.slice = e.slice;
    h.iteration = e.iteration;
    for (int w = 0; w < workers_; ++w) hooks_.reject(w, h, "the update function failed: " + updated.message());
  }
  // Pushes held for the next iteration go on either way, so a failed update cannot strand them.
  ReplayHeld(s);
}

const void* Aggregated(const UpdateRequest& r) {
  if (r.aggregated != nullptr) return r.aggregated;
  CopyFromAccumulator(r.dtype, r.sum, r.rounded, r.count);
  return r.rounded;
}

void CopyAggregate(const UpdateRequest& r) {
  if (r.sum_buffer != nullptr && r.value_buffer != nullptr && r.sum_buffer->data() == r.sum &&
      r.value_buffer->data() == r.value && r.sum_buffer->size() == r.value_buffer->size()) {
    r.sum_buffer->swap(*r.value_buffer);  // the sum becomes the value without a pass over it
    return;
  }
  if (r.sum != nullptr) {
    CopyFromAccumulator(r.dtype, r.sum, r.value, r.count);
  } else {
    std::memcpy(r.value, r.aggregated, r.count * DTypeSize(r.dtype));
  }
}

void Aggregator::ReplayHeld(Slice* s) {
  std::deque<Frame> held;
  held.swap(s->held);
  for (Frame& f : held) OnPush(s, std::move(f));
}

std::string Aggregator::NeedsDeparted(const Slice& s, uint64_t key, uint64_t iteration) const {
  for (int w = 0; w < workers_; ++w) {
    const uint64_t sent = s.sent[static_cast<size_t>(w)];
    if (!left_[static_cast<size_t>(w)] || sent > iteration) continue;
    const std::string k = "key " + std::to_string(key);
    const std::string last = sent == 0 ? "without declaring " + k : "after its iteration " + std::to_string(sent - 1) +
                                                                       " of " + k;
    const std::string needed = iteration == 0 ? k + " can never initialise"
                                              : "iteration " + std::to_string(iteration) + " of " + k + " (slice " +
                                                    std::to_string(s.entry.slice) + ") can never complete";
    return "worker " + std::to_string(w) + " has left the job (it closed " + last + "), so " + needed +
           ": every worker must run the same number of steps (uneven data shards?)";
  }
  return "";
}

void Aggregator::WorkerLeft(int w) {
  if (w < 0 || w >= workers_) return;
  left_[static_cast<size_t>(w)] = true;
  for (auto& [id, s] : slices_) {
    if (!s.broken.empty()) continue;
    const uint64_t pending = s.initialized ? s.entry.iteration + 1 : 0;
    if (s.arrived > 0) {
      const std::string why = NeedsDeparted(s, s.entry.key, pending);
      if (!why.empty()) {
        // Part of this iteration is summed and the rest can never come: fail it for those who pushed it (later
        // pushes of it are refused by OnFrame).
        SliceId id;
        id.key = s.entry.key;
        id.slice = s.entry.slice;
        id.iteration = pending;
        const Header h = SliceFrame(s.initialized ? Command::kPush : Command::kInit, -1, id, 0, 0);
        for (int v = 0; v < workers_; ++v) {
          if (s.contributed[static_cast<size_t>(v)]) hooks_.reject(v, h, why);
        }
        s.arrived = 0;
        s.contributed.assign(s.contributed.size(), false);
        if (hooks_.stranded) hooks_.stranded(why);
      }
    }
    std::deque<Frame> keep;
    for (Frame& f : s.held) {
      const std::string why = NeedsDeparted(s, s.entry.key, f.header.iteration);
      if (why.empty()) {
        keep.push_back(std::move(f));
        continue;
      }
      hooks_.reject(f.header.sender, f.header, why);
      if (hooks_.stranded) hooks_.stranded(why);
    }
    s.held.swap(keep);
  }
}

}  // namespace p3
