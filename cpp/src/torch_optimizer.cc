// torch.optim's SGD and Adam/AdamW, per element, in the order and with the roundings of torch 2.13's CPU
// kernels, so that a slice updated here holds the bits torch.optim.*(foreach=False) leaves in the same elements
// of the whole tensor (tests/test_torch_kernels.py compares them bit for bit).
//
// How torch rounds (ATen's CPU kernels, float32 and float64 tensors):
// - a Python float passed to an operator becomes the tensor's element type before the operator runs
//   (Scalar::to<scalar_t>, or a wrapped 0-dim double tensor cast by TensorIterator), so every scalar below is
//   the double torch's Python computes, cast to C once;
// - each operator rounds its result to C (one torch op = one rounding), except that torch's kernels fuse
//   a multiply-add into one FMA where their source is `a + b * c` or vec::fmadd (add with alpha, lerp,
//   addcmul): here std::fma in those places and nowhere else;
// - addcdiv is self + (value * t1) / t2: a quotient added, never fused;
// - what torch's Python computes per step (bias corrections, step size, 1 - lr * wd) is double arithmetic in
//   Python's order, computed here from StepParams (TorchAdamStepScalars).
//
// StepParams for the torch kinds:
//   lr, wd: the param group's lr and weight_decay (Python floats);
//   rescale_grad: the gradient is multiplied by it first (one rounding, as grad.mul_(s)); 1.0 skips it;
//   clip_gradient: >= 0 clamps the gradient to [-c, c] after rescaling (torch's clip_grad_value_); < 0 none;
//   t: torch_adam: torch's state['step'] after this update (1 on the first update); torch_sgd: 1 (or less)
//      on the update that creates the momentum buffer (torch's `momentum_buffer is None`), more after it;
//   extra[]: unused.
#include "torch_optimizer.h"

#include <cmath>
#include <string>

