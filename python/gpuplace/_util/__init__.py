"""Private helpers every layer may use: reading and checking documents, writing files
atomically, and Slurm hostlists."""
