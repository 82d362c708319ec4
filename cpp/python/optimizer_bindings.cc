#include "optimizer_bindings.h"

namespace py = pybind11;

namespace p3py {

p3::OptimizerSpec SpecFromDict(const py::dict&) { return p3::OptimizerSpec(); }
p3::StepParams StepFromTuple(const py::tuple&) { return p3::StepParams(); }
void BindOptimizer(py::module_&) {}

}  // namespace p3py
