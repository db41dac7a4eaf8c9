"""RunStore: one SQLite file (``RUN_DIR/run.db``), the single source of truth of a run: its
configuration and meta, every evaluation (its full result record), every generation's population and
the workers' live progress (schema: ``_SCHEMA``; what survives what: docs/reliability.md).

Durability: WAL mode, every write one transaction and ``synchronous=FULL``, so a process killed at
any point loses at most the transaction it had not committed, and committed results survive a power
cut. Readers in other processes (``status``) read at any time while the driver writes; connections
wait up to ``TIMEOUT_S`` for a lock. An evaluation's cache key is (gene, seed, steps, data, context);
its ``record`` column holds the record's JSON (``util.jsonio.store_dumps``: non-finite floats as
``"NaN"``/``"Infinity"`` strings, read back as floats), and the metric columns hold NULL for them.
"""

from __future__ import annotations

import math
import os
import resource
import shlex
import sqlite3
import threading
import warnings
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from evo_attention.train.record import EvaluationRecord
from evo_attention.util.errors import UserError
from evo_attention.util.files import held_output, in_the_way
from evo_attention.util.format import finite_or_none as _finite_or_none, utc_now
from evo_attention.util.jsonio import store_dumps as dumps
from evo_attention.util.jsonio import store_loads as loads

DB_NAME = "run.db"
DB_SUFFIXES = ("", "-wal", "-shm", "-journal")  # the database and the logs SQLite keeps beside it
STUDY = "study"  # meta: the study that writes the store (none: a search's)
RACING_META = "racing"  # meta: a raced run's seeds and each raced gene's bound (search.racing)
SCHEMA_VERSION = 1
TIMEOUT_S = 30.0
ROLES_HINT = ("search", "baseline", "validate")  # usual roles; any non-empty string is accepted
KEY_FIELDS = ("gene", "seed", "steps", "data_fingerprint", "context")
METRICS = ("val_perplexity", "val_loss", "accuracy", "train_loss", "time_s")
_RESERVED = ("id", "role", "generation", "created_at")
_SELECT = "SELECT id, role, generation, record, created_at FROM evaluations"  # what a stored record is read from
_KEY_MATCH = "gene = ? AND seed = ? AND steps = ? AND data = ? AND context = ?"  # one evaluation, by its key

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluations (
    id             INTEGER PRIMARY KEY,
    gene           TEXT    NOT NULL,
    seed           INTEGER NOT NULL,
    steps          INTEGER NOT NULL,
    data           TEXT    NOT NULL,
    context        TEXT    NOT NULL,
    role           TEXT    NOT NULL,
    generation     INTEGER,
    status         TEXT    NOT NULL,
    val_perplexity REAL,
    val_loss       REAL,
    accuracy       REAL,
    train_loss     REAL,
    params         INTEGER,
    time_s         REAL,
    record         TEXT    NOT NULL,
    created_at     TEXT    NOT NULL,
    UNIQUE (gene, seed, steps, data, context)
);
CREATE INDEX IF NOT EXISTS evaluations_by_role ON evaluations (role, id);
CREATE TABLE IF NOT EXISTS generations (
    generation INTEGER NOT NULL,
    position   INTEGER NOT NULL,
    gene       TEXT    NOT NULL,
    perplexity REAL,
    is_elite   INTEGER NOT NULL,
    PRIMARY KEY (generation, position)
);
CREATE TABLE IF NOT EXISTS activity (
    worker     TEXT PRIMARY KEY,
    gene       TEXT,
    step       INTEGER,
    total      INTEGER,
    loss       REAL,
    updated_at TEXT NOT NULL
);
"""


def _now() -> str:
    return utc_now("milliseconds")


def _gene_key(gene: Any) -> str:
    return gene if isinstance(gene, str) else gene.key


# -- the store ----------------------------------------------------------------------------------

def _room(exc: sqlite3.DatabaseError) -> str | None:
    """What is full and what to free, if ``exc`` is a write that found no room (else None). SQLite reports a full disk
    as such, but a file at the process's file-size limit (EFBIG; Python ignores the SIGXFSZ sent with it) as a disk
    I/O error, so while a limit is set that error counts as no room."""
    if "full" in str(exc).lower():
        return "is full: free space"
    if "disk I/O" in str(exc) and resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return "is full, or a file reached the file-size limit (ulimit -f): free space or raise the limit"
    return None


class DiskFull(UserError):
    """A write found no room under a store (``room``: what is full and what to free; the message says how to go on)."""

    def __init__(self, where, room: str, then: str, **kwargs):
        super().__init__(f"the disk holding {where} {room}, then {then}", **kwargs)
        self.room = room


class StoreLost(UserError):
    """A run's run.db left its path while a command wrote it or its report (deleted, replaced or moved away):
    nothing at that path is left to resume."""


class StoreDamaged(UserError):
    """A run's run.db is damaged or was edited: resuming it as it is fails again, so its advice is to restore it."""


