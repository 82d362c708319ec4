// Unit tests of the torch_* optimizer kinds (torch.optim's SGD and Adam/AdamW as per-slice kernels): how many
// states each keeps and in which dtype, that they start as zeros, torch's first-step momentum buffer, what they
// refuse, and a server's SliceOptimizer running them. Bitwise equality with torch itself is tested from Python
// (tests/test_torch_kernels.py), where torch is.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "p3/optimizer.h"
#include "p3/slice_optimizer.h"

using namespace p3;

namespace {

OptimizerSpec TorchSgd(double momentum) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kTorchSgd;
  spec.momentum = momentum;
  return spec;
}

OptimizerSpec TorchAdam(bool amsgrad, bool decoupled = false) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kTorchAdam;
  spec.amsgrad = amsgrad;
  spec.decoupled_weight_decay = decoupled;
  return spec;
}

bool Names(const Status& st, const std::string& what) { return st.message().find(what) != std::string::npos; }

void TestStateCountsFollowTorchsStateDict() {
  CHECK(NumStates(TorchSgd(0.0), DType::kFloat32) == 0);
  CHECK(NumStates(TorchSgd(0.9), DType::kFloat32) == 1);
  CHECK(NumStates(TorchAdam(false), DType::kFloat32) == 2);
  CHECK(NumStates(TorchAdam(true), DType::kFloat32) == 3);
  CHECK(NumStates(TorchAdam(false, true), DType::kFloat64) == 2);
  // States in the parameter's dtype (torch keeps no float32 copy), never a master copy.
  CHECK(StateDType(TorchAdam(true), DType::kFloat64) == DType::kFloat64);
  CHECK(StateDType(TorchSgd(0.9), DType::kFloat32) == DType::kFloat32);
  CHECK(!UpdatesMasterCopy(TorchSgd(0.9), DType::kFloat16));
  CHECK(std::string(OptimizerKindName(OptimizerKind::kTorchSgd)) == "torch_sgd");
  CHECK(std::string(OptimizerKindName(OptimizerKind::kTorchAdam)) == "torch_adam");
}

void TestStatesStartAsZeros() {
  const OptimizerSpec spec = TorchAdam(true);
  std::vector<float> w = {1.5f, -2.0f, 3.0f};
  std::vector<std::vector<float>> s(3, std::vector<float>(3, 7.0f));
  void* ptrs[3] = {s[0].data(), s[1].data(), s[2].data()};
  InitStates(spec, DType::kFloat32, w.data(), ptrs, 3);
  for (const auto& a : s) CHECK(a == std::vector<float>(3, 0.0f));
  CHECK(w == (std::vector<float>{1.5f, -2.0f, 3.0f}));
}

void TestSgdFirstStepCopiesTheGradientIntoTheBuffer() {
  // torch: buf = grad at the first step (not momentum * 0 + (1 - dampening) * grad), then
  // buf = momentum * buf + (1 - dampening) * grad. Values chosen so every operation is exact.
  OptimizerSpec spec = TorchSgd(0.5);
  spec.dampening = 0.5;
  std::vector<float> w = {1.0f, 2.0f}, g = {0.5f, -1.0f}, buf = {0.0f, 0.0f};
  void* s[1] = {buf.data()};
  StepParams st;
  st.lr = 0.5;
  st.t = 1;
  ApplyUpdate(spec, st, DType::kFloat32, w.data(), g.data(), s, 2);
  CHECK(buf == (std::vector<float>{0.5f, -1.0f}));
  CHECK(w == (std::vector<float>{0.75f, 2.5f}));
  st.t = 2;
  ApplyUpdate(spec, st, DType::kFloat32, w.data(), g.data(), s, 2);
  CHECK(buf == (std::vector<float>{0.5f, -1.0f}));  // 0.5 * 0.5 + 0.5 * 0.5; 0.5 * -1 + 0.5 * -1
  CHECK(w == (std::vector<float>{0.5f, 3.0f}));
}

void TestSgdNesterovWeightDecayAndMaximize() {
  // grad = -g (maximize) + wd * w; buf = grad; update with grad + momentum * buf.
  OptimizerSpec spec = TorchSgd(0.5);
  spec.nesterov = true;
  spec.maximize = true;
  std::vector<float> w = {2.0f}, g = {1.0f}, buf = {0.0f};
  void* s[1] = {buf.data()};
  StepParams st;
  st.lr = 1.0;
  st.wd = 0.25;
  st.t = 1;
  ApplyUpdate(spec, st, DType::kFloat32, w.data(), g.data(), s, 1);
  // grad = -1 + 0.25 * 2 = -0.5; buf = -0.5; nesterov grad = -0.5 + 0.5 * -0.5 = -0.75; w = 2 + 0.75.
  CHECK(buf[0] == -0.5f && w[0] == 2.75f);
}

