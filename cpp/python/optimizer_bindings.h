// Internal to the _p3 extension: conversions between Python and the optimizer kernels' parameters.
#pragma once

#include <pybind11/pybind11.h>

#include "p3/optimizer.h"

namespace p3py {

// {"kind": "sgd"|"nag"|...|"torch_sgd"|"torch_adam", "multi_precision": bool, "momentum": float, ...}: the fields
// of p3::OptimizerSpec by name (torch_sgd: momentum, dampening, nesterov, maximize; torch_adam: beta1, beta2,
// epsilon, amsgrad, maximize, decoupled_weight_decay); missing fields keep their defaults, unknown names raise
// ValueError.
p3::OptimizerSpec SpecFromDict(const pybind11::dict& d);
// (lr, wd, rescale_grad, clip_gradient, t, extra0, extra1, extra2, extra3); trailing items may be left out.
p3::StepParams StepFromTuple(const pybind11::tuple& t);
// Adds the kernel functions to the module (used by tests and benchmarks): num_states, init_states, apply_update.
void BindOptimizer(pybind11::module_& m);

}  // namespace p3py