namespace p3 {
namespace {

// A double product and difference that the compiler may not contract into an FMA: torch's Python computes
// 1 - lr * wd with two roundings.
double OneMinusProduct(double a, double b) {
  volatile double p = a * b;
  return 1.0 - p;
}

// torch's lerp (ATen's Lerp.h): the formula depends on whether the weight is small; both vectorized and
// scalar paths are one FMA.
template <class C>
inline C Lerp(C self, C end, C weight) {
  return std::fabs(weight) < C(0.5) ? std::fma(weight, end - self, self) : std::fma(weight - C(1), end - self, end);
}

// torch.maximum: NaN if either is NaN.
template <class C>
inline C Maximum(C a, C b) {
  if (std::isnan(a) || std::isnan(b)) return a + b;
  return a > b ? a : b;
}

// The gradient as torch's step sees it: rescaled and clipped as the caller asks, negated under maximize.
template <class C>
struct GradPrep {
  bool rescale, clip, negate;
  C scale, bound;
  GradPrep(const OptimizerSpec& sp, const StepParams& st)
      : rescale(st.rescale_grad != 1.0), clip(st.clip_gradient >= 0), negate(sp.maximize),
        scale(static_cast<C>(st.rescale_grad)), bound(static_cast<C>(st.clip_gradient)) {}
  inline C operator()(C g) const {
    if (rescale) g = g * scale;
    if (clip) g = g < -bound ? -bound : (g > bound ? bound : g);
    return negate ? -g : g;
  }
};

// _single_tensor_sgd: grad (+ wd * param), buffer = grad at first, then buf * momentum + (1 - dampening) * grad;
// nesterov: grad + momentum * buf; param + (-lr) * grad.
template <class C>
void Sgd(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g, C* __restrict buf,
         uint64_t n) {
  const GradPrep<C> prep(sp, st);
  const bool decay = st.wd != 0, mom = sp.momentum != 0, first = st.t <= 1, nesterov = sp.nesterov;
  const C wd = static_cast<C>(st.wd), mu = static_cast<C>(sp.momentum);
  const C damp = static_cast<C>(1 - sp.dampening), neglr = static_cast<C>(-st.lr);
  for (uint64_t i = 0; i < n; ++i) {
    C d = prep(g[i]);
    if (decay) d = std::fma(w[i], wd, d);  // grad.add(param, alpha=wd)
    if (mom) {
      C b = d;                                       // first step: grad.detach().clone()
      if (!first) b = std::fma(d, damp, buf[i] * mu);  // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
      buf[i] = b;
      d = nesterov ? std::fma(b, mu, d) : b;         // grad.add(buf, alpha=momentum)
    }
    w[i] = std::fma(d, neglr, w[i]);  // param.add_(grad, alpha=-lr)
  }
}

// _single_tensor_adam with capturable=False: the step's scalars are Python floats.
template <class C>
void Adam(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
          C* __restrict exp_avg, C* __restrict exp_avg_sq, C* __restrict max_sq, uint64_t n) {
  const GradPrep<C> prep(sp, st);
  const TorchAdamScalars sc = TorchAdamStepScalars(sp, st);
  const bool decay = st.wd != 0, decoupled = sp.decoupled_weight_decay, ams = sp.amsgrad;
  const C wd = static_cast<C>(st.wd), shrink = static_cast<C>(OneMinusProduct(st.lr, st.wd));
  const C w1 = static_cast<C>(1 - sp.beta1), b2 = static_cast<C>(sp.beta2), w2 = static_cast<C>(1 - sp.beta2);
  const C bc2 = static_cast<C>(sc.bias_correction2_sqrt), eps = static_cast<C>(sp.epsilon);
  const C negstep = static_cast<C>(-sc.step_size);
  for (uint64_t i = 0; i < n; ++i) {
    C d = prep(g[i]);
    C p = w[i];
    if (decay) {
      if (decoupled) {
        p = p * shrink;  // param.mul_(1 - lr * weight_decay)
      } else {
        d = std::fma(p, wd, d);  // grad.add(param, alpha=weight_decay)
      }
    }
    const C m = Lerp(exp_avg[i], d, w1);           // exp_avg.lerp_(grad, 1 - beta1)
    const C v = std::fma(w2 * d, d, exp_avg_sq[i] * b2);  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    C s = v;
    if (ams) {
      s = Maximum(max_sq[i], v);  // torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
      max_sq[i] = s;
    }
    const C denom = std::sqrt(s) / bc2 + eps;  // (sqrt() / bias_correction2_sqrt).add_(eps)
    w[i] = p + (negstep * m) / denom;          // param.addcdiv_(exp_avg, denom, value=-step_size)
  }
}

template <class C>
void Update(const OptimizerSpec& sp, const StepParams& st, C* w, const C* g, void* const* s, uint64_t n) {
  auto state = [s](int k) { return static_cast<C*>(s[k]); };
  if (sp.kind == OptimizerKind::kTorchSgd) {
    Sgd<C>(sp, st, w, g, sp.momentum != 0 ? state(0) : nullptr, n);
  } else {
    Adam<C>(sp, st, w, g, state(0), state(1), sp.amsgrad ? state(2) : nullptr, n);
  }
}

}  // namespace

bool IsTorchKind(OptimizerKind kind) { return kind == OptimizerKind::kTorchSgd || kind == OptimizerKind::kTorchAdam; }

Status CheckTorchOptimizer(const OptimizerSpec& spec, DType dtype) {
  const std::string name = OptimizerKindName(spec.kind);
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    return Status::Invalid("optimizer " + name + " updates float32 (and float64) weights only, not " +
                           DTypeName(dtype) + ": its kernels match torch.optim bit for bit on float32; for " +
                           DTypeName(dtype) + " parameters use worker mode (the workers run torch's optimizer)");
  }
  if (spec.multi_precision) {
    return Status::Invalid("optimizer " + name + ": multi_precision is MXNet's; torch's optimizers keep no float32 "
                           "copy of the weights (drop multi_precision)");
  }
  if (spec.kind == OptimizerKind::kTorchSgd) {
    if (spec.momentum < 0 || spec.dampening < 0) {
      return Status::Invalid("optimizer torch_sgd: momentum and dampening must be >= 0 (torch.optim.SGD refuses "
                             "negative momentum)");
    }
    if (spec.nesterov && (spec.momentum <= 0 || spec.dampening != 0)) {
      return Status::Invalid("optimizer torch_sgd: nesterov needs a momentum > 0 and zero dampening (as "
                             "torch.optim.SGD requires)");
    }
  } else if (!(spec.beta1 >= 0 && spec.beta1 < 1 && spec.beta2 >= 0 && spec.beta2 < 1 && spec.epsilon >= 0)) {
    return Status::Invalid("optimizer torch_adam: betas must be in [0, 1) and eps >= 0 (as torch.optim.Adam "
                           "requires)");
  }
  return Status::Ok();
}

int TorchNumStates(const OptimizerSpec& spec) {
  if (spec.kind == OptimizerKind::kTorchSgd) return spec.momentum != 0 ? 1 : 0;
  return spec.amsgrad ? 3 : 2;
}

TorchAdamScalars TorchAdamStepScalars(const OptimizerSpec& spec, const StepParams& step) {
  // torch's step is a float32 tensor: _get_value() gives its value as a Python float.
  const double t = static_cast<double>(static_cast<float>(step.t));
  const double bias_correction1 = 1 - std::pow(spec.beta1, t);
  const double bias_correction2 = 1 - std::pow(spec.beta2, t);
  TorchAdamScalars out;
  out.step_size = step.lr / bias_correction1;
  out.bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
  return out;
}

void TorchApplyUpdate(const OptimizerSpec& spec, const StepParams& step, DType dtype, void* weight,
                      const void* grad, void* const* states, uint64_t count) {
  if (dtype == DType::kFloat32) {
    Update<float>(spec, step, static_cast<float*>(weight), static_cast<const float*>(grad), states, count);
  } else if (dtype == DType::kFloat64) {
    Update<double>(spec, step, static_cast<double*>(weight), static_cast<const double*>(grad), states, count);
  }
  // CheckTorchOptimizer refuses every other dtype.
}

}  // namespace p3
