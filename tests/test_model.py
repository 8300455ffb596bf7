"""The classifier: padding never changes a prediction; presets have the advertised sizes."""

import pytest
import torch

from ddp_core.engine.model import PAD_ID, TransformerClassifier, count_parameters
from ddp_core.engine.model_shape import ModelConfig


def test_padding_does_not_change_the_prediction():
    torch.manual_seed(0)
    model = TransformerClassifier(ModelConfig.from_preset("tiny", vocab_size=50, max_len=32, num_classes=3)).eval()
    tokens = torch.randint(1, 50, (4, 10))
    short = tokens
    long = torch.cat([tokens, torch.full((4, 22), PAD_ID)], dim=1)
    torch.testing.assert_close(model(long), model(short), rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset,low,high", [("small", 2.5e6, 3.5e6), ("medium", 7e6, 11e6), ("large", 95e6, 115e6)])
def test_presets_have_the_sizes_the_report_quotes(preset, low, high):
    cfg = ModelConfig.from_preset(preset, vocab_size=20000, max_len=256, num_classes=2)
    assert low <= count_parameters(TransformerClassifier(cfg)) <= high


def test_int32_token_ids_train_exactly_as_int64_ones():
    """The trainer feeds the ids as the data stores them (int32), without a per-step conversion to int64."""
    cfg = ModelConfig.from_preset("small", vocab_size=100, max_len=16, num_classes=2)
    ids = torch.randint(0, 100, (4, 16), dtype=torch.int32)
    results = []
    for batch in (ids, ids.long()):
        torch.manual_seed(0)
        model = TransformerClassifier(cfg)
        loss = torch.nn.functional.cross_entropy(model(batch), torch.tensor([0, 1, 1, 0]))
        loss.backward()
        results.append([loss.detach()] + [p.grad for p in model.parameters()])
    for from_int32, from_int64 in zip(*results):
        torch.testing.assert_close(from_int32, from_int64, rtol=0, atol=0)
