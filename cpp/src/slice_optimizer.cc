#include "p3/slice_optimizer.h"

#include <cstring>
#include <string>

namespace p3 {

Status SliceOptimizer::UseKernel(const OptimizerSpec& spec, StepSource steps, StateCarry carry) {
  Status st = BetweenIterations();
  if (!st.ok()) return st;
  std::map<std::pair<uint64_t, uint32_t>, States> carried;
  if (carry == StateCarry::kKeep) {
    carried = std::move(states_);
  } else if (kernel_) {
    for (auto& [id, s] : states_) {
      if (!UpdatesMasterCopy(spec_, s.weight) || !UpdatesMasterCopy(spec, s.weight) ||
          s.arrays.size() != static_cast<size_t>(NumStates(spec_, s.weight))) {
        continue;
      }
      const std::vector<char>& master = s.arrays[static_cast<size_t>(MasterStateIndex(spec_))];
      States fresh;
      fresh.weight = s.weight;
      fresh.dtype = StateDType(spec, s.weight);
      fresh.count = s.count;
      // InitStates' zeros for the new kernel's own states, and the weights' float32 copy as it was.
      fresh.arrays.assign(static_cast<size_t>(NumStates(spec, s.weight)), std::vector<char>(master.size()));
      fresh.arrays[static_cast<size_t>(MasterStateIndex(spec))] = master;
      carried.emplace(id, std::move(fresh));
    }
  }
  Reset();
  states_ = std::move(carried);
  spec_ = spec;
  steps_ = std::move(steps);
  kernel_ = true;
  return Status::Ok();
}

Status SliceOptimizer::UseFunction(Updater fn) {
  Status st = BetweenIterations();
  if (!st.ok()) return st;
  Reset();
  function_ = std::move(fn);
  return Status::Ok();
}

Status SliceOptimizer::Clear() {
  Status st = BetweenIterations();
  if (!st.ok()) return st;
  Reset();
  return Status::Ok();
}

void SliceOptimizer::SetKernelKeys(std::vector<uint64_t> keys) {
  kernel_keys_ = std::set<uint64_t>(keys.begin(), keys.end());
}

void SliceOptimizer::Reset() {
  kernel_keys_.clear();
  kernel_ = false;
  steps_ = nullptr;
  function_ = nullptr;
  states_.clear();
  cached_.clear();
}

Status SliceOptimizer::BetweenIterations() const {
  if (cached_.empty()) return Status::Ok();
  const auto& [id, c] = *cached_.begin();
  return Status::Invalid("the optimizer cannot change now: key " + std::to_string(id.first) + " is partly updated " +
                         "in iteration " + std::to_string(id.second) + " on this server (" + std::to_string(c.uses) +
                         " of its slices here updated, the others not yet); a request that changes the optimizer "
                         "or its states must come between two iterations (workers wait for their pushes first, "
                         "as kvstore 'p3' does in set_optimizer and load_optimizer_states)");
}

Status SliceOptimizer::StepFor(const UpdateRequest& r, StepParams* out) {
  auto it = cached_.try_emplace(std::make_pair(r.key, r.iteration)).first;
  CachedStep& c = it->second;
  if (!c.asked) {
    c.status = steps_(r.key, &c.params);
    c.asked = true;
    ++step_calls_;
  }
  const Status st = c.status;
  if (st.ok()) *out = c.params;
  if (++c.uses >= r.key_slices) cached_.erase(it);
  return st;
}

Status SliceOptimizer::SliceFailed(const UpdateRequest& r, Status why) {
  auto it = cached_.try_emplace(std::make_pair(r.key, r.iteration)).first;
  if (++it->second.uses >= r.key_slices) cached_.erase(it);
  return why;
}

Status SliceOptimizer::Update(const UpdateRequest& r) {
  if (!kernel_) {
    if (function_) return function_(r);
    CopyAggregate(r);
    return Status::Ok();
  }
  if (!kernel_keys_.empty() && kernel_keys_.count(r.key) == 0) {  // a key the kernel does not own: summed only
    CopyAggregate(r);
    return Status::Ok();
  }
  const int n = NumStates(spec_, r.dtype);
  const DType state_dtype = StateDType(spec_, r.dtype);
  const size_t state_bytes = r.count * DTypeSize(state_dtype);
  auto it = states_.find(std::make_pair(r.key, r.slice));
  if (it == states_.end()) {  // the slice's first update: MXNet's create_state
    Status st = CheckOptimizer(spec_, r.dtype);
    if (!st.ok()) return SliceFailed(r, st);
    States fresh;
    fresh.weight = r.dtype;
    fresh.dtype = state_dtype;
    fresh.count = r.count;
    fresh.arrays.assign(static_cast<size_t>(n), std::vector<char>(state_bytes));
    std::vector<void*> ptrs;
    for (auto& a : fresh.arrays) ptrs.push_back(a.data());
    InitStates(spec_, r.dtype, r.value, ptrs.data(), r.count);
    it = states_.emplace(std::make_pair(r.key, r.slice), std::move(fresh)).first;
  }
  States& states = it->second;
  if (states.arrays.size() != static_cast<size_t>(n) || states.weight != r.dtype || states.dtype != state_dtype ||
      (n > 0 && states.count != r.count)) {
    return SliceFailed(r, Status::Invalid("the optimizer states of key " + std::to_string(r.key) + " slice " +
                           std::to_string(r.slice) + " are " + std::to_string(states.arrays.size()) +
                           " arrays of " + std::to_string(states.count) + " " + DTypeName(states.dtype) + ", but " +
                           OptimizerKindName(spec_.kind) + " needs " + std::to_string(n) + " of " +
                           std::to_string(r.count) + " " + DTypeName(state_dtype) +
                           " (states saved with another optimizer, dtype or slice size?)"));
  }
  void* ptrs[8];
  if (n > 8) return SliceFailed(r, Status::Invalid("too many optimizer states"));
  for (int i = 0; i < n; ++i) {
    if (states.arrays[static_cast<size_t>(i)].size() != state_bytes) {
      return SliceFailed(r, Status::Invalid("an optimizer state of key " + std::to_string(r.key) +
                                            " has the wrong size"));
    }
    ptrs[i] = states.arrays[static_cast<size_t>(i)].data();
  }
  StepParams step;
  Status st = StepFor(r, &step);
  if (!st.ok()) return st;
  if (UpdatesMasterCopy(spec_, r.dtype) && r.sum != nullptr) {
    ApplyUpdateToMaster(spec_, step, r.value, static_cast<const float*>(r.sum), ptrs, r.count);
  } else {
    ApplyUpdate(spec_, step, r.dtype, r.value, Aggregated(r), ptrs, r.count);
  }
  return Status::Ok();
}

std::vector<std::pair<uint64_t, uint32_t>> SliceOptimizer::Slices() const {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (const auto& [id, s] : states_) out.push_back(id);
  return out;
}

const SliceOptimizer::States* SliceOptimizer::StatesOf(uint64_t key, uint32_t slice) const {
  auto it = states_.find(std::make_pair(key, slice));
  return it == states_.end() ? nullptr : &it->second;
}

void SliceOptimizer::SetStates(uint64_t key, uint32_t slice, States states) {
  states_[std::make_pair(key, slice)] = std::move(states);
}

}  // namespace p3
