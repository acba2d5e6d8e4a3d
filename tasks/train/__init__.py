"""Layer 5, training: the models by name, the per-replica step and epoch runners, the one
training loop with checkpoints and resume, pipeline and tensor parallelism (`stage_plan`
cuts a model, `stage_models` places its stages, `gpipe` steps through them), and evaluation
on the held-out split. Knows nothing of measuring rounds or MLflow."""
