"""One attention engine: every gene computes what the engine of 0.5 computed for it (the pinned
outputs of ``classic_reference``), forward, backward, decode and training with dropout, and keeps
its checkpoint names."""

import numpy as np
import pytest

import classic_reference as ref

PINNED = ref.load()


@pytest.mark.parametrize("classic", [True, False], ids=["288-classic", "covering"])
def test_every_gene_computes_what_the_pinned_engine_computed(classic):
    keys = ref.classic_keys() if classic else ref.covering_keys()
    assert len(keys) == (288 if classic else len(keys)) and set(keys) <= set(PINNED)
    for key in keys:
        got, want = ref.compute(key, classic), PINNED[key]
        assert str(got["state_keys"]) == want["state_keys"], (key, "state-dict names changed")
        for q in ("out", "x_grad", "decode", "train_out"):
            diff = np.abs(np.asarray(got[q], dtype=np.float32).ravel() - want[q]).max()
            assert diff <= 1e-6, (key, q, diff)
        grads = np.asarray(got["param_grads"], dtype=np.float32)
        assert np.allclose(grads, want["param_grads"], rtol=1e-5, atol=1e-6), (key, "param_grads")
