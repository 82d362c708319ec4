// Element-wise optimizer kernels, written to reproduce MXNet 1.9.1 bit for bit where possible:
// - fused operators (sgd/nag/adam/rmsprop/ftrl/signum/ftml) parse their scalars into float fields and cast
//   them to the element type, so OpParam() rounds through float; FTML's epsilon is a double field;
// - the NDArray arithmetic of AdaGrad/AdaDelta/Adamax passes Python doubles to scalar operators, which cast
//   them straight to the element type (Scalar()), and rounds after every operator;
// - float16 without multi_precision computes as mshadow's half_t: each operation in float, rounded to half.
// The expression shapes below (association, where a product is formed) follow the operators' order; any
// change of association changes the last bit.
//
// StepParams per kind: lr is the rate MXNet passes to its operator (Adam: the bias-corrected rate, Adamax:
// lr / (1 - beta1^t)); t is used by FTML; clip_gradient < 0 means no clipping (for AdaGrad/AdaDelta/Adamax,
// MXNet clips whenever clip_gradient is not None: the caller passes -1 for None). extra[] is unused.
// The torch_* kinds live in torch_optimizer.cc (their StepParams are documented there); the public functions
// below hand them over.
#include "p3/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "torch_optimizer.h"

namespace p3 {
namespace {

float RoundHalf(float x) { return HalfToFloat(FloatToHalf(x)); }

// mshadow's half_t arithmetic: every operator computes in float and rounds the result to float16.
struct Half {
  float v;
};
inline Half operator+(Half a, Half b) { return {RoundHalf(a.v + b.v)}; }
inline Half operator-(Half a, Half b) { return {RoundHalf(a.v - b.v)}; }
inline Half operator*(Half a, Half b) { return {RoundHalf(a.v * b.v)}; }
inline Half operator/(Half a, Half b) { return {RoundHalf(a.v / b.v)}; }
inline Half operator-(Half a) { return {-a.v}; }
inline bool operator>(Half a, Half b) { return a.v > b.v; }
inline bool operator<(Half a, Half b) { return a.v < b.v; }
inline Half Sqrt(Half a) { return {RoundHalf(std::sqrt(a.v))}; }
inline float Sqrt(float a) { return std::sqrt(a); }
inline double Sqrt(double a) { return std::sqrt(a); }
inline Half Abs(Half a) { return {std::fabs(a.v)}; }
inline float Abs(float a) { return std::fabs(a); }
inline double Abs(double a) { return std::fabs(a); }
inline Half Pow(Half a, Half b) { return {RoundHalf(std::pow(a.v, b.v))}; }
inline float Pow(float a, float b) { return std::pow(a, b); }
inline double Pow(double a, double b) { return std::pow(a, b); }

template <class C> C From(double x);
template <> float From<float>(double x) { return static_cast<float>(x); }
template <> double From<double>(double x) { return x; }
template <> Half From<Half>(double x) { return {RoundHalf(static_cast<float>(x))}; }

// A fused operator's scalar: parsed into a float field, then cast to the element type.
template <class C> C OpParam(double x) { return From<C>(static_cast<float>(x)); }
// A scalar of NDArray arithmetic (`array * python_float`): cast from double to the element type.
template <class C> C Scalar(double x) { return From<C>(x); }
// Clipping bound; +inf (no clipping) leaves every value, NaN included, unchanged.
template <class C> C Bound(double c) { return c >= 0 ? OpParam<C>(c) : From<C>(std::numeric_limits<float>::infinity()); }

template <class C> inline C Clip(C x, C c) { return x > c ? c : (x < -c ? -c : x); }
template <class C> inline C Sign(C x) { return From<C>(static_cast<double>((From<C>(0) < x) - (x < From<C>(0)))); }
template <class C> inline C Max(C a, C b) { return a > b ? a : b; }

// SGD goes through multi_sgd_update / multi_sgd_mom_update (one index: the aggregated op on one array).
template <class C, bool kClip, bool kMom>
void Sgd(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
         C* __restrict mom, uint64_t n) {
  const C lr = OpParam<C>(st.lr), rg = OpParam<C>(st.rescale_grad), c = OpParam<C>(st.clip_gradient);
  const C lrwd = lr * OpParam<C>(st.wd), lrrg = lr * rg, zero = From<C>(0);
  const C mu = kMom ? OpParam<C>(sp.momentum) : zero;
  for (uint64_t i = 0; i < n; ++i) {
    const C step = kClip ? lr * Clip(rg * g[i], c) : lrrg * g[i];
    const C m = (kMom ? mu * mom[i] : zero) - lrwd * w[i] - step;
    if (kMom) mom[i] = m;
    w[i] = w[i] + m;
  }
}

// sgd_update / mp_sgd_update: NAG with momentum 0.
template <class C, bool kClip>
void PlainSgd(const StepParams& st, C* __restrict w, const C* __restrict g, uint64_t n) {
  const C lr = OpParam<C>(st.lr), rg = OpParam<C>(st.rescale_grad), c = OpParam<C>(st.clip_gradient);
  const C decay = From<C>(1) - lr * OpParam<C>(st.wd), lrrg = lr * rg;
  for (uint64_t i = 0; i < n; ++i) w[i] = decay * w[i] - (kClip ? lr * Clip(rg * g[i], c) : lrrg * g[i]);
}

// nag_mom_update writes the weight in place before the momentum reads it again: the momentum's decay term
// uses the new weight (and mp_nag_mom_update does the same with its master copy).
template <class C, bool kClip>
void Nag(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
         C* __restrict mom, uint64_t n) {
  const C lr = OpParam<C>(st.lr), wd = OpParam<C>(st.wd), rg = OpParam<C>(st.rescale_grad);
  const C c = OpParam<C>(st.clip_gradient), mu = OpParam<C>(sp.momentum), mu1 = mu + From<C>(1);
  for (uint64_t i = 0; i < n; ++i) {
    const C m = mu * mom[i];
    const C x = kClip ? Clip(rg * g[i], c) : rg * g[i];
    const C wn = w[i] - m + mu1 * (m - lr * (x + wd * w[i]));
    mom[i] = m - lr * (x + wd * wn);
    w[i] = wn;
  }
}

template <class C>
void Adam(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
          C* __restrict mean, C* __restrict var, uint64_t n) {
  const C lr = OpParam<C>(st.lr), wd = OpParam<C>(st.wd), rg = OpParam<C>(st.rescale_grad);
  const C c = Bound<C>(st.clip_gradient), b1 = OpParam<C>(sp.beta1), b2 = OpParam<C>(sp.beta2);
  const C eps = OpParam<C>(sp.epsilon), one = From<C>(1), ob1 = one - b1, ob2 = one - b2;
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(g[i] * rg + w[i] * wd, c);
    mean[i] = b1 * mean[i] + ob1 * x;
    var[i] = b2 * var[i] + ob2 * x * x;
    w[i] = w[i] - lr * mean[i] / (Sqrt(var[i]) + eps);
  }
}

template <class C>
void RmsProp(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
             C* __restrict sn, uint64_t n) {
  const C lr = OpParam<C>(st.lr), wd = OpParam<C>(st.wd), rg = OpParam<C>(st.rescale_grad);
  const C c = Bound<C>(st.clip_gradient), cw = Bound<C>(sp.clip_weights), g1 = OpParam<C>(sp.gamma1);
  const C eps = OpParam<C>(sp.epsilon), og1 = From<C>(1) - g1;
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(rg * g[i] + wd * w[i], c);
    sn[i] = og1 * (x * x) + g1 * sn[i];
    w[i] = Clip(w[i] - lr * (x / Sqrt(sn[i] + eps)), cw);
  }
}

