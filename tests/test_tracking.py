"""Optional MLflow tracking: a run logged to a real local MLflow store holds what its CSV and run.json hold."""

import csv
import json

import pytest

from conftest import TINY_SYNTHETIC

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed: pip install 'ddp_core[mlflow]'")


@pytest.mark.slow
def test_a_run_tracked_in_mlflow_logs_its_settings_epochs_and_files(train, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    train(
        *TINY_SYNTHETIC,
        "--global-batch-size",
        16,
        "--train-samples",
        128,
        "--eval-samples",
        32,
        "--epochs",
        2,
        "--out",
        run_dir,
        "--mlflow-uri",
        store,
        nproc=2,
    )
    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    [logged] = client.search_runs([client.get_experiment_by_name("ddp_core").experiment_id])
    assert logged.info.run_id == json.loads((run_dir / "run.json").read_text())["mlflow_run_id"]
    assert logged.info.run_name == "run" and logged.info.status == "FINISHED"
    assert logged.data.params["preset"] == "tiny" and logged.data.params["global_batch_size"] == "16"
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    history = client.get_metric_history(logged.info.run_id, "val_accuracy")
    assert [(m.step, m.value) for m in history] == [(int(r["epoch"]), float(r["val_accuracy"])) for r in rows]
    assert {a.path for a in client.list_artifacts(logged.info.run_id)} == {"run.json", "metrics.csv"}


def test_tracking_is_off_unless_asked_for(two_local_ranks):
    assert "mlflow_run_id" not in json.loads((two_local_ranks / "run.json").read_text())
    assert not (two_local_ranks.parent / "mlruns").exists()
