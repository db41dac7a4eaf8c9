"""EvaluationRecord: the one record type, its status enum, the usable-metric rule and its JSON forms."""

import math

import pytest

from evo_attention import EvaluationRecord, Status
from evo_attention.search.store import RunStore
from evo_attention.train.record import usable_metric
from evo_attention.util.jsonio import dumps, store_dumps, store_loads

KEY = dict(gene="dot|softmax|none|fixed|bias|0.10", seed=1, steps=10, data_fingerprint="f" * 64, context="c" * 16)


def test_status_is_an_enum_that_reads_as_its_value():
    assert Status("diverged") is Status.DIVERGED and Status.OK == "ok" and f"{Status.OOM}" == "oom"
    with pytest.raises(ValueError):
        Status("fine")


@pytest.mark.parametrize("status, value, usable", [("ok", 3.5, 3.5), ("ok", math.inf, None), ("ok", math.nan, None),
                                                   ("diverged", 3.5, None), ("error", None, None)])
def test_one_rule_for_a_usable_metric(status, value, usable):
    record = EvaluationRecord(**KEY, status=status, val_perplexity=value)
    assert record.metric() == usable == usable_metric(record.to_dict()) == usable_metric(dict(record))


def test_optional_keys_are_absent_until_set_and_unknown_keys_survive():
    record = EvaluationRecord(**KEY)
    assert "budget" not in record and record.get("checkpoint") is None and "role" not in record
    stored = EvaluationRecord.from_dict({**record.to_dict(), "budget": 40, "role": "search", "generation": None,
                                         "from_a_plugin": [1, 2]})
    assert stored["budget"] == 40 and stored["generation"] is None and stored["from_a_plugin"] == [1, 2]
    assert EvaluationRecord.from_dict(stored.to_dict()) == stored


def test_json_forms_outputs_null_store_round_trips():
    record = EvaluationRecord(**KEY, status=Status.DIVERGED, error="non-finite loss at step 3")
    assert '"val_loss": null' in dumps(record)  # strict output
    back = EvaluationRecord.from_dict(store_loads(store_dumps(record)))
    assert math.isnan(back.val_loss) and math.isinf(back.val_perplexity) and back == record
    with pytest.raises(TypeError):
        store_dumps({"x": object()})


def test_the_store_takes_and_gives_records(tmp_path):
    with RunStore.create(tmp_path / "run", {"seed": 1}) as store:
        store.record(EvaluationRecord(**KEY, val_loss=1.0, val_perplexity=math.e), role="baseline")
        store.record({**KEY, "gene": "dot|sparsemax|none|fixed|bias|0.10", "status": "oom"}, generation=0)
        first, second = store.evaluations()
    assert isinstance(first, EvaluationRecord) and first.role == "baseline" and first.metric() == math.e
    assert second.status is Status.OOM and second.generation == 0 and second.metric() is None
