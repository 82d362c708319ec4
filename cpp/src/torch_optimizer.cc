// torch.optim's SGD and Adam/AdamW, per element, in the order and with the roundings of torch 2.13's CPU
// kernels, so that a slice updated here holds the bits torch.optim.*(foreach=False) leaves in the same elements
// of the whole tensor (tests/test_torch_kernels.py compares them bit for bit).
//
// How torch rounds (ATen's CPU kernels, float32 and float64 tensors; float16: see the comment above HalfGradPrep):
// - a Python float passed to an operator becomes the tensor's element type before the operator runs
//   (Scalar::to<scalar_t>, or a wrapped 0-dim double tensor cast by TensorIterator), so every scalar below is
//   the double torch's Python computes, cast to C once;
// - each operator rounds its result to C (one torch op = one rounding), except that torch's kernels fuse
//   a multiply-add into one FMA where their source is `a + b * c` or vec::fmadd (add with alpha, lerp,
//   addcmul): here std::fma in those places and nowhere else;
// - addcdiv is self + (value * t1) / t2: a quotient added, never fused;
// - what torch's Python computes per step (bias corrections, step size, 1 - lr * wd) is double arithmetic in
//   Python's order, computed here from StepParams (TorchAdamStepScalars).
// One exception keeps Adam/AdamW from torch's bits on float32/float64: torch's CPU sqrt is MKL's vector sqrt
// (VML, high accuracy), not IEEE-rounded (about 17% of float32 results 1 ulp off); here std::sqrt (IEEE).
// tests/test_torch_kernels.py shows that this is the only difference, and bounds its effect.
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
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

// The compiler may fuse nothing on its own: an FMA where torch has none changes the last bit. (Builds without
// -mfma cannot fuse anyway; the FMA clones below could.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__GNUC__) && defined(__x86_64__)
// Each kernel is also compiled for AVX2+FMA, chosen at run time: std::fma is then one instruction and the loops
// vectorise (same bits: every operation is still IEEE-rounded once, as in the portable build, where std::fma
// calls the C library's fma).
#define P3_TORCH_FMA_CLONES 1
#define P3_INLINE inline __attribute__((always_inline))
#else
#define P3_INLINE inline
#endif