template <class C>
void RmsPropCentered(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
                     C* __restrict sn, C* __restrict sg, C* __restrict delta, uint64_t n) {
  const C lr = OpParam<C>(st.lr), wd = OpParam<C>(st.wd), rg = OpParam<C>(st.rescale_grad);
  const C c = Bound<C>(st.clip_gradient), cw = Bound<C>(sp.clip_weights), g1 = OpParam<C>(sp.gamma1);
  const C g2 = OpParam<C>(sp.gamma2), eps = OpParam<C>(sp.epsilon), og1 = From<C>(1) - g1;
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(rg * g[i] + wd * w[i], c);
    sn[i] = og1 * x * x + g1 * sn[i];
    sg[i] = og1 * x + g1 * sg[i];
    delta[i] = g2 * delta[i] - lr * x / Sqrt(sn[i] - sg[i] * sg[i] + eps);
    w[i] = Clip(w[i] + delta[i], cw);
  }
}

template <class C>
void Ftrl(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
          C* __restrict z, C* __restrict sn, uint64_t n) {
  const C lr = OpParam<C>(st.lr), wd = OpParam<C>(st.wd), rg = OpParam<C>(st.rescale_grad);
  const C c = Bound<C>(st.clip_gradient), l1 = OpParam<C>(sp.lamda1), beta = OpParam<C>(sp.beta);
  const C zero = From<C>(0), one = From<C>(1);
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(g[i] * rg, c);
    z[i] = z[i] + (x - (Sqrt(sn[i] + x * x) - Sqrt(sn[i])) * w[i] / lr);
    sn[i] = sn[i] + x * x;
    w[i] = (Sign(z[i]) * l1 - z[i]) / ((beta + Sqrt(sn[i])) / lr + wd) * (Abs(z[i]) > l1 ? one : zero);
  }
}

