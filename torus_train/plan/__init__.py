"""`torus-train plan`, as pure modules (numpy, no torch), in the order the pipeline uses them:

networks   clusters as the cost model sees them: links, presets with their sources, TOML files
cost       alpha-beta-gamma cost of one all-reduce per algorithm and of one training step
search     grid choice by predicted time, and a whole plan over algorithms or GPU counts
calibrate  the model fitted to one CPU host from bench rows, and held against another grid
simulate   the torus's exact data movement on virtual ranks
"""
