"""Around and inside the ranks: the job's orchestration (legs, restarts, elastic), the runner (local ranks or
one mpirun/srun command), the watchdog and failure diagnosis, the per-rank worker, and rank start-up."""
