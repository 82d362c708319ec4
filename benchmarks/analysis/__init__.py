"""Reading results: the row schema of every runner, the statistics over repeats, points aggregated from rows,
link utilisation from the samplers' files."""
