// Internal. The torch_* kinds of p3/optimizer.h: torch 2.13's torch.optim.SGD and Adam/AdamW (foreach=False,
// capturable=False, differentiable=False, fused=None) as per-slice kernels. optimizer.cc dispatches to these for
// the torch kinds; everything MXNet-specific there (multi_precision, float32-only states) does not apply.
//
// All functions are pure and thread-safe; callers own every buffer.
#pragma once

#include <cstdint>

#include "p3/dtype.h"
#include "p3/optimizer.h"
#include "p3/status.h"

namespace p3 {

bool IsTorchKind(OptimizerKind kind);
// Ok for float32, float64 and float16 weights with flags torch accepts; otherwise why not (naming float32).
Status CheckTorchOptimizer(const OptimizerSpec& spec, DType dtype);
// torch_sgd: 1 with momentum (momentum_buffer), else 0; torch_adam: 2, or 3 with amsgrad.
int TorchNumStates(const OptimizerSpec& spec);
// One update of `count` elements, states in the weights' dtype (zeros before the first update). float16 rounds
// after every torch operation, as torch does with float16 tensors (no float32 copy).
void TorchApplyUpdate(const OptimizerSpec& spec, const StepParams& step, DType dtype, void* weight,
                      const void* grad, void* const* states, uint64_t count);

// What torch's Python computes per step as Python floats (double) from the step count, in its order:
// bias_correction1 = 1 - beta1**step, step_size = lr / bias_correction1,
// bias_correction2_sqrt = (1 - beta2**step)**0.5 (pow, as CPython's float ** calls the C library's pow).
struct TorchAdamScalars {
  double step_size = 0.0;
  double bias_correction2_sqrt = 0.0;
};
TorchAdamScalars TorchAdamStepScalars(const OptimizerSpec& spec, const StepParams& step);

}  // namespace p3
