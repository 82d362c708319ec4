"""The processes a benchmark job starts (workers), the model descriptions they read (shapes/, real models) and
the environment and result files they share."""