namespace p3 {
namespace {

// A double product and difference that the compiler may not contract into an FMA: torch's Python computes
// 1 - lr * wd with two roundings.
double OneMinusProduct(double a, double b) {
  volatile double p = a * b;
  return 1.0 - p;
}

template <class C>
C AllOnesNaN() {
  using Bits = std::conditional_t<sizeof(C) == 4, uint32_t, uint64_t>;
  const Bits ones = ~Bits(0);
  C out;
  std::memcpy(&out, &ones, sizeof out);
  return out;
}

// torch's lerp (ATen's Lerp.h): the formula depends on whether the weight is small; both vectorized and
// scalar paths are one FMA.
template <class C>
P3_INLINE C Lerp(C self, C end, C weight) {
  return std::fabs(weight) < C(0.5) ? std::fma(weight, end - self, self) : std::fma(weight - C(1), end - self, end);
}

// torch.maximum as its vectorized kernel computes it: the larger, or if either is NaN, the NaN with every bit set.
template <class C>
P3_INLINE C Maximum(C a, C b) {
  return std::isnan(a) || std::isnan(b) ? AllOnesNaN<C>() : (a > b ? a : b);
}

// The gradient as torch's step sees it: rescaled and clipped as the caller asks, negated under maximize. Written
// without branches so that the loops vectorise: a scale of 1 and a clipping bound of +inf change no bit.
template <class C>
struct GradPrep {
  C scale, bound;
  bool negate;
  GradPrep(const OptimizerSpec& sp, const StepParams& st)
      : scale(static_cast<C>(st.rescale_grad)),
        bound(st.clip_gradient >= 0 ? static_cast<C>(st.clip_gradient) : std::numeric_limits<C>::infinity()),
        negate(sp.maximize) {}
  P3_INLINE C operator()(C g) const {
    g = g * scale;
    g = g < -bound ? -bound : (g > bound ? bound : g);
    return negate ? -g : g;
  }
};

// _single_tensor_sgd: grad (+ wd * param), buffer = grad at first, then buf * momentum + (1 - dampening) * grad;
// nesterov: grad + momentum * buf; param + (-lr) * grad. Per element both sides of each choice are computed and
// one is selected (the choices are the same for every element), so the loop vectorises.
template <class C, bool kMomentum>
P3_INLINE void Sgd(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
                   C* __restrict buf, uint64_t n) {
  const GradPrep<C> prep(sp, st);
  const bool decay = st.wd != 0, first = st.t <= 1, nesterov = sp.nesterov;
  const C wd = static_cast<C>(st.wd), mu = static_cast<C>(sp.momentum);
  const C damp = static_cast<C>(1 - sp.dampening), neglr = static_cast<C>(-st.lr);
  for (uint64_t i = 0; i < n; ++i) {
    C d = prep(g[i]);
    const C p = w[i];
    d = decay ? std::fma(p, wd, d) : d;  // grad.add(param, alpha=wd)
    if (kMomentum) {
      // First step: grad.detach().clone(); then buf.mul_(momentum).add_(grad, alpha=1 - dampening).
      const C b = first ? d : std::fma(d, damp, buf[i] * mu);
      buf[i] = b;
      d = nesterov ? std::fma(b, mu, d) : b;  // grad.add(buf, alpha=momentum)
    }
    w[i] = std::fma(d, neglr, p);  // param.add_(grad, alpha=-lr)
  }
}

// _single_tensor_adam with capturable=False: the step's scalars are Python floats.
template <class C, bool kAmsgrad>
P3_INLINE void Adam(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
                    C* __restrict exp_avg, C* __restrict exp_avg_sq, C* __restrict max_sq, uint64_t n) {
  const GradPrep<C> prep(sp, st);
  const TorchAdamScalars sc = TorchAdamStepScalars(sp, st);
  const bool l2 = st.wd != 0 && !sp.decoupled_weight_decay, decoupled = st.wd != 0 && sp.decoupled_weight_decay;
  const C wd = static_cast<C>(st.wd), shrink = static_cast<C>(OneMinusProduct(st.lr, st.wd));
  const C w1 = static_cast<C>(1 - sp.beta1), b2 = static_cast<C>(sp.beta2), w2 = static_cast<C>(1 - sp.beta2);
  const C bc2 = static_cast<C>(sc.bias_correction2_sqrt), eps = static_cast<C>(sp.epsilon);
  const C negstep = static_cast<C>(-sc.step_size);
  for (uint64_t i = 0; i < n; ++i) {
    C d = prep(g[i]);
    const C w0 = w[i];
    const C p = decoupled ? w0 * shrink : w0;  // param.mul_(1 - lr * weight_decay)
    d = l2 ? std::fma(w0, wd, d) : d;          // grad.add(param, alpha=weight_decay)
    const C m = Lerp(exp_avg[i], d, w1);                   // exp_avg.lerp_(grad, 1 - beta1)
    const C v = std::fma(w2 * d, d, exp_avg_sq[i] * b2);  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    C s = v;
    if (kAmsgrad) {
      s = Maximum(max_sq[i], v);  // torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
      max_sq[i] = s;
    }
    // (sqrt() / bias_correction2_sqrt).add_(eps). (sqrt's errno keeps this loop scalar: about the speed of
    // MXNet's adam kernel.)
    const C denom = std::sqrt(s) / bc2 + eps;
    w[i] = p + (negstep * m) / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
  }
}

template <class C>
P3_INLINE void Update(const OptimizerSpec& sp, const StepParams& st, C* w, const C* g, void* const* s, uint64_t n) {
  auto state = [s](int k) { return static_cast<C*>(s[k]); };
  if (sp.kind == OptimizerKind::kTorchSgd) {
    if (sp.momentum != 0) {
      Sgd<C, true>(sp, st, w, g, state(0), n);
    } else {
      Sgd<C, false>(sp, st, w, g, nullptr, n);
    }
  } else if (sp.amsgrad) {
    Adam<C, true>(sp, st, w, g, state(0), state(1), state(2), n);
  } else {
    Adam<C, false>(sp, st, w, g, state(0), state(1), nullptr, n);
  }
}

template <class C>
void UpdatePortable(const OptimizerSpec& sp, const StepParams& st, C* w, const C* g, void* const* s, uint64_t n) {
  Update<C>(sp, st, w, g, s, n);
}

#ifdef P3_TORCH_FMA_CLONES
template <class C>
__attribute__((target("avx2,fma"))) void UpdateFma(const OptimizerSpec& sp, const StepParams& st, C* w, const C* g,
                                                   void* const* s, uint64_t n) {
  Update<C>(sp, st, w, g, s, n);
}

bool HasFma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
#endif

template <class C>
void Run(const OptimizerSpec& sp, const StepParams& st, void* w, const void* g, void* const* s, uint64_t n) {
#ifdef P3_TORCH_FMA_CLONES
  if (HasFma()) {
    UpdateFma<C>(sp, st, static_cast<C*>(w), static_cast<const C*>(g), s, n);
    return;
  }
#endif
  UpdatePortable<C>(sp, st, static_cast<C*>(w), static_cast<const C*>(g), s, n);
}

// float16 weights: torch keeps float16 states (no float32 copy) and every torch operation computes in float and
// rounds its result to float16. Scalars: add's alpha, and a Python number added (eps), are cast to float16
// first (Scalar::to<Half>, through float); mul, div, lerp, addcmul and addcdiv keep theirs in float (opmath).
inline float H(float x) { return HalfToFloat(FloatToHalf(x)); }
inline float HalfScalar(double x) { return H(static_cast<float>(x)); }

struct HalfGradPrep {
  float scale, bound;
  bool negate;
  HalfGradPrep(const OptimizerSpec& sp, const StepParams& st)
      : scale(static_cast<float>(st.rescale_grad)),
        bound(st.clip_gradient >= 0 ? H(static_cast<float>(st.clip_gradient)) : std::numeric_limits<float>::infinity()),
        negate(sp.maximize) {}
  float operator()(uint16_t raw) const {
    float g = H(HalfToFloat(raw) * scale);
    g = g < -bound ? -bound : (g > bound ? bound : g);
    return negate ? -g : g;
  }
};

void HalfSgd(const OptimizerSpec& sp, const StepParams& st, uint16_t* w, const uint16_t* g, uint16_t* buf,
             uint64_t n) {
  const HalfGradPrep prep(sp, st);
  const bool decay = st.wd != 0, mom = sp.momentum != 0, first = st.t <= 1, nesterov = sp.nesterov;
  const float wd = HalfScalar(st.wd), mu = static_cast<float>(sp.momentum), mu_alpha = HalfScalar(sp.momentum);
  const float damp = HalfScalar(1 - sp.dampening), neglr = HalfScalar(-st.lr);
  for (uint64_t i = 0; i < n; ++i) {
    float d = prep(g[i]);
    const float p = HalfToFloat(w[i]);
    if (decay) d = H(std::fma(p, wd, d));
    if (mom) {
      const float b = first ? d : H(std::fma(d, damp, H(HalfToFloat(buf[i]) * mu)));
      buf[i] = FloatToHalf(b);
      d = nesterov ? H(std::fma(b, mu_alpha, d)) : b;
    }
    w[i] = FloatToHalf(std::fma(d, neglr, p));
  }
}

void HalfAdam(const OptimizerSpec& sp, const StepParams& st, uint16_t* w, const uint16_t* g, uint16_t* exp_avg,
              uint16_t* exp_avg_sq, uint16_t* max_sq, uint64_t n) {
  const HalfGradPrep prep(sp, st);
  const TorchAdamScalars sc = TorchAdamStepScalars(sp, st);
  const bool l2 = st.wd != 0 && !sp.decoupled_weight_decay, decoupled = st.wd != 0 && sp.decoupled_weight_decay;
  const float wd = HalfScalar(st.wd), shrink = static_cast<float>(OneMinusProduct(st.lr, st.wd));
  const float w1 = static_cast<float>(1 - sp.beta1), b2 = static_cast<float>(sp.beta2);
  const float w2 = static_cast<float>(1 - sp.beta2), bc2 = static_cast<float>(sc.bias_correction2_sqrt);
  const float eps = HalfScalar(sp.epsilon), negstep = static_cast<float>(-sc.step_size);
  for (uint64_t i = 0; i < n; ++i) {
    float d = prep(g[i]);
    const float w0 = HalfToFloat(w[i]);
    const float p = decoupled ? H(w0 * shrink) : w0;
    if (l2) d = H(std::fma(w0, wd, d));
    const float m = H(Lerp(HalfToFloat(exp_avg[i]), d, w1));
    const float v = H(std::fma(w2 * d, d, H(HalfToFloat(exp_avg_sq[i]) * b2)));
    exp_avg[i] = FloatToHalf(m);
    exp_avg_sq[i] = FloatToHalf(v);
    float s = v;
    if (max_sq != nullptr) {
      s = Maximum(HalfToFloat(max_sq[i]), v);
      max_sq[i] = FloatToHalf(s);
    }
    const float denom = H(H(H(std::sqrt(s)) / bc2) + eps);
    w[i] = FloatToHalf(p + (negstep * m) / denom);
  }
}

void RunHalf(const OptimizerSpec& sp, const StepParams& st, void* w, const void* g, void* const* s, uint64_t n) {
  auto state = [s](int k) { return static_cast<uint16_t*>(s[k]); };
  uint16_t* wh = static_cast<uint16_t*>(w);
  const uint16_t* gh = static_cast<const uint16_t*>(g);
  if (sp.kind == OptimizerKind::kTorchSgd) {
    HalfSgd(sp, st, wh, gh, sp.momentum != 0 ? state(0) : nullptr, n);
  } else {
    HalfAdam(sp, st, wh, gh, state(0), state(1), sp.amsgrad ? state(2) : nullptr, n);
  }
}

}  // namespace

bool IsTorchKind(OptimizerKind kind) { return kind == OptimizerKind::kTorchSgd || kind == OptimizerKind::kTorchAdam; }

Status CheckTorchOptimizer(const OptimizerSpec& spec, DType dtype) {
  const std::string name = OptimizerKindName(spec.kind);
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kFloat16) {
    return Status::Invalid("optimizer " + name + " updates float32 (and float64, float16) weights only, not " +
                           DTypeName(dtype) + ": its kernels follow torch.optim bit for bit on float32; for " +
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
    Run<float>(spec, step, weight, grad, states, count);
  } else if (dtype == DType::kFloat64) {
    Run<double>(spec, step, weight, grad, states, count);
  } else if (dtype == DType::kFloat16) {
    RunHalf(spec, step, weight, grad, states, count);
  }
  // CheckTorchOptimizer refuses every other dtype.
}

}  // namespace p3
