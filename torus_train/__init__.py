"""torus-train: massively data-parallel image-classification training with a 2D-torus all-reduce and
staged batch-size growth (after Mikami et al., arXiv 1811.05233)."""

__version__ = "0.1.0"