template <class C, bool kClip>
void Signum(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
            C* __restrict mom, uint64_t n) {
  const C lr = OpParam<C>(st.lr), wd = OpParam<C>(st.wd), rg = OpParam<C>(st.rescale_grad);
  const C c = OpParam<C>(st.clip_gradient), mu = OpParam<C>(sp.momentum), omu = From<C>(1) - mu;
  const C omuwd = omu * wd, omurg = omu * rg, decay = From<C>(1) - lr * OpParam<C>(sp.wd_lh);
  for (uint64_t i = 0; i < n; ++i) {
    const C step = kClip ? omu * Clip(rg * g[i], c) : omurg * g[i];
    mom[i] = mu * mom[i] - omuwd * w[i] - step;
    w[i] = decay * w[i] + lr * Sign(mom[i]);
  }
}

// signsgd_update: no rescaling, no clipping; only the gradient's sign.
template <class C>
void SignSgd(const StepParams& st, C* __restrict w, const C* __restrict g, uint64_t n) {
  const C lr = OpParam<C>(st.lr), decay = From<C>(1) - lr * OpParam<C>(st.wd);
  for (uint64_t i = 0; i < n; ++i) w[i] = decay * w[i] - lr * Sign(g[i]);
}

template <class C>
void Ftml(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
          C* __restrict d, C* __restrict v, C* __restrict z, uint64_t n) {
  const C lr = OpParam<C>(st.lr), wd = OpParam<C>(st.wd), rg = OpParam<C>(st.rescale_grad);
  const C c = Bound<C>(st.clip_gradient), b1 = OpParam<C>(sp.beta1), b2 = OpParam<C>(sp.beta2);
  const C eps = From<C>(sp.epsilon), t = From<C>(static_cast<double>(static_cast<int>(st.t)));
  const C one = From<C>(1), ob1 = one - b1, ob2 = one - b2;
  const C scale = (one - Pow(b1, t)) / lr, corr = one - Pow(b2, t);  // per element in MXNet; same value
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(rg * g[i] + wd * w[i], c);
    v[i] = b2 * v[i] + ob2 * (x * x);
    const C dt = scale * (Sqrt(v[i] / corr) + eps);
    z[i] = b1 * z[i] + ob1 * x - (dt - b1 * d[i]) * w[i];
    d[i] = dt;
    w[i] = -z[i] / dt;
  }
}

// AdaGrad's dense update is NDArray arithmetic in Python: one rounding per operator, in this order.
template <class C>
void AdaGrad(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
             C* __restrict h, uint64_t n) {
  const C rg = Scalar<C>(st.rescale_grad), c = Bound<C>(st.clip_gradient), eps = Scalar<C>(sp.epsilon);
  const C wd = Scalar<C>(st.wd), neglr = Scalar<C>(-st.lr);
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(g[i] * rg, c);
    h[i] = h[i] + x * x;
    const C div = x / Sqrt(h[i] + eps);
    w[i] = w[i] + (div + w[i] * wd) * neglr;
  }
}

template <class C>
void AdaDelta(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
              C* __restrict acc_g, C* __restrict acc_d, uint64_t n) {
  const C rg = Scalar<C>(st.rescale_grad), c = Bound<C>(st.clip_gradient), eps = Scalar<C>(sp.epsilon);
  const C wd = Scalar<C>(st.wd), rho = Scalar<C>(sp.rho), orho = Scalar<C>(1.0 - sp.rho);
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(g[i] * rg, c);
    acc_g[i] = acc_g[i] * rho + x * orho * x;
    const C delta = Sqrt(acc_d[i] + eps) / Sqrt(acc_g[i] + eps) * x;
    acc_d[i] = acc_d[i] * rho + delta * orho * delta;
    w[i] = w[i] - (delta + w[i] * wd);
  }
}

