// Public. Element-wise optimizer kernels the server runs on each slice it owns, in C++ and without the GIL
// (the paper's server-side update). They follow MXNet 1.9.1's formulas and operation order, so a slice updated
// here ends where MXNet's dist_sync server leaves the same elements of the whole array. The torch_* kinds follow
// torch 2.13's torch.optim formulas instead (src/torch_optimizer.cc; their StepParams are documented there).
//
// Split of work: what MXNet computes once per parameter and update (learning rate after the scheduler and
// lr_mult, weight decay after wd_mult, the update count, bias corrections) arrives as StepParams, computed in
// Python once per key and iteration (p3kv/server_kernels.py); everything per element is here.
//
// State layout: a slice has NumStates() arrays of `count` elements of StateDType(), in the order in which
// MXNet's `create_state_multi_precision` nests its NDArrays, depth first, skipping None (e.g. SGD with
// momentum and multi_precision float16: [momentum, float32 master weights]; Adam: [mean, var]). The torch
// kinds keep torch's state tensors in the weights' dtype, in the order of torch's state_dict: torch_sgd
// [momentum_buffer] (none with momentum 0), torch_adam [exp_avg, exp_avg_sq] (+ [max_exp_avg_sq] with amsgrad);
// torch's 'step' is StepParams::t, counted by the caller.
// All functions are pure and thread-safe; callers own every buffer.
#pragma once

#include <cstdint>
#include <string>

#include "p3/dtype.h"
#include "p3/status.h"

namespace p3 {

enum class OptimizerKind : int {
  kSgd = 0,
  kNag,
  kAdam,
  kRmsProp,
  kAdaGrad,
  kAdaDelta,
  kAdamax,
  kSignum,
  kFtrl,
  kFtml,
  kTorchSgd,   // torch.optim.SGD (foreach=False): lr-free momentum buffer, first buffer = gradient
  kTorchAdam,  // torch.optim.Adam / AdamW (decoupled_weight_decay)
};
constexpr OptimizerKind kLastOptimizerKind = OptimizerKind::kTorchAdam;

// What stays fixed for the optimizer's life (its constructor's arguments). Fields a kind does not use are
// ignored.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  bool multi_precision = false;  // float16 weights keep a float32 master copy (MXNet's multi_precision)
  double momentum = 0.0;         // SGD, NAG, Signum
  double beta1 = 0.9;            // Adam, Adamax, FTML
  double beta2 = 0.999;          // Adam, Adamax, FTML
  double epsilon = 1e-8;         // Adam, FTML, RMSProp, AdaGrad (eps), AdaDelta
  double gamma1 = 0.9;           // RMSProp: decay of the squared-gradient average
  double gamma2 = 0.9;           // RMSProp centered: momentum
  bool centered = false;         // RMSProp
  double clip_weights = -1.0;    // RMSProp: < 0 means no clipping
  double rho = 0.9;              // AdaDelta
  double lamda1 = 0.01;          // FTRL: L1
  double beta = 1.0;             // FTRL
  double wd_lh = 0.0;            // Signum: decoupled weight decay
  // torch.optim's flags (torch_sgd uses momentum, torch_adam beta1/beta2/epsilon above as torch's momentum,
  // betas and eps).
  double dampening = 0.0;               // torch_sgd
  bool nesterov = false;                // torch_sgd
  bool maximize = false;                // torch_sgd, torch_adam
  bool amsgrad = false;                 // torch_adam
  bool decoupled_weight_decay = false;  // torch_adam: AdamW's param *= 1 - lr * weight_decay
};

// What changes per key and update, computed once per key and iteration by the server's Python.
struct StepParams {
  double lr = 0.0;
  double wd = 0.0;
  double rescale_grad = 1.0;
  double clip_gradient = -1.0;  // < 0 means no clipping
  double t = 0.0;               // the key's update count after this update (FTML, torch_adam's step, ...)
  double extra[4] = {0, 0, 0, 0};  // kind-specific (documented in optimizer.cc), if a kind needs more
};

const char* OptimizerKindName(OptimizerKind kind);
// Ok if the kernel can update weights of `dtype`; otherwise why not (integer weights, unknown kind).
Status CheckOptimizer(const OptimizerSpec& spec, DType dtype);
// Number of state arrays of one slice, and their element type (float32 master copies under multi_precision).
int NumStates(const OptimizerSpec& spec, DType dtype);
DType StateDType(const OptimizerSpec& spec, DType dtype);
// Fills a new slice's states as MXNet's create_state_multi_precision does (zeros; master copy = weights).
void InitStates(const OptimizerSpec& spec, DType dtype, const void* weight, void* const* states, uint64_t count);
// One update of `count` elements of `weight` in place, from `grad` (the sum over workers, same dtype).
void ApplyUpdate(const OptimizerSpec& spec, const StepParams& step, DType dtype, void* weight, const void* grad,
                 void* const* states, uint64_t count);

// multi_precision with float16 weights: the update runs on the float32 master copy (a state), so the servers
// can hand it their float32 sum of the workers' gradients unrounded, as MXNet's dist_sync server does with
// multi_precision (its float32 copy of the weights is updated from the float32 sum).
bool UpdatesMasterCopy(const OptimizerSpec& spec, DType dtype);
// UpdatesMasterCopy() only: which of the NumStates() arrays is the float32 master copy of the weights.
int MasterStateIndex(const OptimizerSpec& spec);
// UpdatesMasterCopy() only: updates the master copy from `grad` (count float32 values), then the float16 weights.
void ApplyUpdateToMaster(const OptimizerSpec& spec, const StepParams& step, void* weight, const float* grad,
                         void* const* states, uint64_t count);

}  // namespace p3
