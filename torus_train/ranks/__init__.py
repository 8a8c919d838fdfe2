"""Around and inside the ranks: the local supervisor, the per-rank worker, and rank start-up (bootstrap)."""
