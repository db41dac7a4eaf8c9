"""RunStore: the SQLite file of a run (round trips, cache keys, concurrency, crash safety)."""

import json
import math
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from evo_attention.util.errors import UserError
from evo_attention.search.store import RunStore

GENE = "dot|softmax|none|fixed|bias|0.10"
OTHER = "cosine|sparsemax|output_gate|learned|nobias|0.20"


def make_record(gene=GENE, seed=0, steps=100, data="wt2:abc", context="ctx1", **extra):
    record = {
        "gene": gene, "seed": seed, "steps": steps, "data_fingerprint": data, "context": context,
        "status": "ok", "val_perplexity": 123.4, "val_loss": math.log(123.4), "accuracy": 0.21,
        "train_loss": 4.9, "params": 1_234_567, "time_s": 12.5,
    }
    record.update(extra)
    return record


@pytest.fixture
def store(tmp_path):
    with RunStore.create(tmp_path / "run", {"population_size": 12}, {"data": "wt2:abc"}) as s:
        yield s


# -- create / open / exists -----------------------------------------------------------------------
def test_create_open_exists(tmp_path):
    run_dir = tmp_path / "a" / "b"
    assert not RunStore.exists(run_dir)
    RunStore.create(run_dir, {"seed": 1}, {"versions": {"torch": "2"}}).close()
    assert RunStore.exists(run_dir) and (run_dir / "run.db").is_file()
    with RunStore.open(run_dir) as s:
        assert s.config() == {"seed": 1}
        assert s.get_meta("versions") == {"torch": "2"}
        assert s.get_meta("created_at")
        assert s.get_meta("missing", "dflt") == "dflt"


def test_create_refuses_an_existing_run(tmp_path):
    with RunStore.create(tmp_path, {"seed": 1}, {}) as s:
        s.record(make_record())
    with pytest.raises(UserError) as info:
        RunStore.create(tmp_path, {"seed": 2}, {})
    message = str(info.value)
    assert str(tmp_path) in message and "add resume to continue it or overwrite to start over" in message and "\n" not in message
    with RunStore.create(tmp_path, {"seed": 2}, {}, overwrite=True) as s:
        assert s.config() == {"seed": 2} and s.evaluations() == []


def test_open_without_a_run_names_the_directory(tmp_path):
    with pytest.raises(UserError) as info:
        RunStore.open(tmp_path / "nothing")
    message = str(info.value)
    assert f"no run in {tmp_path / 'nothing'}" in message and "--out" in message and "\n" not in message


def test_open_in_another_commands_output_names_it_and_suggests_no_search_there(tmp_path):
    from evo_attention.interop.pretrained import MODEL_TYPE

    RunStore.create(tmp_path / "run", {}, {}).close()
    (tmp_path / "run" / "models").mkdir()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": MODEL_TYPE}))
    for directory, held in ((tmp_path / "run" / "models", f"the models of the run in {tmp_path / 'run'}"),
                            (tmp_path / "hf", "a transformers export")):
        with pytest.raises(UserError) as info:
            RunStore.open(directory)
        message = str(info.value)
        assert f"no run in {directory}, which holds {held}:" in message and "search --out" not in message


def test_open_rejects_a_file_that_is_not_a_run(tmp_path):
    (tmp_path / "run.db").write_text("not a database at all" * 100)
    with pytest.raises(UserError, match="cannot be opened as a run store"):
        RunStore.open(tmp_path)


def test_open_of_a_store_still_being_created_says_so(tmp_path):
    import sqlite3

    sqlite3.connect(tmp_path / "run.db").close()  # the file exists, the schema is not written yet
    with pytest.raises(UserError, match="holds no run yet: .*try again shortly"):
        RunStore.open(tmp_path, readonly=True)
    with sqlite3.connect(tmp_path / "run.db") as conn:  # the meta table, before its first row
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    with pytest.raises(UserError, match="holds no run yet"):
        RunStore.open(tmp_path, readonly=True)


def test_create_at_the_file_size_limit_is_the_disk_full_line_and_leaves_no_store(tmp_path):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20 * 1024, hard))  # EFBIG: SQLite says "disk I/O error"
    try:
        with pytest.raises(UserError, match="file-size limit .*start the run again with the same command"):
            RunStore.create(tmp_path / "run", {"blob": "x" * 100_000}, {})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not RunStore.exists(tmp_path / "run")
    RunStore.create(tmp_path / "run", {"blob": "x" * 100_000}, {}).close()  # the same call, without the limit


