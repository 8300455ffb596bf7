"""Optional experiment tracking in MLflow (`pip install 'ddp_core[mlflow]'`, then `--mlflow-uri URI`).

The run directory's CSV and JSON stay the source of truth, and the book reads only them. MLflow gets a copy to browse
and compare, and one run directory is one MLflow run.
"""

from __future__ import annotations

from pathlib import Path

from ddp_core.engine.config import TrainConfig, UsageError

# A local store: --mlflow-uri sqlite:///mlflow.db, with the artifacts in ./mlruns of the working directory.
# `mlflow ui --backend-store-uri sqlite:///mlflow.db` browses it.
EXPERIMENT_NAME = "ddp_core"


class MlflowTracker:
    def __init__(self, cfg: TrainConfig, out: Path, run_info: dict):
        import mlflow

        self.mlflow = mlflow
        resumed_id = run_info.get("mlflow_run_id")  # a resumed run logs into the MLflow run it started
        try:
            mlflow.set_tracking_uri(cfg.mlflow_uri)
            mlflow.set_experiment(EXPERIMENT_NAME)
            run = mlflow.start_run(run_id=resumed_id, run_name=out.name)
        except mlflow.exceptions.MlflowException as exc:
            raise UsageError(f"--mlflow-uri {cfg.mlflow_uri}: {str(exc).splitlines()[0]}") from None
        run_info["mlflow_run_id"] = run.info.run_id
        if resumed_id is None:  # the settings as parameters
            mlflow.log_params({key: value for key, value in cfg.to_dict().items() if value is not None})
        self.out = out

    def log_epoch(self, row: dict) -> None:
        # Each epoch's row as metrics at step = epoch.
        self.mlflow.log_metrics({key: float(value) for key, value in row.items() if key != "epoch"}, step=row["epoch"])

    def finish(self) -> None:
        for name in ("run.json", "metrics.csv"):
            self.mlflow.log_artifact(str(self.out / name))
        self.mlflow.end_run()


class NoTracker:
    def log_epoch(self, row: dict) -> None:
        pass

    def finish(self) -> None:
        pass


def tracker(cfg: TrainConfig, out: Path, run_info: dict):
    """MLflow when --mlflow-uri is set, else nothing. Call before run.json is written: it adds the MLflow run id."""
    # Only rank 0 logs: the trainer gives the other ranks a NoTracker.
    return MlflowTracker(cfg, out, run_info) if cfg.mlflow_uri else NoTracker()
