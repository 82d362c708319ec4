"""Control requests a worker sends to servers (kRequest frames), and how their bodies are encoded.

Bodies are pickles: servers trust the workers of their own job (see the README's threat model)."""

SET_OPTIMIZER = 1  # body: pickled mx.optimizer.Optimizer; the server then updates slices with it
GET_STATES = 2  # reply: pickled {"states": {(key, slice): state as numpy (nested tuples kept)},
#                                  "counts": {key: updates done}}
SET_STATES = 3  # body: pickled {(key, slice): state as numpy}
SET_HYPERPARAMETERS = 4  # body: pickled {attribute: value} of the optimizer (lr, wd, rescale_grad, momentum, ...,
#                          "lr_mult"/"wd_mult": {index: multiplier}); the server sets them on its optimizer and
#                          keeps every slice's state and update count. Worker 0 sends it between two iterations.