def test_a_full_disk_under_a_study_store_says_to_run_its_command_again(tmp_path):
    from evo_attention.search.store import STUDY

    full = sqlite3.OperationalError("database or disk is full")
    RunStore.create(tmp_path / "v", {}, {STUDY: "validate"}).close()
    with RunStore.create(tmp_path / "s", {}, {}) as search, RunStore.open(tmp_path / "v") as study:
        study.check_kind("validate")  # as study_store does
        assert "then resume the run; every" in str(search._fault(full)) and search._fault(full).setting == "resume"
        fault = study._fault(full)
        assert "then run the same command again; every" in str(fault) and fault.setting is None
    with RunStore.open(tmp_path / "s", by_study=True) as from_run:  # validate --from-run writes a search's store
        fault = from_run._fault(full)
        assert "then run the same command again; every" in str(fault) and fault.setting is None


def test_create_rejects_a_file_as_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        RunStore.create(tmp_path / "f", {}, {})


@pytest.mark.parametrize("name", ["run.db", "run.db-wal"])
def test_a_directory_where_the_store_file_goes_is_named_by_every_entry(name, tmp_path, recwarn):
    """A directory named run.db read as "no run: start one with `search --out DIR`" (the command just run),
    and overwrite said it deleted the run, then failed with a traceback; every entry now names it."""
    (tmp_path / "run" / name).mkdir(parents=True)
    says = f"{tmp_path / 'run' / name} is a directory, where a run store's file goes: move it away"
    for call in (lambda: RunStore.exists(tmp_path / "run"), lambda: RunStore.open(tmp_path / "run", readonly=True),
                 lambda: RunStore.create(tmp_path / "run", {}, {}, overwrite=True)):
        with pytest.raises(UserError, match=says):
            call()
    assert (tmp_path / "run" / name).is_dir() and not recwarn.list  # nothing said deleted, nothing deleted


def test_pragmas(store):
    conn = store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1


# -- evaluations ----------------------------------------------------------------------------------
def test_record_round_trip_with_non_finite_metrics_and_nested_json(store):
    record = make_record(
        status="diverged", val_perplexity=float("nan"), val_loss=float("inf"), accuracy=None,
        train_loss=-math.inf, params=None,
        curve=[[0, 5.0], [50, float("nan")]], extra={"nested": {"x": [1, 2, {"y": float("inf")}]}, "ok": True},
    )
    record_id = store.record(record, role="search", generation=3)
    (back,) = store.evaluations()
    assert back["id"] == record_id and back["role"] == "search" and back["generation"] == 3 and back["created_at"]
    assert math.isnan(back["val_perplexity"]) and back["val_loss"] == math.inf and back["train_loss"] == -math.inf
    assert back["accuracy"] is None and back["params"] is None
    assert back["curve"][0] == [0, 5.0] and math.isnan(back["curve"][1][1])
    assert back["extra"] == {"nested": {"x": [1, 2, {"y": math.inf}]}, "ok": True}
    # the JSON text is standard JSON and the metric columns hold NULL
    text, ppl, loss = store._conn.execute("SELECT record, val_perplexity, val_loss FROM evaluations").fetchone()
    assert "NaN" in text and ppl is None and loss is None
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_finite_metrics_fill_the_columns(store):
    store.record(make_record(gene=OTHER))
    row = store._conn.execute("SELECT gene, seed, steps, data, context, status, val_perplexity, params, time_s "
                              "FROM evaluations").fetchone()
    assert row == (OTHER, 0, 100, "wt2:abc", "ctx1", "ok", 123.4, 1_234_567, 12.5)


def test_numpy_values_are_stored(store):
    np = pytest.importorskip("numpy")
    store.record(make_record(val_perplexity=np.float32(7.5), curve=np.array([1.0, np.nan])))
    (back,) = store.evaluations()
    assert back["val_perplexity"] == 7.5 and math.isnan(back["curve"][1])


@pytest.mark.parametrize("part, value", [
    ("gene", OTHER), ("seed", 1), ("steps", 200), ("data", "wt2:other"), ("context", "ctx2"),
])
def test_lookup_hits_only_the_exact_key(store, part, value):
    store.record(make_record())
    key = {"gene_key": GENE, "seed": 0, "steps": 100, "data": "wt2:abc", "context": "ctx1"}
    hit = store.lookup(**key)
    assert hit is not None and hit["val_perplexity"] == 123.4 and hit["role"] == "search"
    key["gene_key" if part == "gene" else part] = value
    assert store.lookup(**key) is None


