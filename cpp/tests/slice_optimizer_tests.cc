// Unit tests of SliceOptimizer (the server's per-slice MXNet optimizer): a new optimizer only between two
// iterations, one step per key and iteration also when slices or the step fail, what a new optimizer keeps, and a
// kernel limited to some keys.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "p3/slice_optimizer.h"

using namespace p3;

namespace {

OptimizerSpec SgdMomentum(bool multi_precision = false) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kSgd;
  spec.momentum = 0.5;
  spec.multi_precision = multi_precision;
  return spec;
}

SliceOptimizer::StepSource FixedStep(int* calls, double lr = 1.0) {
  return [calls, lr](uint64_t, StepParams* step) {
    ++*calls;
    step->lr = lr;
    return Status::Ok();
  };
}

// One float32 slice of 2 elements of `key`, which has `key_slices` slices on this server.
struct Slice {
  std::vector<float> value = {0, 0};
  std::vector<float> grad = {1, 1};
  UpdateRequest Request(uint64_t key, uint32_t slice, uint64_t iteration, uint32_t key_slices) {
    return UpdateRequest{key, slice, 0, 2, iteration, DType::kFloat32, grad.data(), value.data(), key_slices};
  }
};

bool Names(const Status& st, const std::string& what) { return st.message().find(what) != std::string::npos; }

void TestANewOptimizerIsRefusedWhileAKeyIsPartlyUpdated() {
  SliceOptimizer opt;
  int calls = 0;
  CHECK(opt.UseKernel(SgdMomentum(), FixedStep(&calls)).ok());
  Slice s[3];
  CHECK(opt.Update(s[0].Request(3, 0, 1, 3)).ok());  // key 3: one of its three slices here updated
  int other = 0;
  const Status refused = opt.UseKernel(SgdMomentum(), FixedStep(&other, 0.5));
  CHECK(!refused.ok() && Names(refused, "key 3 is partly updated in iteration 1") &&
        Names(refused, "between two iterations"));
  CHECK(!opt.UseFunction([](const UpdateRequest&) { return Status::Ok(); }).ok() && !opt.Clear().ok());
  // The key's other slices go on with the same optimizer and the same step: Python is asked once.
  CHECK(opt.Update(s[1].Request(3, 1, 1, 3)).ok() && opt.Update(s[2].Request(3, 2, 1, 3)).ok());
  CHECK(calls == 1 && other == 0 && opt.step_calls() == 1);
  for (const Slice& x : s) CHECK(x.value[0] == -1.0f && x.value[1] == -1.0f);
  CHECK(opt.pending_steps() == 0);
  CHECK(opt.UseKernel(SgdMomentum(), FixedStep(&other, 0.5)).ok());  // between iterations now
}

void TestASliceFailingBeforeItsStepStillHasItsTurn() {
  SliceOptimizer opt;
  int calls = 0;
  CHECK(opt.UseKernel(SgdMomentum(), FixedStep(&calls)).ok());
  SliceOptimizer::States wrong;  // states of another layout (two arrays where SGD with momentum keeps one)
  wrong.count = 2;
  wrong.arrays.assign(2, std::vector<char>(2 * sizeof(float)));
  opt.SetStates(5, 0, wrong);
  Slice s[2];
  const Status failed = opt.Update(s[0].Request(5, 0, 1, 2));
  CHECK(!failed.ok() && Names(failed, "optimizer states of key 5 slice 0"));
  CHECK(opt.Update(s[1].Request(5, 1, 1, 2)).ok());
  CHECK(calls == 1 && s[1].value[0] == -1.0f);
  CHECK(opt.pending_steps() == 0);  // no entry left behind for (5, 1)
  CHECK(opt.UseKernel(SgdMomentum(), FixedStep(&calls)).ok());
}

void TestAFailedStepIsAskedOnceAndReportedToEverySlice() {
  SliceOptimizer opt;
  int calls = 0;
  CHECK(opt.UseKernel(SgdMomentum(), [&](uint64_t, StepParams*) {
          ++calls;  // the step source counts the key's update (MXNet's _update_count) before it fails
          return Status::Rejected("ValueError: the lr scheduler failed");
        }).ok());
  Slice s[3];
  for (uint32_t i = 0; i < 3; ++i) {
    const Status st = opt.Update(s[i].Request(7, i, 1, 3));
    CHECK(!st.ok() && Names(st, "lr scheduler failed"));
  }
  CHECK(calls == 1 && opt.step_calls() == 1 && opt.pending_steps() == 0);
  for (const Slice& x : s) CHECK(x.value[0] == 0.0f);
}