template <class C>
void Adamax(const OptimizerSpec& sp, const StepParams& st, C* __restrict w, const C* __restrict g,
            C* __restrict m, C* __restrict u, uint64_t n) {
  const C rg = Scalar<C>(st.rescale_grad), c = Bound<C>(st.clip_gradient), wd = Scalar<C>(st.wd);
  const C lr = Scalar<C>(st.lr), b1 = Scalar<C>(sp.beta1), ob1 = Scalar<C>(1.0 - sp.beta1);
  const C b2 = Scalar<C>(sp.beta2);
  for (uint64_t i = 0; i < n; ++i) {
    const C x = Clip(g[i] * rg + w[i] * wd, c);
    m[i] = m[i] * b1 + x * ob1;
    u[i] = Max(u[i] * b2, Abs(x));
    w[i] = w[i] - m[i] * lr / u[i];
  }
}

bool FloatStateOnly(OptimizerKind k) {
  // MXNet creates these states with zeros(shape) (float32) whatever the weight's type.
  return k == OptimizerKind::kRmsProp || k == OptimizerKind::kAdaGrad || k == OptimizerKind::kAdaDelta ||
         k == OptimizerKind::kFtrl;
}

bool UsesMomentum(OptimizerKind k) {
  return k == OptimizerKind::kSgd || k == OptimizerKind::kNag || k == OptimizerKind::kSignum;
}

int InnerStates(const OptimizerSpec& sp) {
  switch (sp.kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kNag:
    case OptimizerKind::kSignum: return sp.momentum > 0 ? 1 : 0;
    case OptimizerKind::kRmsProp: return sp.centered ? 3 : 1;
    case OptimizerKind::kAdaGrad: return 1;
    case OptimizerKind::kFtml: return 3;
    default: return 2;
  }
}

bool MasterCopy(const OptimizerSpec& sp, DType dtype) {
  return sp.multi_precision && dtype == DType::kFloat16 && !IsTorchKind(sp.kind);
}
// SGD and NAG nest (momentum, master); every other optimizer (master, inner states).
int MasterIndex(const OptimizerSpec& sp) {
  return sp.kind == OptimizerKind::kSgd || sp.kind == OptimizerKind::kNag ? InnerStates(sp) : 0;
}

// One update of n elements held in the compute type C (float, double, or Half buffers).
template <class C>
void Update(const OptimizerSpec& sp, const StepParams& st, C* w, const C* g, C* const* s, uint64_t n) {
  const bool clip = st.clip_gradient >= 0, mom = sp.momentum > 0;
  switch (sp.kind) {
    case OptimizerKind::kSgd:
      if (mom) {
        clip ? Sgd<C, true, true>(sp, st, w, g, s[0], n) : Sgd<C, false, true>(sp, st, w, g, s[0], n);
      } else {
        clip ? Sgd<C, true, false>(sp, st, w, g, nullptr, n) : Sgd<C, false, false>(sp, st, w, g, nullptr, n);
      }
      break;
    case OptimizerKind::kNag:
      if (mom) {
        clip ? Nag<C, true>(sp, st, w, g, s[0], n) : Nag<C, false>(sp, st, w, g, s[0], n);
      } else {
        clip ? PlainSgd<C, true>(st, w, g, n) : PlainSgd<C, false>(st, w, g, n);
      }
      break;
    case OptimizerKind::kAdam: Adam<C>(sp, st, w, g, s[0], s[1], n); break;
    case OptimizerKind::kRmsProp:
      sp.centered ? RmsPropCentered<C>(sp, st, w, g, s[0], s[1], s[2], n) : RmsProp<C>(sp, st, w, g, s[0], n);
      break;
    case OptimizerKind::kAdaGrad: AdaGrad<C>(sp, st, w, g, s[0], n); break;
    case OptimizerKind::kAdaDelta: AdaDelta<C>(sp, st, w, g, s[0], s[1], n); break;
    case OptimizerKind::kAdamax: Adamax<C>(sp, st, w, g, s[0], s[1], n); break;
    case OptimizerKind::kSignum:
      if (mom) {
        clip ? Signum<C, true>(sp, st, w, g, s[0], n) : Signum<C, false>(sp, st, w, g, s[0], n);
      } else {
        SignSgd<C>(st, w, g, n);
      }
      break;
    case OptimizerKind::kFtrl: Ftrl<C>(sp, st, w, g, s[0], s[1], n); break;
    case OptimizerKind::kFtml: Ftml<C>(sp, st, w, g, s[0], s[1], s[2], n); break;
    case OptimizerKind::kTorchSgd:
    case OptimizerKind::kTorchAdam: break;  // ApplyUpdate hands these to torch_optimizer.cc
  }
}

