"""The emulated cluster: hosts as network namespaces, shaped links, emulated compute, per-host CPU, the run guard,
the host and process monitors and the header-inclusive bound of a link."""
