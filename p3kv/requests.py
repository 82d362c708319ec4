"""Control requests a worker sends to servers (kRequest frames), and how their bodies are encoded.

Bodies are pickles: servers trust the workers of their own job (see the README's threat model)."""

SET_OPTIMIZER = 1  # body: pickled mx.optimizer.Optimizer; the server then updates slices with it
GET_STATES = 2  # reply: pickled {"states": {(key, slice): state as numpy (nested tuples kept)},
#                                  "counts": {key: updates done}}
SET_STATES = 3  # body: pickled {(key, slice): state as numpy}