def test_no_duplicate_evaluations(store):
    first = store.record(make_record(), generation=0)
    again = store.record(make_record(val_perplexity=99.0), role="baseline", generation=5)
    other = store.record(make_record(seed=1))
    assert first == again != other
    records = store.evaluations()
    assert [r["id"] for r in records] == [first, other]
    assert records[0]["val_perplexity"] == 123.4 and records[0]["generation"] == 0


def test_evaluations_by_role_in_insertion_order(store):
    store.record(make_record(seed=3), role="search")
    store.record(make_record(seed=1), role="baseline")
    store.record(make_record(seed=2), role="search")
    assert [r["seed"] for r in store.evaluations()] == [3, 1, 2]
    assert [r["seed"] for r in store.evaluations(role="search")] == [3, 2]
    assert [r["seed"] for r in store.evaluations(role="validate")] == []


def test_record_needs_the_key_fields(store):
    record = make_record()
    del record["context"]
    with pytest.raises(ValueError, match="context"):
        store.record(record)
    assert store.evaluations() == []


# -- generations, meta, activity --------------------------------------------------------------------
def test_generations_replace(store):
    store.record_generation(1, [(OTHER, 20.0, False)])
    store.record_generation(0, [(GENE, 10.0, False), (OTHER, float("nan"), False)])
    store.record_generation(1, [(GENE, 10.0, True), (OTHER, 12.0, False)])
    gens = store.generations()
    assert [g["generation"] for g in gens] == [0, 1]
    assert gens[0]["members"][1] == {"gene": OTHER, "perplexity": math.inf, "is_elite": False}
    assert gens[1]["members"] == [{"gene": GENE, "perplexity": 10.0, "is_elite": True},
                                  {"gene": OTHER, "perplexity": 12.0, "is_elite": False}]


def test_meta(store):
    store.set_meta("done", False)
    store.set_meta("done", True)
    store.set_meta("stats", {"best": float("inf"), "list": [1, 2]})
    assert store.get_meta("done") is True
    assert store.get_meta("stats") == {"best": math.inf, "list": [1, 2]}
    assert store.get_meta("data") == "wt2:abc"
    assert store.config() == {"population_size": 12}


def test_activity(store):
    store.set_activity("w0", GENE, 10, 100, 5.5)
    store.set_activity("w1", OTHER, 1, 100, float("nan"))
    store.set_activity("w0", GENE, 20, 100, 5.0)
    rows = store.activity()
    assert [(r["worker"], r["step"], r["loss"]) for r in rows] == [("w0", 20, 5.0), ("w1", 1, None)]
    assert all(r["updated_at"] for r in rows)
    store.clear_activity("w0")
    assert [r["worker"] for r in store.activity()] == ["w1"]
    store.clear_activity()
    assert store.activity() == []


def test_a_writer_refuses_a_run_db_deleted_or_replaced_under_it(tmp_path):
    from evo_attention.search.store import StoreLost

    for replace in (False, True):
        with RunStore.create(tmp_path / str(replace), {}, {}) as store:
            store.path.unlink()
            if replace:
                RunStore.create(tmp_path / str(replace), {}, {}).close()
            with pytest.raises(StoreLost, match="run.db was deleted or replaced while this run wrote it"):
                store.record(make_record())


def test_a_writer_whose_run_directory_is_moved_stops_and_keeps_what_finished(tmp_path):
    from evo_attention.search.store import StoreLost

    with RunStore.create(tmp_path / "a", {}, {}) as store:
        store.record(make_record())
        (tmp_path / "a").rename(tmp_path / "b")
        with pytest.raises(StoreLost, match=r"run.db was moved away .*kept in the moved file: continue the run"):
            store.record(make_record(seed=1))
    with RunStore.open(tmp_path / "b", readonly=True) as moved:
        assert len(moved.evaluations()) == 1


@pytest.mark.parametrize("text", ["{oops", "[]", '{"gene": 5}', '{"gene": "dot|softmax|none|fixed|bias|0.10"}',
                                  '{"gene": "g", "seed": 0, "steps": 4, "data_fingerprint": "d", "context": "c", '
                                  '"status": "bogus"}'])
def test_a_record_edited_into_another_shape_is_named_damaged(store, text):
    store.record(make_record())
    store._run(lambda conn: conn.execute("UPDATE evaluations SET record = ?", (text,)))
    with pytest.raises(UserError, match=r"^evaluation 1 in the run store is not a record .*edited or damaged"):
        store.evaluations()


