"""Tries to put each optimizer that cannot run per slice on kvstore 'p3''s servers; prints one line per
optimizer with the error it got ("REFUSED name: message") or "ACCEPTED name"."""

import sys

import mxnet as mx

import p3kv  # noqa: F401

kv = mx.kv.create("p3")
kv.init(0, mx.nd.ones((4,)))
for name in ("Nadam", "LARS", "LAMB", "LBSGD"):
    try:
        kv.set_optimizer(mx.optimizer.create(name.lower()))
        print(f"ACCEPTED {name}", flush=True)
    except Exception as e:  # noqa: BLE001  (report whatever the kvstore raised)
        print(f"REFUSED {name}: {type(e).__name__}: {e}".replace("\n", " "), flush=True)
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5))  # still usable after a refusal
kv.pushpull(0, mx.nd.ones((4,)), out=(w := mx.nd.zeros((4,))))
print(f"AFTER {w.asnumpy().tolist()}", flush=True)
sys.exit(0)