def _refuse_directory(db: Path) -> None:
    """UserError if a directory stands where the store keeps its file ``db`` or a log beside it."""
    for file in (Path(f"{db}{suffix}") for suffix in DB_SUFFIXES):
        if file.is_dir():
            raise in_the_way(file, "a directory", "a run store's file")


class RunStore:
    """The SQLite database of one run. Build with ``create`` or ``open``; close (or use ``with``).

    One process writes (the driver); any number of processes may read at the same time. A store
    may be shared by the threads of its process: calls are serialized by a lock.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, readonly: bool = False):
        self.path = Path(path)
        self.run_dir = self.path.parent
        self.readonly = readonly
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.RLock()
        self._held = None  # the writer's lock of the directory (``hold``), released by ``close``
        self._kind = "search"  # ``kind()``: meta ``STUDY``, written by ``create`` and read by ``open``
        self.by_study = False  # a study's command writes it (``open``)
        self._file = None if readonly else os.open(self.path, os.O_RDONLY)  # the file a writer's transactions reach

    # -- construction ---------------------------------------------------------------------------
    @staticmethod
    def db_path(run_dir: str | os.PathLike) -> Path:
        return Path(run_dir) / DB_NAME

    @classmethod
    def exists(cls, run_dir: str | os.PathLike) -> bool:
        """True if ``run_dir`` holds a run database (False for a path the system cannot even look at,
        such as a name too long for it); UserError if a directory stands where its file goes."""
        try:
            _refuse_directory(cls.db_path(run_dir))
            return cls.db_path(run_dir).is_file()
        except OSError:
            return False

    @classmethod
    def create(cls, run_dir: str | os.PathLike, config: Mapping, meta: Mapping | None = None, *,
               overwrite: bool = False) -> "RunStore":
        """Start a new run in ``run_dir`` (created if needed) with its ``config`` and ``meta``.

        Refuses a directory that holds a run already unless ``overwrite``, which deletes it (saying
        so) when it is a store of the same kind (meta ``STUDY``, else a search): another command's
        store is never deleted. ``meta`` rows are stored next to ``config``, ``created_at`` (now,
        unless given) and ``schema_version``.
        """
        run_dir = Path(run_dir)
        if run_dir.exists() and not run_dir.is_dir():
            raise UserError(f"{run_dir} is a file, not a directory: pass a directory as out", setting="out")
        path = cls.db_path(run_dir)
        _refuse_directory(path)  # before overwrite says it deletes a store
        meta = dict(meta or {})
        if path.exists() and cls._holds_run(path):
            cls._check_replaceable(run_dir, str(meta.get(STUDY) or "search"), overwrite)

        clash = sorted(set(meta) & {"config", "schema_version"})
        if clash:
            raise ValueError(f"meta key {clash[0]!r} is reserved by the run store")
        for suffix in DB_SUFFIXES:  # also a stale log without its database
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create run directory {run_dir}: {exc.strerror}; pick a writable out",
                            setting="out") from None
        store = None
        try:
            store = cls(path, cls._connect(path, readonly=False))
            store._kind = str(meta.get(STUDY) or "search")
            with store._transaction() as conn:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                rows = {"schema_version": SCHEMA_VERSION, "created_at": _now(), **meta, "config": dict(config)}
                conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                 [(k, dumps(v)) for k, v in rows.items()])
        except DiskFull as exc:
            # nothing of the run was stored (one transaction): no half store is left, and the line says to
            # start again, since there is nothing a resume could continue
            if store is not None:
                store.close()
            for suffix in DB_SUFFIXES:
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            raise DiskFull(run_dir, exc.room, "start the run again with the same command (nothing of it was stored, so "
                           "there is nothing to resume)") from None
        return store

    @classmethod
    def open(cls, run_dir: str | os.PathLike, *, readonly: bool = False, by_study: bool = False) -> "RunStore":
        """Open the run in ``run_dir``; ``readonly`` for a reader such as a status command; ``by_study``: a
        study's command writes into a search's store (``--from-run``), so a fault's advice is to run it again."""
        path = cls.db_path(run_dir)
        if Path(run_dir).is_file():
            raise UserError(f"{run_dir} is a file, not a run directory: give the directory a run wrote its run.db into")
        _refuse_directory(path)
        if not path.is_file():
            import evo_attention.interop.hf  # noqa: F401  (registers its output kind, as hf_attention and export do)
            import evo_attention.interop.hf_attention  # noqa: F401

            held = held_output(run_dir)  # another command's output: a search would refuse to start there
            raise UserError(f"no run in {run_dir}" + (f", which holds {held}: give the directory a search wrote its "
                                                      "run.db into" if held else ": start one with `evo-attention "
                                                      f"search --out {shlex.quote(str(run_dir))}`"))
        store = cls(path, cls._connect(path, readonly=readonly), readonly=readonly)
        store.by_study = by_study
        try:
            version = store._schema_version()
            store.check_integrity()
            if not isinstance(version, int) or version > SCHEMA_VERSION:
                raise UserError(
                    f"{path} has run-store schema version {version!r}, this evo-attention reads up to "
                    f"{SCHEMA_VERSION}: upgrade evo-attention"
                )
            store._kind = str(store.get_meta(STUDY) or "search")
        except BaseException:
            store.close()
            raise
        return store

    def _schema_version(self) -> Any:
        """The schema version, or a UserError that says what the file is instead of a run."""
        tables = {row["name"] for row in self._query("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            if tables:
                raise UserError(f"{self.path} is an SQLite database but not an evo-attention run (no meta table): "
                                "point at a run directory, or use another directory for a new run")
            raise UserError(f"{self.path} holds no run yet: a search may be creating it at this moment (try again "
                            "shortly); if none is, the run's data never reached this file (was run.db-wal lost?), "
                            "so start the run again with overwrite", setting="overwrite")
        version = self.get_meta("schema_version")
        if version is None:
            raise UserError(f"{self.path} holds no run yet: a search may be creating it at this moment (try again "
                            "shortly), else start the run again with overwrite", setting="overwrite")
        return version

    @classmethod
    def _check_replaceable(cls, run_dir: Path, kind: str, overwrite: bool) -> None:
        """UserError unless the store in ``run_dir`` may be replaced by a new ``kind`` store: only with
        ``overwrite``, and only a store of that kind (a warning says what is deleted)."""
        try:
            with cls.open(run_dir, readonly=True) as old:
                stored, trainings = old.kind(), len(old.evaluations())
        except UserError:  # unreadable or damaged: never deleted for another command, only by overwrite
            if not overwrite:  # its own message says how to recover it; nothing advises deleting it
                raise
            stored, trainings = kind, None
        if stored != kind:
            raise UserError(f"{run_dir} holds the store of a {stored}, not of a {kind}: a command never replaces "
                            f"another command's store; choose another out", setting="out")
        if not overwrite:
            raise UserError(f"{run_dir} holds a {kind} already: add resume to continue it or overwrite to start over",
                            setting=("resume", "overwrite"))
        count = "" if trainings is None else f" ({trainings} training{'s' if trainings != 1 else ''})"
        warnings.warn(f"overwrite: the {kind} in {run_dir}{count} is deleted and started over", stacklevel=3)

    @staticmethod
    def _holds_run(path: Path) -> bool:
        """Whether the database file at ``path`` holds a run (any table; an unreadable file counts as one)."""
        try:
            with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=TIMEOUT_S)) as conn:
                return conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
        except sqlite3.DatabaseError:
            return True  # unreadable: treat it as a run, never delete it without overwrite

    def check_integrity(self) -> None:
        """SQLite's quick_check (milliseconds for a run store): a damaged file is a one-line error."""
        rows = self._query("PRAGMA quick_check(3)")
        problems = [str(next(iter(r.values()))) for r in rows]
        if problems != ["ok"]:
            raise StoreDamaged(f"{self.path} is damaged (SQLite quick_check: {'; '.join(problems)[:200]}): restore a "
                               "copy of the run directory if you have one; the readable evaluations can be saved "
                               "with `sqlite3 run.db .recover`; do not delete it before that")

    def checkpoint(self) -> None:
        """Move the write-ahead log into run.db, so that run.db alone is a complete copy of the run."""
        if not self.readonly:
            self._run(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())

    def backup(self, run_dir: str | os.PathLike) -> Path:
        """Copy the store, whole, to ``run_dir/run.db`` (created) through SQLite's backup, also while
        another process writes it: the copy holds every transaction committed when it was taken, in
        rollback-journal mode, so that reading it makes no log beside it (a writer opening it turns
        WAL on again). Returns the copy's path."""
        path = self.db_path(run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(path)) as target:
            self._run(lambda conn: conn.backup(target))
            target.execute("PRAGMA journal_mode=DELETE")
        return path

    @staticmethod
    def _connect(path: Path, readonly: bool) -> sqlite3.Connection:
        writable_dir = os.access(path.parent, os.W_OK)
        if not readonly and not (writable_dir and (not path.exists() or os.access(path, os.W_OK))):
            raise UserError(f"{path.parent} is read-only: copy the run directory to writable storage to continue "
                            "it (status and report read it where it is)")
        try:
            if readonly:
                # On read-only media SQLite cannot make the shared-memory file a WAL reader needs: read the
                # file as it is (the store checkpoints its log into it after every generation and on exit).
                mode = "ro" if writable_dir else "ro&immutable=1"
                conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode={mode}", uri=True, timeout=TIMEOUT_S,
                                       isolation_level=None, check_same_thread=False)
            else:
                conn = sqlite3.connect(str(path), timeout=TIMEOUT_S, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            if room := _room(exc):
                raise DiskFull(path, room, "run the command again") from None
            raise UserError(f"{path} cannot be opened as a run store ({exc}): if it is a damaged run, restore a copy "
                            "or save what is readable with `sqlite3 run.db .recover`") from None
        return conn

    def _fault(self, exc: sqlite3.DatabaseError) -> UserError:
        """A store error as a one-line UserError naming the file and the recovery."""
        text = str(exc)
        if room := _room(exc):  # only a search has resume: a study's command, run again, continues its store
            search = self._kind == "search" and not self.by_study
            return DiskFull(self.path, room, f"{'resume the run' if search else 'run the same command again'}; "
                            "every evaluation that finished is kept in the store", setting="resume" if search else None)
        if isinstance(exc, sqlite3.OperationalError) and "locked" in text.lower():
            return UserError(f"{self.path} stayed locked by another process for {TIMEOUT_S:.0f} s: try again")
        return UserError(f"{self.path} cannot be read or written ({text}): if it is damaged, restore a copy of the "
                         "run directory or save what is readable with `sqlite3 run.db .recover`")

    def _run(self, work):
        with self._lock:
            try:
                return work(self._db())
            except sqlite3.DatabaseError as exc:
                raise self._fault(exc) from None

    # -- plumbing -------------------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"run store {self.path} is closed")
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise RuntimeError(f"run store {self.path} was opened read-only")
        with self._lock:
            conn = self._db()
            self._check_file()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as exc:
                raise self._fault(exc) from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                with suppress(sqlite3.DatabaseError):  # gone already: SQLite rolls back on some errors
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.DatabaseError):
                    raise self._fault(exc) from None
                raise

    def _check_file(self) -> None:
        """StoreLost unless run.db is still the file this writer opened: its writes would reach a file no later command
        at this path reads (an unlinked one: lost; one moved away, its directory renamed say: kept there)."""
        with suppress(OSError):  # not at its path
            if os.path.samestat(os.stat(self.path), os.fstat(self._file)):
                return
        if os.fstat(self._file).st_nlink:
            raise StoreLost(f"{self.path} was moved away while this run wrote it: the run stops, and every evaluation "
                            "that finished is kept in the moved file: continue the run with out naming its new "
                            "directory (a search with resume)", setting=("out", "resume"))
        raise StoreLost(f"{self.path} was deleted or replaced while this run wrote it: the run stops, and what it "
                        "held is lost; restore a copy of the run directory, or start the run again")

    def _query(self, sql: str, params: tuple = ()) -> list[dict]:
        def work(conn):
            cursor = conn.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

        return self._run(work)

    def close(self) -> None:
        """Close the connection (idempotent); a writer first checkpoints its log into run.db."""
        with self._lock:
            if self._conn is not None:
                if not self.readonly:
                    with suppress(sqlite3.DatabaseError):  # the log stays beside run.db, replayed on the next open
                        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                self._conn.close()
                self._conn = None
            if self._file is not None:
                os.close(self._file)
                self._file = None
            if self._held is not None:
                held, self._held = self._held, None
                held.release()

    def hold(self, lock) -> "RunStore":
        """Keep ``lock`` (a ``search.lock.RunLock`` held on this directory) for the life of the store."""
        self._held = lock
        return self

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r}{', readonly' if self.readonly else ''})"

    # -- meta -----------------------------------------------------------------------------------
    def config(self) -> dict:
        """The configuration the run was created with."""
        return self.get_meta("config", {})

    def kind(self) -> str:
        """What wrote this store: ``search``, or the study (meta ``STUDY``: compare, curve, validate, ...)."""
        return self._kind

    def check_kind(self, kind: str) -> "RunStore":
        """This store, if ``kind`` wrote it; else a UserError: a store is continued only by its own kind."""
        if self.kind() != kind:
            raise UserError(f"{self.run_dir} holds the store of a {self.kind()}, not of a {kind}: a store is continued "
                            f"only by its own kind (evo-attention {self.kind()} ...); choose another out",
                            setting="out")
        return self

    def get_meta(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        if not rows:
            return default
        try:
            return loads(rows[0]["value"])
        except ValueError:
            raise StoreDamaged(f"the meta value {key!r} in {self.path} is not valid JSON: the file was edited or "
                               "damaged; restore a copy of the run directory") from None

    def set_meta(self, key: str, value: Any) -> None:
        """Store a JSON-serializable ``value`` under ``key`` (replacing any old one)."""
        text = dumps(value)
        with self._transaction() as conn:
            conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, text))

    # -- evaluations ----------------------------------------------------------------------------
    def lookup(self, gene_key: Any, seed: int, steps: int, data: str, context: str) -> EvaluationRecord | None:
        """The stored record of exactly this evaluation, or None (a cache miss)."""
        rows = self._query(f"{_SELECT} WHERE {_KEY_MATCH}",
                           (_gene_key(gene_key), int(seed), int(steps), str(data), str(context)))
        return self._full_record(rows[0]) if rows else None

    def record(self, record: EvaluationRecord | Mapping, *, role: str = "search", generation: int | None = None) -> int:
        """Store a trainer's result record; returns its id.

        A mapping needs ``gene`` (key or gene), ``seed``, ``steps``, ``data_fingerprint``,
        ``context`` and ``status``; the metrics may be missing, None, NaN or inf. If this exact
        evaluation (gene, seed, steps, data, context) is stored already nothing is written and the
        existing id is returned (its role and generation stay those of the first recording).
        Keys ``id``, ``role``, ``generation`` and ``created_at`` of ``record`` are replaced by the
        store's own on reading.
        """
        missing = [k for k in KEY_FIELDS + ("status",) if k not in record]
        if missing:
            raise ValueError(f"result record lacks {', '.join(missing)}: every record needs {', '.join(KEY_FIELDS)}, status")
        if not isinstance(role, str) or not role:
            raise ValueError(f"role must be a non-empty string such as {', '.join(ROLES_HINT)}, got {role!r}")
        if isinstance(record, EvaluationRecord):
            record = record.to_dict()
        body = {k: v for k, v in record.items() if k not in _RESERVED}
        body["gene"] = _gene_key(record["gene"])
        key = (body["gene"], int(record["seed"]), int(record["steps"]),
               str(record["data_fingerprint"]), str(record["context"]))
        params = record.get("params")
        row = key + (role, None if generation is None else int(generation), str(record["status"]),
                     *(_finite_or_none(record.get(m)) for m in METRICS[:4]),
                     None if _finite_or_none(params) is None else int(params),
                     _finite_or_none(record.get("time_s")), dumps(body), _now())
        with self._transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO evaluations (gene, seed, steps, data, context, role, generation, status, "
                "val_perplexity, val_loss, accuracy, train_loss, params, time_s, record, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (gene, seed, steps, data, context) DO NOTHING", row)
            if cursor.rowcount == 1:
                return cursor.lastrowid
            return conn.execute(f"SELECT id FROM evaluations WHERE {_KEY_MATCH}", key).fetchone()[0]

    def evaluations(self, role: str | None = None) -> list[EvaluationRecord]:
        """Stored records in insertion order (optionally of one role), each the full record plus
        ``id``, ``role``, ``generation`` and ``created_at``."""
        rows = (self._query(f"{_SELECT} ORDER BY id") if role is None
                else self._query(f"{_SELECT} WHERE role = ? ORDER BY id", (role,)))
        return [self._full_record(row) for row in rows]

    @staticmethod
    def _full_record(row: dict) -> EvaluationRecord:
        try:
            record = loads(row["record"])
            if isinstance(record, dict) and isinstance(record.get("gene"), str):
                record.update(id=row["id"], role=row["role"], generation=row["generation"],
                              created_at=row["created_at"])
                return EvaluationRecord.from_dict(record)
        except (TypeError, ValueError):  # not JSON, or a field missing (its key) or of another kind (its status)
            pass
        raise StoreDamaged(f"evaluation {row['id']} in the run store is not a record (a JSON object with its gene and "
                           "key): the file was edited or damaged; restore a copy of the run directory")

    # -- generations ----------------------------------------------------------------------------
    def record_generation(self, generation: int, members) -> None:
        """Store a generation's population: ``(gene key, perplexity, is_elite)`` per member, in
        order (best first). Recording a generation again replaces its rows."""
        rows = [(int(generation), position, _gene_key(gene), _finite_or_none(ppl), int(bool(elite)))
                for position, (gene, ppl, elite) in enumerate(members)]
        with self._transaction() as conn:
            conn.execute("DELETE FROM generations WHERE generation = ?", (int(generation),))
            conn.executemany("INSERT INTO generations (generation, position, gene, perplexity, is_elite) "
                             "VALUES (?, ?, ?, ?, ?)", rows)

    def generations(self) -> list[dict]:
        """``[{"generation", "members": [{"gene", "perplexity", "is_elite"}]}]`` in order; a
        failed member's perplexity reads back as ``inf``."""
        out: list[dict] = []
        for row in self._query("SELECT * FROM generations ORDER BY generation, position"):
            if not out or out[-1]["generation"] != row["generation"]:
                out.append({"generation": row["generation"], "members": []})
            ppl = math.inf if row["perplexity"] is None else row["perplexity"]
            out[-1]["members"].append({"gene": row["gene"], "perplexity": ppl, "is_elite": bool(row["is_elite"])})
        return out

    # -- live progress --------------------------------------------------------------------------
    def set_activity(self, worker: str, gene: Any, step: int, total: int, loss: float | None) -> None:
        """Upsert what ``worker`` is training now (``loss`` None/NaN when unknown)."""
        row = (str(worker), None if gene is None else _gene_key(gene), step, total, _finite_or_none(loss), _now())
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO activity (worker, gene, step, total, loss, updated_at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (worker) DO UPDATE SET gene = excluded.gene, step = excluded.step, "
                "total = excluded.total, loss = excluded.loss, updated_at = excluded.updated_at", row)

    def clear_activity(self, worker: str | None = None) -> None:
        """Forget ``worker`` 's activity (every worker's when None, e.g. when a run restarts)."""
        with self._transaction() as conn:
            if worker is None:
                conn.execute("DELETE FROM activity")
            else:
                conn.execute("DELETE FROM activity WHERE worker = ?", (str(worker),))

    def activity(self) -> list[dict]:
        """Every worker's latest progress, by worker name."""
        return self._query("SELECT worker, gene, step, total, loss, updated_at FROM activity ORDER BY worker")


def search_records(evaluations: Sequence, table: list[dict]) -> list:
    """The records a search ranks, in store order: those of role "search", and as a copy (role "search",
    generation: the first listing it) each baseline record of a gene told a finite value in a recorded
    generation (``table``) without one: the store answered the strategy from the baseline's training,
    stored once, as the baseline. (A gene refused before training, by a cap, is listed told nothing.)"""
    first: dict[str, int] = {}
    for row in table:
        for member in row["members"]:
            if math.isfinite(member["perplexity"]):
                first.setdefault(str(member["gene"]), row["generation"])
    told = first.keys() - {str(r.get("gene")) for r in evaluations if r.get("role") == "search"}
    return [r if r.get("role") == "search" else
            r.replace(extra={**r.extra, "role": "search", "generation": first[str(r.get("gene"))]})
            for r in evaluations if r.get("role") == "search" or (r.get("role") == "baseline" and
                                                                  str(r.get("gene")) in told)]
