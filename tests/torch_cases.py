"""The training cases p3kv.torch must end with DDP's parameters on, bit for bit, with two workers: arguments of
tests/scripts/torch_train.py. Shared by tests/test_torch_ddp.py (CPU) and tests/gpu/gpu_check.py (the GPU)."""

DDP_CASES: dict[str, list[str]] = {
    # SGD with momentum and weight decay, a StepLR scheduler that halves lr every 2 steps (after step()).
    "sgd": [],
    "adam": ["--optimizer", "adam"],
    # Gradient accumulation: the first of two backward passes per step inside model.no_sync().
    "adamw-no_sync": ["--optimizer", "adamw", "--accumulate", "2"],
    # The same accumulation with distribute(backward_passes_per_step=3) instead of no_sync (Horovod's way).
    "sgd-passes_per_step": ["--accumulate", "3", "--passes-per-step"],
    # BatchNorm: worker 0's running statistics reach every worker as DDP's broadcast_buffers does.
    "batchnorm": ["--model", "bn"],
    # Tied weights: one parameter in two modules, and a weight read again outside its module: one key, one step.
    "tied": ["--model", "tied"],
    # Clipping by global norm reads every averaged gradient: optimizer.synchronize() first, then one whole step.
    "adam-clip": ["--optimizer", "adam", "--clip", "0.05"],
    # Half-precision parameters and gradients: the servers sum two of them in float32 and round once.
    "float16": ["--dtype", "float16"],
    "bfloat16": ["--dtype", "bfloat16"],
}
