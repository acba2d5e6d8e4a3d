"""Layer 9, tracking: the MLflow store's client (`tracking`), tfscale's runs in it
(`records`), and the MLflow app `tfscale ui` serves (`ui`) with its server process
(`ui_server`). The only package that imports mlflow."""
