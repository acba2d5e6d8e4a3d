"""Layer 4, where a run trains: the hardware report, the strategy and precision chosen from it
and built, a cluster task's role (TF_CONFIG or Slurm; preemption, lost peers), local worker
processes, an in-process parameter-server cluster, emulated hosts and links, and the `Run`
value that carries all of it with its run directory."""
