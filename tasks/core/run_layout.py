"""The names of the files a training leaves, each named once: in its run directory
(`tasks.distribute.run.Run.run_dir`), beside a dataset's runs, and in the folder `tfscale
train --export-dir` fills."""

METRICS = "metrics.json"  # a finished training's `TrainResult`: the mark that it finished
EXPORTED_METRICS = "train_metrics.json"  # the same, in an export's folder
LATEST = "latest.json"  # beside a dataset's runs: the newest finished one
