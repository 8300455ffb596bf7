"""Datasets as encoded tensors: real text through Hugging Face `datasets`, or a synthetic task.

Text is tokenized once per node and cached. Epochs index tensors and never touch text again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ddp_core.engine.config import EVAL_FRACTION_WHEN_UNSPLIT, TrainConfig, UsageError
from ddp_core.engine.model import PAD_ID

UNK_ID = 1
TOKENIZER_VERSION = 1
HUB_IDS = {"imdb": "stanfordnlp/imdb", "ag_news": "fancyzhx/ag_news"}
NUM_CLASSES = {"imdb": 2, "ag_news": 4, "synthetic": 2}
LOCAL_FORMATS = {".csv": "csv", ".csv.gz": "csv", ".parquet": "parquet", ".jsonl": "json"}
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
    """The most frequent words of the training texts, ties broken alphabetically so that it is deterministic."""
    counts = Counter(word for text in texts for word in tokenize(text))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: vocab_size - 2]
    return {word: i + 2 for i, (word, _) in enumerate(ranked)}


def encode(texts: list[str], vocab: dict[str, int], seq_len: int) -> torch.Tensor:
    """Token ids truncated or padded to seq_len. An empty text becomes one unknown token."""
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
        raise UsageError(
            f"no {dataset} data in {folder}: expected train and/or test as .csv, .csv.gz, .parquet or .jsonl"
        )
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
        splits = {split: read_local_file(path, split) for split, path in files.items()}
        sources = {split: str(path) for split, path in files.items()}
    else:
        hub_id = HUB_IDS[cfg.dataset]
        try:
            hub = load_dataset(hub_id)
        except Exception as exc:
            raise UsageError(
                f"cannot load {hub_id} from the Hugging Face Hub ({type(exc).__name__}); pass a local copy with "
                f"--data-dir DIR or DDP_CORE_DATA_DIR=DIR (files DIR/{cfg.dataset}/train.csv.gz, "
                f"test.csv.gz)"
            ) from None
        splits = {split: hub[split] for split in ("train", "test")}
        sources = {split: f"{hub_id} {split}" for split in splits}
    for split, ds in splits.items():
        check_rows(ds, NUM_CLASSES[cfg.dataset], sources[split])
    if "train" in splits and "test" in splits:
        return splits["train"], splits["test"]
    only = next(iter(splits.values()))
    order = np.random.default_rng(cfg.seed).permutation(len(only))
    n_eval = round(EVAL_FRACTION_WHEN_UNSPLIT * len(only))
    return only.select(np.sort(order[n_eval:])), only.select(np.sort(order[:n_eval]))


def read_local_file(path: Path, split: str):
    """One split from a local file, or a one-line error saying which file is unreadable and why, in a user's words."""
    from datasets import load_dataset

    fmt = _file_format(path)
    if path.name.endswith(".gz"):
        try:
            with gzip.open(path) as f:
                while f.read(2**20):
                    pass
        except (OSError, EOFError) as exc:
            reason = "truncated" if isinstance(exc, EOFError) else "corrupt or not gzip"
            raise UsageError(f"{path}: not a valid gzip file ({reason})") from None
    if fmt in ("csv", "json"):
        opened = gzip.open(path, "rt", errors="replace") if path.name.endswith(".gz") else open(path, errors="replace")
        with opened as f:
            lines = [line for _, line in zip(range(2), f) if line.strip()]
        if len(lines) < (2 if fmt == "csv" else 1):
            raise UsageError(f"{path}: no rows")
    expected = {
        "csv": "CSV file (a header line text,label, then one row per sample)",
        "parquet": "Parquet file",
        "json": 'JSON Lines file (one {"text": ..., "label": ...} object per line)',
    }[fmt]
    if fmt == "parquet":
        import pyarrow.parquet

        try:
            pyarrow.parquet.ParquetFile(path)
        except Exception:
            raise UsageError(f"{path}: not a valid {expected}") from None
    try:
        return load_dataset(fmt, data_files={split: str(path)}, split=split)
    except Exception:
        raise UsageError(f"{path}: not a valid {expected}") from None