void TestAdamFirstStepMovesEachWeightByAboutLr() {
  // At step 1 the bias corrections cancel: the update is lr * g / (|g| + eps).
  for (bool ams : {false, true}) {
    const OptimizerSpec spec = TorchAdam(ams);
    std::vector<double> w = {1.0, -1.0, 0.0}, g = {2.0, -0.5, 1e-3};
    std::vector<std::vector<double>> s(static_cast<size_t>(NumStates(spec, DType::kFloat64)), std::vector<double>(3));
    std::vector<void*> ptrs;
    for (auto& a : s) ptrs.push_back(a.data());
    InitStates(spec, DType::kFloat64, w.data(), ptrs.data(), 3);
    StepParams st;
    st.lr = 0.01;
    st.t = 1;
    ApplyUpdate(spec, st, DType::kFloat64, w.data(), g.data(), ptrs.data(), 3);
    CHECK(std::fabs(w[0] - 0.99) < 1e-9 && std::fabs(w[1] + 0.99) < 1e-9 && std::fabs(w[2] + 0.01) < 1e-6);
    CHECK(std::fabs(s[0][0] - 0.2) < 1e-12 && std::fabs(s[1][0] - 0.004) < 1e-12);
    if (ams) CHECK(s[2] == s[1]);
  }
}

void TestAdamWDecaysTheWeightsBeforeTheStep() {
  // A zero gradient leaves the moments at zero, so AdamW's update is its decay alone: w * (1 - lr * wd);
  // Adam's L2 decay instead goes through the moments and moves the weight by about lr.
  std::vector<float> w = {4.0f}, g = {0.0f}, m = {0.0f}, v = {0.0f};
  void* s[2] = {m.data(), v.data()};
  StepParams st;
  st.lr = 0.5;
  st.wd = 0.5;
  st.t = 1;
  ApplyUpdate(TorchAdam(false, true), st, DType::kFloat32, w.data(), g.data(), s, 1);
  CHECK(w[0] == 3.0f && m[0] == 0.0f && v[0] == 0.0f);
  w[0] = 4.0f;
  ApplyUpdate(TorchAdam(false, false), st, DType::kFloat32, w.data(), g.data(), s, 1);
  CHECK(std::fabs(w[0] - 3.5f) < 1e-5f && m[0] > 0.0f);
}

void TestRefusalsNameWhatToUse() {
  const Status bf16 = CheckOptimizer(TorchAdam(false), DType::kBFloat16);
  CHECK(!bf16.ok() && Names(bf16, "float32") && Names(bf16, "bfloat16") && Names(bf16, "worker mode"));
  CHECK(CheckOptimizer(TorchSgd(0.9), DType::kFloat16).ok());
  CHECK(StateDType(TorchSgd(0.9), DType::kFloat16) == DType::kFloat16);
  CHECK(!CheckOptimizer(TorchSgd(0.9), DType::kInt32).ok());
  OptimizerSpec mp = TorchSgd(0.9);
  mp.multi_precision = true;
  CHECK(Names(CheckOptimizer(mp, DType::kFloat32), "multi_precision"));
  OptimizerSpec nesterov = TorchSgd(0.0);
  nesterov.nesterov = true;
  CHECK(Names(CheckOptimizer(nesterov, DType::kFloat32), "nesterov"));
  nesterov.momentum = 0.9;
  nesterov.dampening = 0.1;
  CHECK(!CheckOptimizer(nesterov, DType::kFloat32).ok());
  CHECK(CheckOptimizer(TorchSgd(0.9), DType::kFloat32).ok() && CheckOptimizer(TorchAdam(true), DType::kFloat64).ok());
}

void TestSliceOptimizerKeepsOneBufferPerSlice() {
  // The server's path: states created (zeros) at a slice's first update, the key's step asked once per
  // iteration and shared by its slices; t = 1 makes each slice's buffer its gradient.
  SliceOptimizer opt;
  double t = 0;
  CHECK(opt.UseKernel(TorchSgd(0.5), [&t](uint64_t, StepParams* step) {
    step->lr = 1.0;
    step->t = ++t;
    return Status::Ok();
  }).ok());
  std::vector<float> w0 = {0, 0}, w1 = {0, 0}, g0 = {1, 2}, g1 = {3, 4};
  for (uint64_t it = 1; it <= 2; ++it) {
    CHECK(opt.Update(UpdateRequest{7, 0, 0, 2, it, DType::kFloat32, g0.data(), w0.data(), 2}).ok());
    CHECK(opt.Update(UpdateRequest{7, 1, 2, 2, it, DType::kFloat32, g1.data(), w1.data(), 2}).ok());
  }
  CHECK(opt.step_calls() == 2 && t == 2);
  const SliceOptimizer::States* s1 = opt.StatesOf(7, 1);
  CHECK(s1 != nullptr && s1->arrays.size() == 1 && s1->dtype == DType::kFloat32);
  float b[2];
  std::memcpy(b, s1->arrays[0].data(), sizeof b);
  CHECK(b[0] == 4.5f && b[1] == 6.0f);  // 0.5 * 3 + 3, 0.5 * 4 + 4
  CHECK(w1 == (std::vector<float>{-7.5f, -10.0f}) && w0 == (std::vector<float>{-2.5f, -5.0f}));
}

}  // namespace

#define RUN(t) {#t, t}

int main() {
  return p3test::RunTests({
      RUN(TestStateCountsFollowTorchsStateDict),
      RUN(TestStatesStartAsZeros),
      RUN(TestSgdFirstStepCopiesTheGradientIntoTheBuffer),
      RUN(TestSgdNesterovWeightDecayAndMaximize),
      RUN(TestAdamFirstStepMovesEachWeightByAboutLr),
      RUN(TestAdamWDecaysTheWeightsBeforeTheStep),
      RUN(TestRefusalsNameWhatToUse),
      RUN(TestSliceOptimizerKeepsOneBufferPerSlice),
  });
}
