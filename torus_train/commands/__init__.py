"""Click commands, one module each. Keep module tops free of torch imports: `--help` must stay fast."""