def _class_number(value) -> int | None:
    """The label as an int, or None when it is not a whole number (CSV labels may arrive as text or floats)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def check_rows(ds, num_classes: int, source: str) -> None:
    """Every row has a non-empty text and a label that is a class number 0..C-1. `source` names the file."""
    missing = {"text", "label"} - set(ds.column_names)
    if missing:
        raise UsageError(
            f"{source}: missing column(s) {', '.join(sorted(missing))}; need text,label "
            f"(has {', '.join(ds.column_names)})"
        )
    if len(ds) == 0:
        raise UsageError(f"{source}: no rows")
    for row, text in enumerate(ds["text"], start=1):
        if not isinstance(text, str) or not text.strip():
            what = "missing" if text is None else "empty" if isinstance(text, str) else f"not text ({text!r})"
            raise UsageError(f"{source}: row {row}: the text is {what}")
    for row, label in enumerate(ds["label"], start=1):
        if label is None or (isinstance(label, float) and math.isnan(label)):
            raise UsageError(f"{source}: row {row}: the label is missing")
        number = _class_number(label)
        if number is None:
            raise UsageError(
                f"{source}: row {row}: label {label!r} is not a class number (a whole number 0..{num_classes - 1})"
            )
        if not 0 <= number < num_classes:
            raise UsageError(f"{source}: row {row}: label {number} out of range; expected 0..{num_classes - 1}")


def check_classes(labels: torch.Tensor, num_classes: int) -> None:
    """Refuse to train a constant classifier: the training samples must hold at least two classes."""
    present = labels.unique()
    if len(present) < 2:
        raise UsageError(
            f"all {len(labels)} training samples have label {int(present[0])}: a classifier needs at "
            f"least two of the {num_classes} classes (draw more --train-samples, or check the file)"
        )


def encode_text_dataset(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    train, evaluation = load_splits(cfg)
    train = train.select(seeded_subset(len(train), cfg.train_samples, cfg.seed, "--train-samples"))
    evaluation = evaluation.select(seeded_subset(len(evaluation), cfg.eval_samples, cfg.seed + 1, "--eval-samples"))
    vocab = build_vocab(train["text"], cfg.vocab_size)
    check_classes(torch.tensor(train["label"]), NUM_CLASSES[cfg.dataset])
    tensors = {
        "train_ids": encode(train["text"], vocab, cfg.seq_len),
        "train_labels": torch.tensor(train["label"], dtype=torch.long),
        "eval_ids": encode(evaluation["text"], vocab, cfg.seq_len),
        "eval_labels": torch.tensor(evaluation["label"], dtype=torch.long),
    }
    return tensors


def synthetic_task(cfg: TrainConfig) -> EncodedData:
    """Neutral random tokens with a sprinkle of class keywords (always at least one): learnable to ~100 %."""
    n_train = cfg.train_samples or SYNTHETIC_DEFAULT_SAMPLES[0]
    n_eval = cfg.eval_samples or SYNTHETIC_DEFAULT_SAMPLES[1]
    gen = torch.Generator().manual_seed(cfg.seed)
    keywords_per_class = max(1, (cfg.vocab_size - 2) // 4)
    first_neutral = min(2 + 2 * keywords_per_class, cfg.vocab_size - 1)

    def make(n: int):
        labels = torch.randint(0, 2, (n,), generator=gen)
        ids = torch.randint(first_neutral, cfg.vocab_size, (n, cfg.seq_len), generator=gen)
        keywords = (
            2
            + labels[:, None] * keywords_per_class
            + torch.randint(0, keywords_per_class, (n, cfg.seq_len), generator=gen)
        )
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
    # The cache file is named by everything the tensors depend on.
    key = dict(
        dataset=cfg.dataset,
        sources=sources,
        train_samples=cfg.train_samples,
        eval_samples=cfg.eval_samples,
        seed=cfg.seed,
        vocab_size=cfg.vocab_size,
        seq_len=cfg.seq_len,
        tokenizer=TOKENIZER_VERSION,
    )
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cfg.cache_dir) if cfg.cache_dir else Path.home() / ".cache" / "ddp_core"
    return root / f"{cfg.dataset}-{digest}.pt"


def _cached_tensors(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The encoded tensors from the token cache, encoded and cached first where it is missing or unreadable."""
    path = cache_path(cfg, source_fingerprint(cfg))
    if path.exists():
        try:
            return torch.load(path)
        except Exception:
            print(f"ddp_core: token cache {path} is unreadable; encoding the data again", flush=True)
    tensors = encode_text_dataset(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(tensors, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(
            f"cannot write the token cache in {path.parent} ({exc.strerror}); choose another "
            f"--cache-dir or DDP_CORE_CACHE_DIR"
        ) from None
    print(f"ddp_core: encoded {cfg.dataset} into the token cache ({path.name})", flush=True)
    return tensors


def source_fingerprint(cfg: TrainConfig) -> dict:
    """What identifies the raw data without reading it: file path, size and mtime, or the hub id."""
    if not cfg.data_dir:
        return {"hub": HUB_IDS[cfg.dataset]}
    return {
        split: [str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns]
        for split, path in local_files(cfg.data_dir, cfg.dataset).items()
    }


def load_data(cfg: TrainConfig, local_rank: int = 0) -> EncodedData:
    """Encoded tensors for this run, for every rank of a process group, tokenized once per node."""
    if cfg.dataset == "synthetic":
        return synthetic_task(cfg)
    distributed = dist.is_available() and dist.is_initialized()
    error, tensors = None, None
    if local_rank == 0:  # encodes and writes the cache; the other local ranks read it after the barrier
        try:
            tensors = _cached_tensors(cfg)
        except UsageError as exc:
            error = str(exc)
    if distributed:  # doubles as the barrier after which the cache file is there for the other local ranks
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        raise UsageError(error)
    if tensors is None:
        tensors = torch.load(cache_path(cfg, source_fingerprint(cfg)))
    return EncodedData(num_classes=NUM_CLASSES[cfg.dataset], **tensors)