constexpr uint64_t kChunk = 512;
constexpr int kMaxStates = 4;

// multi_precision float16: the float32 master copy is updated from float32 gradients (the float16 gradient
// widened, or the servers' float32 sum when `g32` is given), then cast to float16.
void UpdateWithMaster(const OptimizerSpec& sp, const StepParams& st, uint16_t* w, const uint16_t* g,
                      const float* g32, void* const* states, uint64_t count) {
  const int inner = InnerStates(sp), mi = MasterIndex(sp);
  float* master = static_cast<float*>(states[mi]);
  float* in[kMaxStates] = {};
  for (int k = 0, j = 0; k <= inner; ++k) {
    if (k != mi) in[j++] = static_cast<float*>(states[k]);
  }
  float gbuf[kChunk];
  for (uint64_t off = 0; off < count; off += kChunk) {
    const uint64_t n = count - off < kChunk ? count - off : kChunk;
    const float* grad = g32 != nullptr ? g32 + off : gbuf;
    if (g32 == nullptr) {
      for (uint64_t i = 0; i < n; ++i) gbuf[i] = HalfToFloat(g[off + i]);
    }
    float* s[kMaxStates] = {};
    for (int k = 0; k < inner; ++k) s[k] = in[k] + off;
    Update<float>(sp, st, master + off, grad, s, n);
    for (uint64_t i = 0; i < n; ++i) w[off + i] = FloatToHalf(master[off + i]);
  }
}

// float16 without a master copy: weights and states stay float16, arithmetic rounds as half_t does.
void UpdateHalf(const OptimizerSpec& sp, const StepParams& st, uint16_t* w, const uint16_t* g,
                void* const* states, uint64_t count) {
  const int ns = InnerStates(sp);
  Half wb[kChunk], gb[kChunk], sb[kMaxStates][kChunk];
  for (uint64_t off = 0; off < count; off += kChunk) {
    const uint64_t n = count - off < kChunk ? count - off : kChunk;
    Half* s[kMaxStates] = {};
    for (uint64_t i = 0; i < n; ++i) {
      wb[i].v = HalfToFloat(w[off + i]);
      gb[i].v = HalfToFloat(g[off + i]);
    }
    for (int k = 0; k < ns; ++k) {
      const uint16_t* src = static_cast<const uint16_t*>(states[k]) + off;
      for (uint64_t i = 0; i < n; ++i) sb[k][i].v = HalfToFloat(src[i]);
      s[k] = sb[k];
    }
    Update<Half>(sp, st, wb, gb, s, n);
    for (uint64_t i = 0; i < n; ++i) w[off + i] = FloatToHalf(wb[i].v);
    for (int k = 0; k < ns; ++k) {
      uint16_t* dst = static_cast<uint16_t*>(states[k]) + off;
      for (uint64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(sb[k][i].v);
    }
  }
}

}  // namespace

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kNag: return "nag";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kRmsProp: return "rmsprop";
    case OptimizerKind::kAdaGrad: return "adagrad";
    case OptimizerKind::kAdaDelta: return "adadelta";
    case OptimizerKind::kAdamax: return "adamax";
    case OptimizerKind::kSignum: return "signum";
    case OptimizerKind::kFtrl: return "ftrl";
    case OptimizerKind::kFtml: return "ftml";
    case OptimizerKind::kTorchSgd: return "torch_sgd";
    case OptimizerKind::kTorchAdam: return "torch_adam";
  }
  return "unknown";
}

