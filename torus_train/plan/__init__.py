"""`torus-train plan`: the all-reduce cost model, network presets, calibration and the virtual-rank simulation."""
