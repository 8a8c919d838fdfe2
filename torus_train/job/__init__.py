"""The job, before anything launches (pure; no torch): spec, grid topology, host lists, launch plan."""