void TestANewOptimizerDropsStatesButKeepsTheFloat32Weights() {
  SliceOptimizer opt;
  int calls = 0;
  CHECK(opt.UseKernel(SgdMomentum(true), FixedStep(&calls)).ok());
  // A float16 slice (1.0, 2.0) under multi_precision: momentum and the float32 copy of the weights.
  std::vector<uint16_t> half = {0x3c00, 0x4000};
  std::vector<float> sum = {0.25f, 0.25f};
  UpdateRequest r{1, 0, 0, 2, 1, DType::kFloat16, nullptr, half.data(), 1, sum.data(), nullptr};
  CHECK(opt.Update(r).ok());
  Slice f32;
  CHECK(opt.Update(f32.Request(2, 0, 1, 1)).ok());
  const SliceOptimizer::States* before = opt.StatesOf(1, 0);
  CHECK(before != nullptr && before->arrays.size() == 2);
  const std::vector<std::vector<char>> kept = before->arrays;
  std::vector<char> master = before->arrays[static_cast<size_t>(MasterStateIndex(SgdMomentum(true)))];
  float m[2];
  std::memcpy(m, master.data(), sizeof(m));
  CHECK(m[0] == 0.75f && m[1] == 1.75f);
  // Keeping: every state as it was.
  CHECK(opt.UseKernel(SgdMomentum(true), FixedStep(&calls), SliceOptimizer::StateCarry::kKeep).ok());
  CHECK(opt.StatesOf(1, 0) != nullptr && opt.StatesOf(1, 0)->arrays == kept);
  CHECK(opt.StatesOf(2, 0) != nullptr);
  // Dropping (MXNet's new Updater): momentum gone, the float32 weights kept, the float32 slice has no state.
  OptimizerSpec adam;
  adam.kind = OptimizerKind::kAdam;
  adam.multi_precision = true;
  CHECK(opt.UseKernel(adam, FixedStep(&calls)).ok());
  const SliceOptimizer::States* after = opt.StatesOf(1, 0);
  CHECK(after != nullptr && after->arrays.size() == static_cast<size_t>(NumStates(adam, DType::kFloat16)));
  CHECK(after->arrays[static_cast<size_t>(MasterStateIndex(adam))] == master);
  for (size_t i = 0; i < after->arrays.size(); ++i) {
    if (i == static_cast<size_t>(MasterStateIndex(adam))) continue;
    CHECK(after->arrays[i] == std::vector<char>(master.size(), 0));
  }
  CHECK(opt.StatesOf(2, 0) == nullptr);
}

void TestAKernelLimitedToSomeKeysSumsTheOthers() {
  // p3kv.torch's server placement: parameters' keys get the kernel, BatchNorm buffers' keys are only summed.
  SliceOptimizer opt;
  int calls = 0;
  CHECK(opt.UseKernel(SgdMomentum(), FixedStep(&calls)).ok());
  opt.SetKernelKeys({5});
  Slice param, buffer;
  buffer.grad = {3, 4};
  CHECK(opt.Update(param.Request(5, 0, 1, 1)).ok() && opt.Update(buffer.Request(6, 0, 1, 1)).ok());
  CHECK(param.value[0] == -1.0f && buffer.value[0] == 3.0f && buffer.value[1] == 4.0f);
  CHECK(calls == 1 && opt.StatesOf(5, 0) != nullptr && opt.StatesOf(6, 0) == nullptr);
  // A new kernel goes back to every key.
  CHECK(opt.UseKernel(SgdMomentum(), FixedStep(&calls), SliceOptimizer::StateCarry::kKeep).ok());
  CHECK(opt.Update(buffer.Request(6, 0, 2, 1)).ok() && calls == 2 && opt.StatesOf(6, 0) != nullptr);
}

}  // namespace

#define RUN(t) {#t, t}

int main() {
  return p3test::RunTests({
      RUN(TestANewOptimizerIsRefusedWhileAKeyIsPartlyUpdated),
      RUN(TestASliceFailingBeforeItsStepStillHasItsTurn),
      RUN(TestAFailedStepIsAskedOnceAndReportedToEverySlice),
      RUN(TestANewOptimizerDropsStatesButKeepsTheFloat32Weights),
      RUN(TestAKernelLimitedToSomeKeysSumsTheOthers),
  });
}
