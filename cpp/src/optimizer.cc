#include "p3/optimizer.h"

namespace p3 {

const char* OptimizerKindName(OptimizerKind) { return "sgd"; }
Status CheckOptimizer(const OptimizerSpec&, DType) { return Status::Invalid("optimizer kernels are not built yet"); }
int NumStates(const OptimizerSpec&, DType) { return 0; }
DType StateDType(const OptimizerSpec&, DType dtype) { return dtype; }
void InitStates(const OptimizerSpec&, DType, const void*, void* const*, uint64_t) {}
void ApplyUpdate(const OptimizerSpec&, const StepParams&, DType, void*, const void*, void* const*, uint64_t) {}

}  // namespace p3
