#include "optimizer_bindings.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

namespace py = pybind11;

namespace p3py {
namespace {

p3::OptimizerKind ParseKind(const std::string& name) {
  for (int k = 0; k <= static_cast<int>(p3::kLastOptimizerKind); ++k) {
    const auto kind = static_cast<p3::OptimizerKind>(k);
    if (name == p3::OptimizerKindName(kind)) return kind;
  }
  throw py::value_error("unknown optimizer kind '" + name + "'");
}

p3::DType ParseWeightDType(const std::string& name) {
  p3::DType dtype;
  if (!p3::ParseDType(name, &dtype)) throw py::value_error("unsupported dtype '" + name + "'");
  return dtype;
}

// The spec, checked against the weights' dtype: an unsupported combination raises ValueError.
p3::OptimizerSpec CheckedSpec(const py::dict& d, p3::DType dtype) {
  p3::OptimizerSpec spec = SpecFromDict(d);
  const p3::Status st = p3::CheckOptimizer(spec, dtype);
  if (!st.ok()) throw py::value_error(st.message());
  return spec;
}

struct Span {
  void* ptr;
  uint64_t count;
};

// A C-contiguous buffer of `dtype` elements; `what` names it in the error message.
Span GetSpan(const py::buffer& b, const std::string& what, p3::DType dtype, bool writable) {
  py::buffer_info info = b.request(writable);
  if (info.itemsize != static_cast<py::ssize_t>(p3::DTypeSize(dtype))) {
    throw py::value_error(what + ": expected " + p3::DTypeName(dtype) + " elements, got itemsize " +
                          std::to_string(info.itemsize) + " (format '" + info.format + "')");
  }
  const char f = info.format.empty() ? '?' : info.format.back();
  const char want = dtype == p3::DType::kFloat64 ? 'd' : dtype == p3::DType::kFloat32 ? 'f' : 'e';
  if (f != want) {
    throw py::value_error(what + ": expected " + p3::DTypeName(dtype) + " elements, got format '" + info.format +
                          "'");
  }
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect) throw py::value_error(what + ": must be C-contiguous");
    expect *= info.shape[d];
  }
  return {info.ptr, static_cast<uint64_t>(info.size)};
}

std::vector<void*> GetStates(const py::list& states, const p3::OptimizerSpec& spec, p3::DType dtype,
                             uint64_t count) {
  const int ns = p3::NumStates(spec, dtype);
  if (static_cast<int>(states.size()) != ns) {
    throw py::value_error("expected " + std::to_string(ns) + " state arrays for " +
                          p3::OptimizerKindName(spec.kind) + " with " + p3::DTypeName(dtype) + " weights, got " +
                          std::to_string(states.size()));
  }
  std::vector<void*> ptrs;
  for (int k = 0; k < ns; ++k) {
    const std::string what = "state " + std::to_string(k);
    const Span s = GetSpan(states[k].cast<py::buffer>(), what, p3::StateDType(spec, dtype), true);
    if (s.count != count) {
      throw py::value_error(what + ": has " + std::to_string(s.count) + " elements, the weights " +
                            std::to_string(count));
    }
    ptrs.push_back(s.ptr);
  }
  return ptrs;
}

}  // namespace

p3::OptimizerSpec SpecFromDict(const py::dict& d) {
  p3::OptimizerSpec s;
  for (auto item : d) {
    const std::string key = item.first.cast<std::string>();
    const py::handle v = item.second;
    if (key == "kind") s.kind = ParseKind(v.cast<std::string>());
    else if (key == "multi_precision") s.multi_precision = v.cast<bool>();
    else if (key == "momentum") s.momentum = v.cast<double>();
    else if (key == "beta1") s.beta1 = v.cast<double>();
    else if (key == "beta2") s.beta2 = v.cast<double>();
    else if (key == "epsilon") s.epsilon = v.cast<double>();
    else if (key == "gamma1") s.gamma1 = v.cast<double>();
    else if (key == "gamma2") s.gamma2 = v.cast<double>();
    else if (key == "centered") s.centered = v.cast<bool>();
    else if (key == "clip_weights") s.clip_weights = v.cast<double>();
    else if (key == "rho") s.rho = v.cast<double>();
    else if (key == "lamda1") s.lamda1 = v.cast<double>();
    else if (key == "beta") s.beta = v.cast<double>();
    else if (key == "wd_lh") s.wd_lh = v.cast<double>();
    else if (key == "dampening") s.dampening = v.cast<double>();
    else if (key == "nesterov") s.nesterov = v.cast<bool>();
    else if (key == "maximize") s.maximize = v.cast<bool>();
    else if (key == "amsgrad") s.amsgrad = v.cast<bool>();
    else if (key == "decoupled_weight_decay") s.decoupled_weight_decay = v.cast<bool>();
    else throw py::value_error("unknown optimizer spec field '" + key + "'");
  }
  return s;
}

p3::StepParams StepFromTuple(const py::tuple& t) {
  if (t.size() > 9) throw py::value_error("step has at most 9 items, got " + std::to_string(t.size()));
  p3::StepParams p;
  double* fields[9] = {&p.lr, &p.wd, &p.rescale_grad, &p.clip_gradient, &p.t,
                       &p.extra[0], &p.extra[1], &p.extra[2], &p.extra[3]};
  for (size_t i = 0; i < t.size(); ++i) *fields[i] = t[i].cast<double>();
  return p;
}

void BindOptimizer(py::module_& m) {
  m.def(
      "num_states",
      [](const py::dict& spec, const std::string& dtype) {
        const p3::DType dt = ParseWeightDType(dtype);
        return p3::NumStates(CheckedSpec(spec, dt), dt);
      },
      py::arg("spec"), py::arg("dtype"),
      "Number of state arrays a slice needs (ValueError if the optimizer cannot update this dtype).");
  m.def(
      "init_states",
      [](const py::dict& spec_dict, const std::string& dtype, const py::buffer& weight, const py::list& states) {
        const p3::DType dt = ParseWeightDType(dtype);
        const p3::OptimizerSpec spec = CheckedSpec(spec_dict, dt);
        const Span w = GetSpan(weight, "weight", dt, false);
        std::vector<void*> s = GetStates(states, spec, dt, w.count);
        py::gil_scoped_release nogil;
        p3::InitStates(spec, dt, w.ptr, s.data(), w.count);
      },
      py::arg("spec"), py::arg("dtype"), py::arg("weight"), py::arg("states"),
      "Fills a slice's state arrays as MXNet's create_state_multi_precision does.");
  m.def(
      "apply_update",
      [](const py::dict& spec_dict, const py::tuple& step, const std::string& dtype, const py::buffer& weight,
         const py::buffer& grad, const py::list& states) {
        const p3::DType dt = ParseWeightDType(dtype);
        const p3::OptimizerSpec spec = CheckedSpec(spec_dict, dt);
        const p3::StepParams params = StepFromTuple(step);
        const Span w = GetSpan(weight, "weight", dt, true);
        const Span g = GetSpan(grad, "grad", dt, false);
        if (g.count != w.count) {
          throw py::value_error("grad has " + std::to_string(g.count) + " elements, the weights " +
                                std::to_string(w.count));
        }
        std::vector<void*> s = GetStates(states, spec, dt, w.count);
        py::gil_scoped_release nogil;
        p3::ApplyUpdate(spec, params, dt, w.ptr, g.ptr, s.data(), w.count);
      },
      py::arg("spec"), py::arg("step"), py::arg("dtype"), py::arg("weight"), py::arg("grad"), py::arg("states"),
      "One optimizer update of `weight` in place (GIL released around the kernel).");
}

}  // namespace p3py