Status CheckOptimizer(const OptimizerSpec& spec, DType dtype) {
  const int k = static_cast<int>(spec.kind);
  if (k < 0 || k > static_cast<int>(kLastOptimizerKind)) {
    return Status::Invalid("unknown optimizer kind " + std::to_string(k));
  }
  if (IsTorchKind(spec.kind)) return CheckTorchOptimizer(spec, dtype);
  const std::string name = OptimizerKindName(spec.kind);
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kFloat16) {
    return Status::Invalid("optimizer " + name + " updates float16/float32/float64 weights only, not " +
                           DTypeName(dtype) + " (MXNet's optimizers do not update integer weights either)");
  }
  if (UsesMomentum(spec.kind) && spec.momentum < 0) {
    return Status::Invalid("optimizer " + name + ": negative momentum is not supported (MXNet creates a "
                           "momentum state for it but never uses it)");
  }
  if (FloatStateOnly(spec.kind) && dtype != DType::kFloat32 && !MasterCopy(spec, dtype)) {
    return Status::Invalid("optimizer " + name + " keeps float32 state, so MXNet cannot update " +
                           DTypeName(dtype) + " weights with it" +
                           (dtype == DType::kFloat16 ? "; use multi_precision=True" : ""));
  }
  return Status::Ok();
}

int NumStates(const OptimizerSpec& spec, DType dtype) {
  if (IsTorchKind(spec.kind)) return TorchNumStates(spec);
  return InnerStates(spec) + (MasterCopy(spec, dtype) ? 1 : 0);
}

DType StateDType(const OptimizerSpec& spec, DType dtype) {
  if (IsTorchKind(spec.kind)) return dtype;  // torch keeps its states in the parameter's dtype
  return MasterCopy(spec, dtype) || FloatStateOnly(spec.kind) ? DType::kFloat32 : dtype;
}

void InitStates(const OptimizerSpec& spec, DType dtype, const void* weight, void* const* states, uint64_t count) {
  const int ns = NumStates(spec, dtype);
  const size_t bytes = count * DTypeSize(StateDType(spec, dtype));
  for (int k = 0; k < ns; ++k) std::memset(states[k], 0, bytes);
  if (MasterCopy(spec, dtype)) {
    float* master = static_cast<float*>(states[MasterIndex(spec)]);
    const uint16_t* w = static_cast<const uint16_t*>(weight);
    for (uint64_t i = 0; i < count; ++i) master[i] = HalfToFloat(w[i]);
  }
}

void ApplyUpdate(const OptimizerSpec& spec, const StepParams& step, DType dtype, void* weight, const void* grad,
                 void* const* states, uint64_t count) {
  if (IsTorchKind(spec.kind)) {
    TorchApplyUpdate(spec, step, dtype, weight, grad, states, count);
    return;
  }
  switch (dtype) {
    case DType::kFloat32: {
      float* s[kMaxStates] = {};
      for (int k = 0; k < InnerStates(spec); ++k) s[k] = static_cast<float*>(states[k]);
      Update<float>(spec, step, static_cast<float*>(weight), static_cast<const float*>(grad), s, count);
      break;
    }
    case DType::kFloat64: {
      double* s[kMaxStates] = {};
      for (int k = 0; k < InnerStates(spec); ++k) s[k] = static_cast<double*>(states[k]);
      Update<double>(spec, step, static_cast<double*>(weight), static_cast<const double*>(grad), s, count);
      break;
    }
    case DType::kFloat16:
      if (MasterCopy(spec, dtype)) {
        UpdateWithMaster(spec, step, static_cast<uint16_t*>(weight), static_cast<const uint16_t*>(grad), nullptr,
                         states, count);
      } else {
        UpdateHalf(spec, step, static_cast<uint16_t*>(weight), static_cast<const uint16_t*>(grad), states, count);
      }
      break;
    default: break;  // CheckOptimizer refuses integer weights
  }
}

bool UpdatesMasterCopy(const OptimizerSpec& spec, DType dtype) { return MasterCopy(spec, dtype); }

int MasterStateIndex(const OptimizerSpec& spec) { return MasterIndex(spec); }

void ApplyUpdateToMaster(const OptimizerSpec& spec, const StepParams& step, void* weight, const float* grad,
                         void* const* states, uint64_t count) {
  UpdateWithMaster(spec, step, static_cast<uint16_t*>(weight), nullptr, grad, states, count);
}

}  // namespace p3
