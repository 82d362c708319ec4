// Public. The server's update function for MXNet's optimizers (the paper's server-side update, per slice).
//
// With a kernel (p3/optimizer.h) every slice is updated in C++: each slice keeps its optimizer states, and what
// MXNet computes once per parameter and update (learning rate after the scheduler and multipliers, weight decay,
// the update count) comes from `StepSource`, which is asked once per key and iteration — not per slice — and
// shared by all of the key's slices on this server. Optimizers without a kernel (user-defined ones) run through
// a per-slice fallback function (MXNet's own update in Python). With neither, the value becomes the aggregate.
//
// Thread-safety: none. Every method runs on the server's consumer thread (Update is called there, and control
// requests that change the optimizer or read its states are answered there, in order with the data).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
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

  // Uses a kernel from now on; drops every state and cached step.
  Status UseKernel(const OptimizerSpec& spec, StepSource steps);
  // Uses a per-slice function from now on (no kernel); drops every state.
  void UseFunction(Updater fn);
  // Back to aggregate only.
  void Clear();
  bool has_kernel() const { return kernel_; }

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

 private:
  struct CachedStep {
    StepParams params;
    uint32_t uses = 0;  // slices of the key that applied it; dropped once all have
  };
  Status StepFor(const UpdateRequest& r, StepParams* out);

  bool kernel_ = false;
  OptimizerSpec spec_;
  StepSource steps_;
  Updater function_;
  std::map<std::pair<uint64_t, uint32_t>, States> states_;
  std::map<std::pair<uint64_t, uint64_t>, CachedStep> cached_;  // (key, iteration)
  uint64_t step_calls_ = 0;
};

}  // namespace p3
