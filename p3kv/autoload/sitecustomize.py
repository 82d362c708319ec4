"""Put on a worker's PYTHONPATH by `python -m p3kv.launch` (p3 jobs): Python imports this at start-up, so an
unmodified MXNet script that takes its kvstore name on the command line (`--kv-store p3`) finds kvstore 'p3'
without `import p3kv` in it. It shadows another sitecustomize module only for the launched workers."""

import p3kv  # noqa: F401