def test_closed_and_readonly_stores_refuse_writes(tmp_path, store):
    with RunStore.open(store.run_dir, readonly=True) as reader:
        with pytest.raises(RuntimeError, match="read-only"):
            reader.set_meta("x", 1)
    store.close()
    store.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        store.evaluations()


# -- concurrency and crashes ------------------------------------------------------------------------
def test_reader_sees_committed_rows_while_the_writer_is_open(store):
    store.record(make_record(seed=1))
    with RunStore.open(store.run_dir, readonly=True) as reader:
        assert len(reader.evaluations()) == 1
        # the writer holds an open transaction: the reader neither blocks nor sees it
        store._conn.execute("BEGIN IMMEDIATE")
        store._conn.execute("INSERT INTO meta (key, value) VALUES ('pending', '1')")
        started = time.monotonic()
        assert reader.get_meta("pending") is None and len(reader.evaluations()) == 1
        assert time.monotonic() - started < 1.0
        store._conn.execute("COMMIT")
        store.record(make_record(seed=2))
        assert reader.get_meta("pending") == 1 and len(reader.evaluations()) == 2
    # a plain sqlite3 connection from another tool works too
    other = sqlite3.connect(store.path, timeout=5)
    assert other.execute("SELECT count(*) FROM evaluations").fetchone()[0] == 2
    other.close()


def test_backup_copies_a_live_store_whole(tmp_path, store):
    """A reader's backup holds every committed row, the part still in the writer's log too, none of
    a transaction not yet committed, and is a store of its own (no log file beside it)."""
    store.record(make_record(seed=1))
    store.set_activity("w0", GENE, 7, 10, 1.5)
    store._conn.execute("BEGIN IMMEDIATE")
    store._conn.execute("INSERT INTO meta (key, value) VALUES ('pending', '1')")
    try:
        with RunStore.open(store.run_dir, readonly=True) as reader:
            path = reader.backup(tmp_path / "copy")
    finally:
        store._conn.execute("COMMIT")
    assert path == RunStore.db_path(tmp_path / "copy") and not path.with_name("run.db-wal").exists()
    with RunStore.open(tmp_path / "copy", readonly=True) as copy:
        assert [r["seed"] for r in copy.evaluations()] == [1] and copy.get_meta("pending") is None
        assert [(a["worker"], a["step"]) for a in copy.activity()] == [("w0", 7)]
        assert copy.config() == store.config()
    assert not path.with_name("run.db-wal").exists()  # reading the copy made no log


CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from evo_attention.search.store import RunStore
    run_dir, n, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = RunStore.open(run_dir)
    for i in range(n):
        if i == kill_at:
            # die in the middle of a transaction that is never committed
            store._conn.execute("BEGIN IMMEDIATE")
            store._conn.execute(
                "INSERT INTO evaluations (gene, seed, steps, data, context, role, status, record, created_at) "
                "VALUES ('x', -1, 0, 'd', 'c', 'search', 'ok', '{}', 'now')")
            os.kill(os.getpid(), signal.SIGKILL)
        store.record({"gene": %r, "seed": i, "steps": 10, "data_fingerprint": "d", "context": "c",
                      "status": "ok", "val_perplexity": 100.0 + i, "curve": list(range(50))})
        store.set_activity("w0", %r, i, n, 1.0)
""" % (GENE, GENE))


def test_sigkill_loses_only_the_uncommitted_transaction(tmp_path):
    RunStore.create(tmp_path, {"seed": 0}, {}).close()
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path), "20", "7"], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with RunStore.open(tmp_path) as s:
        assert s._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        records = s.evaluations()
        assert [r["seed"] for r in records] == list(range(7))
        assert [r["val_perplexity"] for r in records] == [100.0 + i for i in range(7)]
        assert s.activity()[0]["step"] == 6
        s.record(make_record())  # the store is writable again


def test_sigkill_at_a_random_moment_keeps_a_consistent_prefix(tmp_path):
    RunStore.create(tmp_path, {"seed": 0}, {}).close()
    proc = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path), "100000", "-1"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until it is busy writing
            time.sleep(0.05)
            with RunStore.open(tmp_path, readonly=True) as reader:
                if len(reader.evaluations()) >= 20:
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    with RunStore.open(tmp_path) as s:
        assert s._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        seeds = [r["seed"] for r in s.evaluations()]
        assert seeds and seeds == list(range(len(seeds)))
        assert all(r["curve"] == list(range(50)) for r in s.evaluations())
