"""Real data through `datasets`: seeded subsets, splits of test-only datasets, tokenize once per node."""

import numpy as np
import pytest

from ddp_core.engine.config import TrainConfig
from ddp_core.engine.data import load_data


@pytest.fixture
def cfg(data_dir, tmp_path):
    return lambda **kw: TrainConfig(
        data_dir=str(data_dir),
        cache_dir=str(tmp_path / "cache"),
        global_batch_size=8,
        seq_len=64,
        vocab_size=2000,
        **kw,
    )


def test_imdb_subset_is_drawn_at_random_not_from_the_label_sorted_head(cfg):
    data = load_data(cfg(dataset="imdb", train_samples=400, eval_samples=200))
    assert data.train_ids.shape == (400, 64) and data.eval_ids.shape == (200, 64)
    for labels in (data.train_labels, data.eval_labels):
        assert 0.35 <= labels.float().mean().item() <= 0.65


def test_same_seed_gives_the_same_tensors_and_another_seed_another_subset(cfg):
    first = load_data(cfg(dataset="imdb", train_samples=300, eval_samples=100, seed=1))
    again = load_data(cfg(dataset="imdb", train_samples=300, eval_samples=100, seed=1))
    other = load_data(cfg(dataset="imdb", train_samples=300, eval_samples=100, seed=2))
    assert first.train_ids.equal(again.train_ids) and first.train_labels.equal(again.train_labels)
    assert not first.train_ids.equal(other.train_ids)


def test_ag_news_test_only_copy_is_split_into_disjoint_train_and_eval(cfg):
    data = load_data(cfg(dataset="ag_news"))
    assert data.num_classes == 4
    assert len(data.train_labels) + len(data.eval_labels) == 7600
    assert sorted(np.unique(data.train_labels.numpy())) == [0, 1, 2, 3]
    train_rows = {tuple(row) for row in data.train_ids.tolist()}
    shared = sum(tuple(row) in train_rows for row in data.eval_ids.tolist())
    assert shared <= 5  # only texts that occur twice in the source may appear on both sides


@pytest.mark.slow
def test_a_two_rank_run_tokenizes_once_and_a_rerun_not_at_all(train, data_dir):
    args = [
        "--dataset",
        "imdb",
        "--data-dir",
        data_dir,
        "--preset",
        "tiny",
        "--train-samples",
        256,
        "--eval-samples",
        64,
        "--seq-len",
        32,
        "--global-batch-size",
        32,
        "--no-progress",
        "--check",
    ]
    assert train(*args, nproc=2).stdout.count("encoded imdb") == 1
    assert train(*args, nproc=2).stdout.count("encoded imdb") == 0
