"""Layer 7, running trainings: where a training executes (this process, local worker
processes, a parameter-server cluster, a task of a cluster a manager described), what is
measured after it in the processes that trained (`trainings`); its files written, exported
and read back, and what the files beside a trained model say (`run_files`)."""
