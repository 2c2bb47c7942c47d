"""The sweep's scheduler on Slurm: one srun job per pair, and how each came out."""
