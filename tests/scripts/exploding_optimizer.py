"""An optimizer whose update fails on the servers at the third step (gluon_train.py --fail-optimizer).

It lives in its own module because servers unpickle the optimizer worker 0 sends: its class must be
importable there (a class defined in the training script is `__main__.X`, which a server cannot find).
Put this directory on the servers' PYTHONPATH (launcher --env PYTHONPATH=tests/scripts)."""

import mxnet as mx


class Exploding(mx.optimizer.SGD):
    # Servers (MXNet's and p3kv's) call update_multi_precision, which SGD does not route through update().
    def update_multi_precision(self, index, weight, grad, state):
        indices = index if isinstance(index, (list, tuple)) else [index]
        done = max(self._index_update_count.get(i, self.begin_num_update) for i in indices)
        if done >= 2:  # two steps of this parameter done: this is the third
            raise ValueError(f"exploding optimizer at step {done + 1}")
        super().update_multi_precision(index, weight, grad, state)

    update = update_multi_precision
