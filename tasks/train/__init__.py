"""Layer 5, training: the models by name, the per-replica step and epoch runners, the one
training loop with checkpoints and resume, pipeline and tensor parallelism (`stages`), and
evaluation on the held-out split. Knows nothing of measuring rounds or MLflow."""
