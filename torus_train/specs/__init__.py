"""Job specs shipped with the package; default.toml is what `torus-train run` uses with no --spec."""
