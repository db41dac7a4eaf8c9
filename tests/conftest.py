"""Shared fixtures: small configs, the path of the shared WikiText-2 corpus."""

from pathlib import Path

import pytest
import torch

from evo_attention import Config

REPO = Path(__file__).resolve().parents[1]
WIKITEXT_DIR = REPO.parent / "shared" / "data" / "wikitext-2"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never write the tokenization cache into the home directory from tests."""
    monkeypatch.setenv("EVO_ATTENTION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def tiny_config():
    return Config(vocab_size=50, d_model=16, n_heads=2, n_layers=2, max_seq_len=12, dropout=0.0)


@pytest.fixture
def wikitext_dir():
    if not (WIKITEXT_DIR / "valid.txt").exists():
        pytest.skip(f"shared WikiText-2 corpus not found at {WIKITEXT_DIR}")
    return WIKITEXT_DIR


torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
