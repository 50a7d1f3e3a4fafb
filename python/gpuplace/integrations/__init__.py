"""gpuplace inside the schedulers that run the jobs: Slurm (sync, submit, the job_submit
plugin's helper), Ray (placement groups, Ray Train), Kubernetes (node labels, Kueue, Volcano
and KAI topology objects, pod patches) and the Kubernetes scheduler extender. Each uses only
gpuplace's public API."""
