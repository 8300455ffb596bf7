"""Datasets as encoded tensors: real text through Hugging Face `datasets`, or a synthetic task.

Text is tokenized once per node: local rank 0 encodes the data and writes the tensors to a cache
file named by everything they depend on; the other ranks wait at a barrier and then read that
file. Epochs index tensors and never touch text again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ddp_core.engine.config import TrainConfig, UsageError
from ddp_core.engine.model import PAD_ID

UNK_ID = 1
TOKENIZER_VERSION = 1
HUB_IDS = {"imdb": "stanfordnlp/imdb", "ag_news": "fancyzhx/ag_news"}
NUM_CLASSES = {"imdb": 2, "ag_news": 4, "synthetic": 2}
LOCAL_FORMATS = {".csv": "csv", ".csv.gz": "csv", ".parquet": "parquet", ".jsonl": "json"}
EVAL_FRACTION_WHEN_UNSPLIT = 0.2
SYNTHETIC_DEFAULT_SAMPLES = (2048, 512)
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[!?]")


@dataclass
class EncodedData:
    train_ids: torch.Tensor
    train_labels: torch.Tensor
    eval_ids: torch.Tensor
    eval_labels: torch.Tensor
    num_classes: int


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.replace("<br />", " ").lower())


def build_vocab(texts: list[str], vocab_size: int) -> dict[str, int]:
    """The most frequent words of the training texts; ties broken alphabetically, so it is deterministic."""
    counts = Counter(word for text in texts for word in tokenize(text))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: vocab_size - 2]
    return {word: i + 2 for i, (word, _) in enumerate(ranked)}


def encode(texts: list[str], vocab: dict[str, int], seq_len: int) -> torch.Tensor:
    """Token ids truncated or padded to seq_len; an empty text becomes one unknown token."""
    ids = np.full((len(texts), seq_len), PAD_ID, dtype=np.int32)
    for row, text in enumerate(texts):
        tokens = [vocab.get(word, UNK_ID) for word in tokenize(text)[:seq_len]] or [UNK_ID]
        ids[row, : len(tokens)] = tokens
    return torch.from_numpy(ids)


def seeded_subset(n_rows: int, n_wanted: int | None, seed: int, what: str) -> np.ndarray:
    """Row indices of a seeded random subset: the source files may be sorted by label."""
    if n_wanted is not None and n_wanted > n_rows:
        raise UsageError(f"{what}: asked for {n_wanted} samples but only {n_rows} are available")
    order = np.random.default_rng(seed).permutation(n_rows)
    return np.sort(order[:n_wanted]) if n_wanted is not None else np.arange(n_rows)


def local_files(data_dir: str, dataset: str) -> dict[str, Path]:
    folder = Path(data_dir) / dataset
    if not Path(data_dir).is_dir():
        raise UsageError(f"data dir {data_dir} does not exist")
    found = {}
    for split in ("train", "test"):
        for suffix in LOCAL_FORMATS:
            if (folder / f"{split}{suffix}").is_file():
                found[split] = folder / f"{split}{suffix}"
                break
    if not found:
        raise UsageError(f"no {dataset} data in {folder}: expected train and/or test as .csv, .csv.gz, .parquet or .jsonl")
    return found


def _file_format(path: Path) -> str:
    return next(fmt for suffix, fmt in LOCAL_FORMATS.items() if path.name.endswith(suffix))


def load_splits(cfg: TrainConfig):
    """The raw train and evaluation splits as `datasets.Dataset`s, checked against the text,label schema."""
    import datasets
    from datasets import load_dataset

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    if cfg.data_dir:
        files = local_files(cfg.data_dir, cfg.dataset)
        splits = {}
        for split, path in files.items():
            try:
                splits[split] = load_dataset(_file_format(path), data_files={split: str(path)}, split=split)
            except Exception as exc:
                raise UsageError(f"cannot read {path}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    else:
        hub_id = HUB_IDS[cfg.dataset]
        try:
            hub = load_dataset(hub_id)
        except Exception as exc:
            raise UsageError(
                f"cannot load {hub_id} from the Hugging Face Hub ({type(exc).__name__}); pass a local copy with "
                f"--data-dir DIR or DDP_CORE_DATA_DIR=DIR (files DIR/{cfg.dataset}/train.csv.gz, test.csv.gz)") from None
        splits = {split: hub[split] for split in ("train", "test")}
    for split, ds in splits.items():
        check_schema(ds, NUM_CLASSES[cfg.dataset], f"{cfg.dataset} {split}")
    if "train" in splits and "test" in splits:
        return splits["train"], splits["test"]
    only = next(iter(splits.values()))
    order = np.random.default_rng(cfg.seed).permutation(len(only))
    n_eval = round(EVAL_FRACTION_WHEN_UNSPLIT * len(only))
    return only.select(np.sort(order[n_eval:])), only.select(np.sort(order[:n_eval]))


def check_schema(ds, num_classes: int, what: str) -> None:
    missing = {"text", "label"} - set(ds.column_names)
    if missing:
        raise UsageError(f"{what}: missing column(s) {', '.join(sorted(missing))}; need text,label (has {', '.join(ds.column_names)})")
    labels = np.asarray(ds["label"])
    if not np.issubdtype(labels.dtype, np.integer):
        raise UsageError(f"{what}: labels must be integers, got {labels.dtype}")
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.size:
        raise UsageError(f"{what}: label {bad[0]} out of range; expected 0..{num_classes - 1}")


def encode_text_dataset(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    train, evaluation = load_splits(cfg)
    train = train.select(seeded_subset(len(train), cfg.train_samples, cfg.seed, "--train-samples"))
    evaluation = evaluation.select(seeded_subset(len(evaluation), cfg.eval_samples, cfg.seed + 1, "--eval-samples"))
    vocab = build_vocab(train["text"], cfg.vocab_size)
    tensors = {
        "train_ids": encode(train["text"], vocab, cfg.seq_len),
        "train_labels": torch.tensor(train["label"], dtype=torch.long),
        "eval_ids": encode(evaluation["text"], vocab, cfg.seq_len),
        "eval_labels": torch.tensor(evaluation["label"], dtype=torch.long),
    }
    return tensors


def synthetic_task(cfg: TrainConfig) -> EncodedData:
    """Neutral random tokens with a sprinkle of class keywords (always at least one): learnable to ~100 %."""
    n_train, n_eval = (cfg.train_samples or SYNTHETIC_DEFAULT_SAMPLES[0]), (cfg.eval_samples or SYNTHETIC_DEFAULT_SAMPLES[1])
    gen = torch.Generator().manual_seed(cfg.seed)
    keywords_per_class = max(1, (cfg.vocab_size - 2) // 4)
    first_neutral = min(2 + 2 * keywords_per_class, cfg.vocab_size - 1)

    def make(n: int):
        labels = torch.randint(0, 2, (n,), generator=gen)
        ids = torch.randint(first_neutral, cfg.vocab_size, (n, cfg.seq_len), generator=gen)
        keywords = 2 + labels[:, None] * keywords_per_class + torch.randint(0, keywords_per_class, (n, cfg.seq_len), generator=gen)
        sprinkle = torch.rand(n, cfg.seq_len, generator=gen) < 0.2
        sprinkle[:, 0] = True
        ids = torch.where(sprinkle, keywords, ids)
        lengths = torch.randint(max(1, cfg.seq_len // 4), cfg.seq_len + 1, (n,), generator=gen)
        ids[torch.arange(cfg.seq_len)[None, :] >= lengths[:, None]] = PAD_ID
        return ids.to(torch.int32), labels

    train_ids, train_labels = make(n_train)
    eval_ids, eval_labels = make(n_eval)
    return EncodedData(train_ids, train_labels, eval_ids, eval_labels, NUM_CLASSES["synthetic"])


def cache_path(cfg: TrainConfig, sources: dict) -> Path:
    key = dict(dataset=cfg.dataset, sources=sources, train_samples=cfg.train_samples, eval_samples=cfg.eval_samples,
               seed=cfg.seed, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, tokenizer=TOKENIZER_VERSION)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cfg.cache_dir) if cfg.cache_dir else Path.home() / ".cache" / "ddp_core"
    return root / f"{cfg.dataset}-{digest}.pt"


def _build_cache(cfg: TrainConfig) -> Path:
    """Encode the data unless an identical cache file exists; returns its path."""
    path = cache_path(cfg, source_fingerprint(cfg))
    if not path.exists():
        tensors = encode_text_dataset(cfg)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(tensors, tmp)
        os.replace(tmp, path)
        print(f"ddp_core: encoded {cfg.dataset} into {path}", flush=True)
    return path


def source_fingerprint(cfg: TrainConfig) -> dict:
    """What identifies the raw data without reading it: file path, size and mtime, or the hub id."""
    if not cfg.data_dir:
        return {"hub": HUB_IDS[cfg.dataset]}
    return {split: [str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns]
            for split, path in local_files(cfg.data_dir, cfg.dataset).items()}


def load_data(cfg: TrainConfig, local_rank: int = 0) -> EncodedData:
    """Encoded tensors for this run; in a process group every rank gets them, tokenized once per node."""
    if cfg.dataset == "synthetic":
        return synthetic_task(cfg)
    distributed = dist.is_available() and dist.is_initialized()
    error, path = None, None
    if local_rank == 0:
        try:
            path = _build_cache(cfg)
        except UsageError as exc:
            error = str(exc)
    if distributed:
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        raise UsageError(error)
    if path is None:
        path = cache_path(cfg, source_fingerprint(cfg))
    tensors = torch.load(path)
    return EncodedData(num_classes=NUM_CLASSES[cfg.dataset], **tensors)
