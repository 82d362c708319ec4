// Public. The server's update function for MXNet's optimizers (the paper's server-side update, per slice).
//
// With a kernel (p3/optimizer.h) every slice is updated in C++: each slice keeps its optimizer states, and what
// MXNet computes once per parameter and update (learning rate after the scheduler and multipliers, weight decay,
// the update count) comes from `StepSource`, which is asked once per key and iteration — not per slice — and
// shared by all of the key's slices on this server. Optimizers without a kernel (user-defined ones) run through
// a per-slice fallback function (MXNet's own update in Python). With neither, the value becomes the aggregate.
// A kernel may be limited to some keys (SetKernelKeys): the others are aggregated only (p3kv.torch's server
// placement broadcasts BatchNorm's running statistics through keys the optimizer must not touch).
//
// Thread-safety: none. Every method runs on the server's consumer thread (Update is called there, and control
// requests that change the optimizer or read its states are answered there, in order with the data).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "p3/optimizer.h"
#include "p3/status.h"
#include "p3/update.h"

namespace p3 {

class SliceOptimizer {
 public:
  // Fills `step` for one update of `key`; asked once per key and iteration.
  using StepSource = std::function<Status(uint64_t key, StepParams* step)>;

  // What a new optimizer does with the slices' states.
  enum class StateCarry {
    // MXNet's dist_sync: a new optimizer gets a new Updater, so no slice keeps a state. The float32 copy of
    // float16 weights under multi_precision is kept where the new kernel keeps one too: dist_sync keeps its
    // float32 copy of the weights, which is the weights, not an optimizer state.
    kDrop,
    // Every slice keeps its states (a changed copy of the same optimizer): checked at each slice's next update.
    kKeep,
  };
  // A new optimizer applies between two iterations: UseKernel, UseFunction and Clear refuse (Invalid, naming the
  // key) while a key is partly updated here in an iteration (some of its slices updated, others not), or its
  // other slices would be updated by another optimizer and ask for their step a second time. The workers
  // drain their pushes before they send such a request (p3kv.mxnet.kvstore).
  [[nodiscard]] Status UseKernel(const OptimizerSpec& spec, StepSource steps, StateCarry carry = StateCarry::kDrop);
  // Uses a per-slice function from now on (no kernel); drops every state.
  [[nodiscard]] Status UseFunction(Updater fn);
  // Back to aggregate only; drops every state.
  [[nodiscard]] Status Clear();
  // Ok when no key is partly updated in an iteration here; otherwise which one.
  Status BetweenIterations() const;
  bool has_kernel() const { return kernel_; }
  // With a kernel: only `keys` are updated by it, every other key's value becomes its aggregate (no state, no
  // step asked). UseKernel, UseFunction and Clear go back to every key.
  void SetKernelKeys(std::vector<uint64_t> keys);

  Status Update(const UpdateRequest& r);

  // One slice's states: NumStates() arrays of `count` elements of `dtype` (StateDType()).
  struct States {
    DType weight = DType::kFloat32;  // the slice's own element type
    DType dtype = DType::kFloat32;
    uint64_t count = 0;
    std::vector<std::vector<char>> arrays;
  };
  // The slices with states, and one slice's states (nullptr if it has none yet).
  std::vector<std::pair<uint64_t, uint32_t>> Slices() const;
  const States* StatesOf(uint64_t key, uint32_t slice) const;
  // Replaces a slice's states (loading saved states); checked against the slice at its next update.
  void SetStates(uint64_t key, uint32_t slice, States states);
  const OptimizerSpec& spec() const { return spec_; }
  // Calls of the StepSource so far (once per key and iteration).
  uint64_t step_calls() const { return step_calls_; }
  // (key, iteration) steps held for slices of the key that have not had their turn yet.
  size_t pending_steps() const { return cached_.size(); }

 private:
  // One key's step in one iteration, shared by its slices here; dropped once every slice of the key had its
  // turn, also the slices that failed (a slice that fails before its step still counts, or the entry would
  // stay). A failed step is kept as its status: the key's other slices report it without asking again (the
  // step source counts updates: asking twice would count the key's update twice).
  struct CachedStep {
    bool asked = false;
    Status status = Status::Ok();
    StepParams params;
    uint32_t uses = 0;
  };
  Status StepFor(const UpdateRequest& r, StepParams* out);
  // A slice of `r`'s key had its turn without reaching its step: returns `why`.
  Status SliceFailed(const UpdateRequest& r, Status why);
  void Reset();

  bool kernel_ = false;
  OptimizerSpec spec_;
  StepSource steps_;
  Updater function_;
  std::map<std::pair<uint64_t, uint32_t>, States> states_;
  std::map<std::pair<uint64_t, uint64_t>, CachedStep> cached_;  // (key, iteration)
  std::set<uint64_t> kernel_keys_;  // empty: every key
  uint64_t step_calls_ = 0;
};

}  // namespace p3
