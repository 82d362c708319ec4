"""The README's (and results/legacy/README.md's) generated benchmark blocks, from the result CSVs
(`python -m benchmarks.report [--check]`)."""
