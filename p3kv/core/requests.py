"""Control requests a worker sends to servers (kRequest frames), and how their bodies are encoded.

Bodies are pickles: servers trust the workers of their own job (see the README's threat model)."""

SET_OPTIMIZER = 1  # body: pickled mx.optimizer.Optimizer; the server then updates slices with it
# Optimizer states can be far larger than one frame (P3_MAX_MESSAGE_BYTES; Adam on VGG-19 with one server holds
# ~1.15 GB), so they travel in pages of at most `max_bytes` (the requester picks half its frame limit):
GET_STATES = 2  # body: pickled {"start": index of the first slice, "max_bytes": page size} (empty: everything);
#                 reply: pickled {"states": {(key, slice): state as numpy (nested tuples kept)},
#                                 "counts": {key: updates done}, "next": start of the next page, or None at the end}
SET_STATES = 3  # body: pickled {"states": {(key, slice): state as numpy}, "first": True on the first page (the
#                 server's states are replaced, not merged)}; a bare {(key, slice): state} is one whole page
#
# A page's size is estimated as its arrays' bytes plus STATE_OVERHEAD_BYTES per slice (the pickle's framing).
STATE_OVERHEAD_BYTES = 1024
SET_HYPERPARAMETERS = 4  # body: pickled {attribute: value} of the optimizer (lr, wd, rescale_grad, momentum, ...,
#                          "lr_mult"/"wd_mult": {index: multiplier}); the server sets them on its optimizer and
#                          keeps every slice's state and update count. Worker 0 sends it between two iterations.


def state_bytes(state) -> int:
    """The estimated pickled size of one slice's state (numpy arrays, possibly nested in tuples/lists)."""
    if state is None:
        return STATE_OVERHEAD_BYTES
    if isinstance(state, (tuple, list)):
        return STATE_OVERHEAD_BYTES + sum(state_bytes(s) for s in state)
    return STATE_OVERHEAD_BYTES + int(state.nbytes)


def pages(states: dict, max_bytes: int) -> list[dict]:
    """`states` ({(key, slice): state}) cut into pages of at most `max_bytes` (estimated), at least one slice
    each (a slice's state is a few times the slice, which fits in a frame)."""
    out: list[dict] = [{}]
    size = 0
    for index, state in states.items():
        n = state_bytes(state)
        if out[-1] and size + n > max_bytes:
            out.append({})
            size = 0
        out[-1][index] = state
        size += n
    return out
