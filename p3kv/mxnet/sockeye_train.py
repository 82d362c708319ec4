"""Train a Sockeye 2.3 model (the last MXNet Sockeye) with kvstore 'p3'.

    python -m p3kv.launch -n 2 -s 2 -- python -m p3kv.mxnet.sockeye_train --kvstore p3 --use-cpu \\
        --source train.src --target train.trg --validation-source dev.src --validation-target dev.trg \\
        --output model ...

Every argument is sockeye.train's. What this entry point adds for a parameter-server run:
- 'p3' among the choices of --kvstore. Sockeye's parser checks against the list
  `sockeye.constants.KVSTORE_TYPES` itself (argparse keeps a reference to it), so appending to it suffices.
- One output folder per worker. Without Horovod, Sockeye lets every worker write the same files, which breaks
  as soon as two workers share a file system. As Sockeye does under Horovod, rank 0 writes to --output and
  rank r > 0 to OUTPUT/secondary_workers/r (keeping only its last parameters). Rank 0 prepares --output
  (--overwrite-output removes it) before the other workers create their folders inside it.
  Both need the rank before training starts, so the kvstore is created here, first, and handed to Sockeye
  when it calls mx.kvstore.create with the same name (a process joins a job only once).
- With kvstore 'p3', servers that follow the workers' optimizer. The servers run their own copy of it, shipped
  when training starts; Sockeye later changes the workers' copy: at a checkpoint its plateau scheduler may
  lower the learning rate, and on resume it sets the update count (Adam's bias correction). So the optimizer
  is shipped again, with the update count, after each checkpoint and after resuming, with keep_states=True: the
  servers keep their per-slice states (a plain set_optimizer drops them, as MXNet's dist_sync servers do on a
  new optimizer; not done for dist_sync).
Distributed kvstores of MXNet (dist_sync, ...) get the per-worker folders too; local ones run Sockeye unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Sequence

import p3kv  # noqa: F401  (registers kvstore 'p3' once mxnet is imported)
from p3kv.mxnet.hook import P3_NAME

SECONDARY_WORKERS_DIRNAME = "secondary_workers"  # the folder name Sockeye uses under Horovod


def _is_distributed(name: str) -> bool:
    return name == P3_NAME or name.startswith("dist")


@contextlib.contextmanager
def _shared_kvstore(name: str, kv):
    """While active, mx.kvstore.create(name) returns `kv` (the kvstore created before Sockeye asked)."""
    import mxnet as mx

    create = mx.kvstore.create

    def create_once(kv_name="local"):
        return kv if kv_name == name else create(kv_name)

    mx.kvstore.create = create_once
    try:
        yield
    finally:
        mx.kvstore.create = create


@contextlib.contextmanager
def _primary_prepares_output(sockeye_train, kv):
    """Rank 0 checks (and with --overwrite-output clears) its output folder before secondary workers create
    theirs inside it: Sockeye's check_resume runs on rank 0 first, on the others after a barrier."""
    check_resume = sockeye_train.check_resume

    def ordered_check_resume(args, output_folder):
        if kv.rank == 0:
            resume = check_resume(args, output_folder)
            if kv.num_workers > 1:
                os.makedirs(os.path.join(output_folder, SECONDARY_WORKERS_DIRNAME), exist_ok=True)
            kv._barrier()
            return resume
        kv._barrier()
        return check_resume(args, output_folder)

    sockeye_train.check_resume = ordered_check_resume
    try:
        yield
    finally:
        sockeye_train.check_resume = check_resume


@contextlib.contextmanager
def _servers_follow_optimizer(training, kv):
    """After Sockeye's trainer has checkpointed or resumed, ship the workers' optimizer to the servers again."""
    cls = training.GluonEarlyStoppingTrainer
    originals = {name: getattr(cls, name) for name in ("_create_checkpoint", "_load_training_state")}

    def following(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            result = method(self, *args, **kwargs)
            trainer = self.trainer
            if trainer._kvstore is kv and trainer._update_on_kvstore:
                # Every worker checkpoints at the same update, so this collective call lines up; nothing of
                # the previous update may still be on its way when the servers swap optimizers.
                import mxnet as mx

                mx.nd.waitall()
                # The workers' copy has counted nothing: state the count as Sockeye does on resume (every
                # trainable key is updated once per update), or Adam's bias correction and the lr schedule
                # would start over where the servers have counted less (a reloaded best checkpoint).
                optimizer = trainer._optimizer
                optimizer.begin_num_update = optimizer.num_update = self.state.updates
                optimizer._index_update_count.clear()
                kv.set_optimizer(optimizer, keep_states=True)
            return result

        return wrapper

    for name, method in originals.items():
        setattr(cls, name, following(method))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(cls, name, method)


def main(argv: Sequence[str] | None = None) -> int:
    import mxnet as mx
    import sockeye.arguments
    import sockeye.constants
    import sockeye.train
    import sockeye.training

    if P3_NAME not in sockeye.constants.KVSTORE_TYPES:
        sockeye.constants.KVSTORE_TYPES.append(P3_NAME)
    parser = sockeye.arguments.ConfigArgumentParser(description="Train Sockeye models (kvstore 'p3' available).")
    sockeye.arguments.add_train_cli_args(parser)
    args = parser.parse_args(argv)
    if args.horovod or not _is_distributed(args.kvstore):
        sockeye.train.train(args)
        return 0

    kv = mx.kvstore.create(args.kvstore)
    if kv.rank > 0:
        args.output = os.path.join(args.output, SECONDARY_WORKERS_DIRNAME, str(kv.rank))
        args.keep_last_params = 1
        if args.quiet_secondary_workers:
            args.quiet = True
    with contextlib.ExitStack() as patches:
        patches.enter_context(_shared_kvstore(args.kvstore, kv))
        patches.enter_context(_primary_prepares_output(sockeye.train, kv))
        if args.kvstore == P3_NAME:
            patches.enter_context(_servers_follow_optimizer(sockeye.training, kv))
        sockeye.train.train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
