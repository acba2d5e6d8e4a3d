"""Layer 8, tracking: everything MLflow (`tracking`) and the MLflow app `tfscale ui` serves
(`ui`). The only package that imports mlflow."""
