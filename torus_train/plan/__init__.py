"""`torus-train plan`, as pure modules (numpy, no torch), in the order the pipeline uses them:

networks         clusters as the cost model sees them: links, presets with their sources, TOML files
nccl             NCCL's own tuning model (ring, tree, NVLS, CollNet) for the cost model's NCCL rows
cost             alpha-beta-gamma cost of one all-reduce per algorithm and of one training step
timeline         the run's buckets of a model and the step they make, each bucket all-reduced in turn
grids            grid choice by the predicted fused all-reduce, or by the step with a bucket cap
search           a whole plan over algorithms, its bucket caps, curves over GPU counts
verdict          the torus against NCCL's own choice, at the plan's point and over GPU counts
calibrate        alpha and beta of one machine fitted to its bench rows, and held against another grid
simulate         the torus's exact data movement on virtual ranks

What each `plan` command calls, one function each:

predict          `plan`: PlanRequest -> predict (printout: its text; simulate: --simulate; plots: --plot, --png)
calibrate_report `plan calibrate`: CalibrateRequest -> calibrate_report
rehearse/        `plan rehearse`: the whole job at full scale against NCCL's rules (docs/rehearse.md)
"""
